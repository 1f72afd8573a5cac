"""Sets and change sets larger than what a fetch may bring to the driver stay in Spark.

With a tiny ``EngineConfig.fetch_limit``, recursive components iterate over sets kept in
Spark as files (:mod:`factflow.arrangement.filed`) and an epoch's changes reach
subscribers, sinks and server clients in chunks: the engine must still agree with the
oracle on random streams with retractions.
"""

from __future__ import annotations

import copy
import random
import time
from collections import Counter

import pytest

from factflow import Engine, EngineConfig, Sink
from factflow.arrangement.filed import FiledRows
from factflow.client import Client
from factflow.engine.evaluation import Evaluation
from factflow.io.sinks import SinkWriter, read_sink
from factflow.server import ServerConfig, ServerThread
from oracle import Oracle, OracleError, normalized
from test_differential import RULES, SCHEMA, run_stream

#: most iterations of these streams hold more rows than their share of a fetch
TINY = EngineConfig(fetch_limit=1)

RECURSIVE = {
    "reach": ("[:find ?a ?b :where (reach ?a ?b)]", (), "set"),
    "mutual-and-negation": ("[:find ?a ?b :where (even-hop ?a ?b) (not (reach ?b ?a))]", (), "set"),
    "sg": ("[:find ?x ?y :where [?x :d/flag true] (sg ?x ?y)]", (), "set"),
    "sources": ("[:find ?s ?b :in $ [?s ...] :where (reach ?s ?b)]", ([1, 4],), "set"),
}


@pytest.fixture
def writes(monkeypatch):
    """A list that grows by the rows of every set written to Spark as files."""
    written = []
    original = FiledRows.write.__func__

    def write(cls, *args, **kwargs):
        files = original(cls, *args, **kwargs)
        written.append(files.rows)
        return files

    monkeypatch.setattr(FiledRows, "write", classmethod(write))
    return written


NODES = range(1, 9)


def graph_transaction(rng: random.Random, oracle: Oracle) -> list:
    """One or two present :d/friend edges retracted, two to four new ones among eight
    nodes, and a :d/flag turned on or off."""
    present = sorted(oracle.facts.get(":d/friend", ()))
    gone = rng.sample(present, min(len(present), rng.randint(1, 2)))
    ops = [[":db/retract", e, ":d/friend", v] for e, v in gone]
    for _ in range(rng.randint(2, 4)):
        edge = (rng.choice(NODES), rng.choice(NODES))
        if edge not in gone:
            ops.append([":db/add", edge[0], ":d/friend", edge[1]])
    node = rng.choice(NODES)
    ops.append([":db/retract" if (node, True) in oracle.facts.get(":d/flag", ()) else ":db/add", node, ":d/flag", True])
    return ops


@pytest.mark.parametrize("name", list(RECURSIVE))
def test_recursion_over_sets_kept_in_spark_matches_the_oracle(spark, writes, name):
    # the query is installed twice: before the stream (closed halfway through it) and
    # after its second epoch, reading the rules the first one shares
    query = RECURSIVE[name]
    run_stream(spark, 300 + list(RECURSIVE).index(name), epochs=5, queries=[query, query], config=TINY,
               install_points=[0, 2], transaction=graph_transaction)
    assert any(writes), "no iteration was kept in Spark"


def test_an_evaluation_holds_at_most_a_fetch_of_rows_on_the_driver(spark, writes, monkeypatch):
    # a fixpoint's sets are fetched and concatenated iteration after iteration, and each
    # relation made stays in the driver's JVM until the evaluation ends: together, not each
    # fetch alone, they stay within fetch_limit (the rest is kept in Spark)
    limit = 12
    held: Counter = Counter()  # per evaluation (kept alive here, so no two share a key)
    original = Evaluation._local_relation

    def local_relation(self, data, columns):
        held[self] += len(data)
        assert held[self] <= limit, f"an evaluation holds {held[self]} rows on the driver"
        return original(self, data, columns)

    monkeypatch.setattr(Evaluation, "_local_relation", local_relation)
    run_stream(spark, 320, epochs=5, queries=[RECURSIVE["reach"]], config=EngineConfig(fetch_limit=limit),
               install_points=[0], transaction=graph_transaction)
    assert any(writes), "no set was kept in Spark"
    assert max(held.values()) > 0, "no set was held on the driver"


# ---------------------------------------------------------------- change sets in chunks
LIMIT = 3
CHUNKED = [("[:find ?a ?c :where [?a :d/friend ?b] [?b :d/friend ?c]]", "set"),  # a Distinct result
           ("[:find ?a :where [?a :d/friend _]]", "multiset")]  # derivation counts onto fewer columns


def oracle_engine(spark, config: EngineConfig):
    """An engine and the oracle with the differential tests' schema and rules."""
    db = Engine(spark=spark, config=config)
    oracle = Oracle()
    for name, kind, semantics in SCHEMA:
        db.create_attribute(name, type=kind, semantics=semantics)
        oracle.create_attribute(name, kind, semantics)
    db.register(RULES)
    oracle.register(RULES)
    return db, oracle


def transact_both(db, oracle: Oracle, rng: random.Random) -> int:
    """A :func:`graph_transaction` that both accept (redrawn until one is), applied to both."""
    while True:
        tx = graph_transaction(rng, oracle)
        try:
            Oracle.transact(copy.deepcopy(oracle), tx)
            break
        except OracleError:
            continue
    oracle.transact(tx)
    return db.transact(tx)


def test_large_change_sets_reach_subscribers_in_bounded_chunks_and_sinks_from_spark(spark, tmp_path, monkeypatch):
    offered = []
    original_offer = SinkWriter.offer
    monkeypatch.setattr(SinkWriter, "offer", lambda self, epoch, changes: (
        offered.append(type(changes).__name__), original_offer(self, epoch, changes))[1])
    db, oracle = oracle_engine(spark, EngineConfig(fetch_limit=LIMIT))
    rng = random.Random(7)
    try:
        for _ in range(3):  # a graph to start from: the installs' first sink writes are large
            transact_both(db, oracle, rng)
        queries = []
        for number, (text, semantics) in enumerate(CHUNKED):
            q = db.query(text, semantics=semantics, sink=Sink(str(tmp_path / f"q{number}")))
            calls: list[tuple[int, list]] = []
            q.subscribe(lambda epoch, changes, calls=calls: calls.append((epoch, changes)))
            queries.append((q, text, semantics, Counter(q.rows()), calls))
        for _ in range(5):
            epoch = transact_both(db, oracle, rng)
            for q, text, semantics, state, calls in queries:
                for _, changes in (call for call in calls if call[0] == epoch):
                    assert len(changes) <= LIMIT
                    state.update(dict(changes))
                assert normalized(state) == normalized(oracle.query(text, (), semantics)), f"{text} at {epoch}"
        chunked = 0
        for number, (q, text, semantics, state, calls) in enumerate(queries):
            per_epoch: dict[int, Counter] = {}
            for epoch, changes in calls:
                per_epoch.setdefault(epoch, Counter()).update(dict(changes))
            chunked += sum(1 for epoch in per_epoch if sum(e == epoch for e, _ in calls) > 1)
            assert q.flush(60)
            sunk = read_sink(spark, str(tmp_path / f"q{number}")).toPandas()
            names = [c for c in sunk.columns if c not in ("diff", "epoch")]
            for epoch, changes in per_epoch.items():
                rows = sunk[sunk["epoch"] == epoch]
                written = Counter(dict(zip(map(tuple, rows[names].values.tolist()), rows["diff"].tolist())))
                assert written == Counter({row: n for row, n in changes.items() if n}), \
                    f"{text}: the sink's epoch {epoch} is not what subscribers got"
        assert chunked, "no epoch came in chunks"
        assert "SparkChanges" in offered, "no sink wrote a change set from Spark"
    finally:
        db.close()


def test_a_large_result_is_read_in_bounded_chunks(spark):
    db, oracle = oracle_engine(spark, EngineConfig(fetch_limit=LIMIT))
    rng = random.Random(11)
    try:
        for _ in range(3):
            transact_both(db, oracle, rng)
        q = db.query("[:find ?a ?b :where (reach ?a ?b)]")
        chunks = list(q.chunks())
        assert len(chunks) > 1 and all(len(chunk) <= LIMIT for chunk in chunks)
        expected = oracle.query("[:find ?a ?b :where (reach ?a ?b)]")
        assert Counter(dict(pair for chunk in chunks for pair in chunk)) == expected == Counter(q.rows())
    finally:
        db.close()


def test_a_client_receives_a_chunked_epoch_and_result_over_the_server(spark):
    # the result and the epochs come in chunks of 3 rows; a client may have at most 5
    # waiting, so each chunk after an epoch's first is pushed once the one before is sent
    db, oracle = oracle_engine(spark, EngineConfig(fetch_limit=LIMIT))
    rng = random.Random(5)
    text = "[:find ?a ?b :where (reach ?a ?b)]"
    try:
        for _ in range(2):
            transact_both(db, oracle, rng)
        with ServerThread(db, config=ServerConfig(max_waiting_rows=5)) as server, \
                Client(server.url, timeout=300) as client:
            q = client.query(text, name="reach")
            assert q.results() == {tuple(row): n for row, n in oracle.query(text).items()}
            calls: list[tuple[int, int]] = []
            q.subscribe(lambda epoch, changes: calls.append((epoch, len(changes))))
            for _ in range(3):
                epoch = transact_both(db, oracle, rng)
                expected = {tuple(row): n for row, n in oracle.query(text).items()}
                deadline = time.monotonic() + 60
                while (q.epoch < epoch or q.results() != expected) and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert q.results() == expected
            assert all(rows <= LIMIT for _, rows in calls)
            assert any(sum(e == epoch for e, _ in calls) > 1 for epoch, _ in calls), "no epoch came in chunks"
    finally:
        db.close()
