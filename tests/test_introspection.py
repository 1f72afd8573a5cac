"""``Engine(introspection=True)``: the engine's activity as facts, checked against ``db.stats()``
and ``db.epoch_log`` at every epoch of a small stream, one epoch behind; queries over them
(themselves introspected) never loop; ``introspect=False`` leaves a query out; the
reserved attributes cannot be written; durable engines do not keep the facts."""

from __future__ import annotations

import random

import pytest

from factflow import Engine, EngineConfig, TransactionError

ARRANGEMENTS = "[:find ?n ?t ?r :where [?a :factflow.arrangement/name ?n] [?a :factflow.arrangement/tuples ?t] " \
               "[?a :factflow.arrangement/role ?r]]"
QUERIES = "[:find ?n ?t ?r :where [?q :factflow.query/name ?n] [?q :factflow.query/tuples ?t] " \
          "[?q :factflow.query/results ?r]]"
EPOCHS = "[:find ?e ?s ?j ?c ?o :where [?x :factflow.epoch/number ?e] [?x :factflow.epoch/seconds ?s] " \
         "[?x :factflow.epoch/jobs ?j] [?x :factflow.epoch/changes ?c] [?x :factflow.epoch/operations ?o]]"
PER_QUERY = "[:find ?q (sum ?t) :with ?a :where [?a :factflow.arrangement/query ?q] [?a :factflow.arrangement/tuples ?t]]"
TRIANGLES = "[:find ?a ?b ?c :where [?a :t/e ?b] [?b :t/e ?c] [?a :t/e ?c]]"


def expected_from(stats: dict, left_out: set[str]) -> tuple[dict, dict, dict]:
    """What the introspection queries must return, from ``db.stats()``."""
    arrangements = {(n, t, "shared"): 1 for n, t in stats["arrangements"].items()}
    per_query = {}
    for query, private in stats["query_arrangements"].items():
        if query in left_out:
            continue
        arrangements.update({(n, t, role): 1 for n, (role, t) in private.items()})
        if private:
            per_query[(query, sum(t for _, t in private.values()))] = 1
    queries = {(n, stats["query_tuples"][n], stats["result_tuples"][n]): 1
               for n in stats["query_tuples"] if n not in left_out}
    return arrangements, queries, per_query


def test_introspection_facts_equal_stats_and_the_epoch_log_one_epoch_behind(spark):
    db = Engine(spark=spark, introspection=True)
    try:
        db.create_attribute(":t/e", type="ref")
        triangles = db.query(TRIANGLES, join="binary", name="triangles")  # keeps private intermediates
        hidden = db.query(TRIANGLES, join="binary", name="hidden", introspect=False)
        views = {name: db.query(text, name=name) for name, text in
                 (("arrangements", ARRANGEMENTS), ("queries", QUERIES), ("epochs", EPOCHS), ("per-query", PER_QUERY))}
        rng = random.Random(7)
        present: set[tuple[int, int]] = set()
        for step in range(3):
            if step == 1:
                triangles.close()  # its entity and arrangements are retracted with the next epoch
            stats, reports = db.stats(), list(db.epoch_log)
            adds = {(rng.randrange(5), rng.randrange(5)) for _ in range(5)} - present
            retracts = set(rng.sample(sorted(present), min(2, len(present))))
            present = (present | adds) - retracts
            epoch = db.transact([[":db/add", e, ":t/e", v] for e, v in sorted(adds)]
                                + [[":db/retract", e, ":t/e", v] for e, v in sorted(retracts)])
            assert epoch == step + 1 == len(db.epoch_log)  # introspection runs no epoch of its own
            arrangements, queries, per_query = expected_from(stats, {"hidden"})
            assert views["arrangements"].rows() == arrangements, step
            assert views["queries"].rows() == queries, step
            assert views["per-query"].rows() == per_query, step
            assert views["epochs"].rows() == {(r.epoch, r.seconds, len(r.jobs), r.changes, r.operations): 1
                                              for r in reports}, step
            assert "hidden" not in {row[0] for row in views["queries"].rows()}
            assert ("triangles" in {row[0] for row in views["queries"].rows()}) == (step < 1)
        triangles = {(a, b, c): 1 for a, b in present for b2, c in present if b2 == b and (a, c) in present}
        assert hidden.rows() == triangles  # left out of the facts, maintained all the same
    finally:
        db.close()


def test_reserved_attributes_cannot_be_written_or_created(spark):
    db = Engine(spark=spark, introspection=True)
    try:
        with pytest.raises(TransactionError, match=":factflow.epoch/jobs is maintained by the engine"):
            db.transact([[":db/add", 1, ":factflow.epoch/jobs", 3]])
        assert db.epoch == 0 and db.epoch_log == []
        with pytest.raises(Exception, match="reserved"):
            db.create_attribute(":factflow.epoch/mine", type="long")
    finally:
        db.close()


def test_a_durable_engine_keeps_the_attributes_but_not_the_facts(spark, tmp_path):
    config = EngineConfig(checkpoint_interval=0)
    db = Engine(spark=spark, state_dir=str(tmp_path), config=config, introspection=True)
    db.create_attribute(":t/n", type="long")
    db.transact([[":db/add", 1, ":t/n", 1]])
    db.transact([[":db/add", 2, ":t/n", 2]])
    db.checkpoint()
    db.transact(spark.createDataFrame([(3, ":t/n", 3), (5, ":t/n", 5), (6, ":t/n", 6)], "e long, a string, v long"))
    assert db.query("[:find ?e :where [?x :factflow.epoch/number ?e]]").rows() == {(1,): 1, (2,): 1}
    db.close()
    db = Engine(spark=spark, state_dir=str(tmp_path), config=config, introspection=True)
    try:
        assert db.epoch == 3
        assert db.query("[:find ?e :where [?x :factflow.epoch/number ?e]]").rows() == {}
        assert db.query("[:find ?v :where [?x :t/n ?v]]").rows() == {(v,): 1 for v in (1, 2, 3, 5, 6)}
        db.transact([[":db/add", 4, ":t/n", 4]])
        assert db.query("[:find ?n :where [?a :factflow.arrangement/name ?n]]").rows()  # described again
    finally:
        db.close()
