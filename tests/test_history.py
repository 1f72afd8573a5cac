"""History: ``slack`` keeps closed epochs readable (``results(as_of=...)``) against the
oracle on random streams with retractions, compaction beyond it, errors outside it, and
the attribute setting in the durable catalog."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from factflow import Engine, EngineConfig, HistoryError, QueryError, SchemaError
from factflow.model.types import Kind
from factflow.storage.facts import from_pandas, write_table
from factflow.storage.store import CheckpointFiles, StateStore
from oracle import normalized
from storage.durable import define, new_oracle, valid_stream

QUERIES = [
    ("[:find ?a ?c :where [?a :d/friend ?b] [?b :d/friend ?c]]", "multiset"),  # a join, private state
    ("[:find ?n (count ?e) :where [?e :d/name ?n]]", "set"),                    # an aggregate
    ("[:find ?e :where [?e :d/name _] (not [?e :d/age _])]", "set"),           # negation
]


def rows(q, as_of=None) -> Counter:
    return normalized(Counter(q.rows(as_of=as_of)))


@pytest.mark.parametrize("local_limit", [20_000, 3])  # batches on the driver; stored in Spark (merged by SQL)
def test_as_of_within_the_slack_equals_the_oracle(spark, local_limit):
    slack = 2
    stream = valid_stream(21 + local_limit, 6 if local_limit == 3 else 9, max_ops=6)
    keys = QUERIES[:2] if local_limit == 3 else QUERIES
    db = Engine(spark=spark, config=EngineConfig(local_limit=local_limit))
    try:
        define(db)
        db.transact(stream[0])
        queries = {key: db.query(key[0], semantics=key[1], slack=slack) for key in keys}
        plain = db.query(QUERIES[0][0], semantics=QUERIES[0][1])  # slack 0
        oracle = new_oracle()
        oracle.transact(stream[0])
        seen = {db.epoch: {key: normalized(oracle.query(key[0], (), key[1])) for key in keys}}
        installed = db.epoch
        for tx in stream[1:]:
            epoch = db.transact(tx)
            oracle.transact(tx)
            seen[epoch] = {key: normalized(oracle.query(key[0], (), key[1])) for key in keys}
        latest = db.epoch
        for epoch in range(max(installed, latest - slack), latest + 1):
            for key, q in queries.items():
                assert rows(q, as_of=epoch) == seen[epoch][key], (key, epoch)
        assert rows(plain, as_of=latest) == seen[latest][QUERIES[0]]
        q = queries[QUERIES[0]]
        with pytest.raises(HistoryError, match=f"epoch {latest - slack - 1} is older.*epochs {latest - slack} to {latest}"):
            q.rows(as_of=latest - slack - 1)
        with pytest.raises(HistoryError, match=f"epoch {latest + 1} is not closed yet"):
            q.results(as_of=latest + 1)
        with pytest.raises(HistoryError, match=f"epoch {latest - 1} is older.*epochs {latest} to {latest}"):
            plain.rows(as_of=latest - 1)
    finally:
        db.close()


def test_compaction_keeps_exactly_the_slack(spark):
    """An entity's value overwritten every epoch: a query without slack holds its one row,
    one with slack also the rows of the epochs it keeps; the attribute with slack keeps
    its changes apart while one without holds the current fact."""
    with Engine(spark=spark) as db:
        db.create_attribute(":h/kept", type="long", semantics="one", slack=3)
        db.create_attribute(":h/plain", type="long", semantics="one")
        now = db.query("[:find ?e ?v :where [?e :h/plain ?v]]")
        kept = db.query("[:find ?e ?v :where [?e :h/plain ?v]]", slack=3)
        for i in range(1, 12):
            db.transact([[":db/add", 1, ":h/kept", i], [":db/add", 1, ":h/plain", i]])
        result = db.stats()["result_tuples"]
        assert result[now.name] == 1
        assert result[kept.name] == 1 + 2 * 3  # the value of epoch 8, then a retraction and an assertion per epoch
        assert db.arrangement(":h/plain").forward.tuples == 1
        forward = db.arrangement(":h/kept").forward
        assert forward.tuples == 1 + 2 * 3
        for epoch in range(8, 12):  # the attribute's history is readable (as SQL) within its slack
            facts = db.spark.sql(f"SELECT e, v, SUM(_diff) AS n FROM {forward.read(epoch)} GROUP BY e, v HAVING n <> 0")
            assert [tuple(r) for r in facts.collect()] == [(1, epoch, 1)]
            assert kept.results(as_of=epoch) == {(1, epoch): 1}


def test_slack_is_checked_and_kept_in_the_durable_catalog(spark, tmp_path):
    with Engine(spark=spark) as db:
        db.create_attribute(":s/x", type="long")
        for bad in (-1, 1.5, True):
            with pytest.raises(QueryError, match="slack"):
                db.query("[:find ?e :where [?e :s/x _]]", slack=bad)
            with pytest.raises(SchemaError, match="slack"):
                db.create_attribute(":s/y", type="long", slack=bad)
        with pytest.raises(SchemaError, match=r"long/set/both/wco/0/false \(type/semantics/index/support/slack/parameter\).*long/set/both/wco/2/false"):
            db.create_attribute(":s/x", type="long", slack=2)
        q = db.query("[:find ?e :where [?e :s/x _]]", slack=2)
        with pytest.raises(HistoryError, match="as_of must be an epoch"):
            q.rows(as_of="1")
    directory = str(tmp_path / "new")
    with Engine(spark=spark, state_dir=directory) as db:
        db.create_attribute(":s/x", type="long", slack=5)
        db.create_attribute(":s/y", type="long")
        db.transact([[":db/add", 1, ":s/x", 1]])
    with Engine(spark=spark, state_dir=directory) as db:  # from the log
        assert (db.schema.get(":s/x").slack, db.schema.get(":s/y").slack) == (5, 0)
        db.checkpoint()
    with Engine(spark=spark, state_dir=directory) as db:  # from the checkpoint's manifest
        assert (db.schema.get(":s/x").slack, db.schema.get(":s/y").slack) == (5, 0)


def test_a_checkpoint_without_slack_fields_still_opens(spark, tmp_path):
    """A manifest written before slack existed lists attributes as [name, type, semantics]."""
    store = StateStore(str(tmp_path))
    frame = pd.DataFrame({"e": [1, 2], "v": [10, 20], "_diff": [1, 1]})
    files = CheckpointFiles(Kind.LONG, lambda d, p: [write_table(from_pandas(frame, Kind.LONG), d, f"{p}part-00000.parquet")])
    store.write_checkpoint(3, store.begin_checkpoint(), [(":old/x", "long", "set")], [], [], {}, {0: files})
    store.close()
    with Engine(spark=spark, state_dir=str(tmp_path)) as db:
        assert db.epoch == 3 and db.schema.get(":old/x").slack == 0
        assert db.query("[:find ?e ?v :where [?e :old/x ?v]]").rows() == {(1, 10): 1, (2, 20): 1}
