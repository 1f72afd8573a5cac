"""Rules are planned and maintained once for every query that calls them (factflow.planner.shared)."""

from __future__ import annotations

import pytest

from factflow.engine.reports import spark_jobs
from factflow.errors import QueryError

RULES = """[[(tc ?a ?b) [?a :edge ?b]] [(tc ?a ?b) (tc ?a ?c) [?c :edge ?b]]
            [(two ?a ?b) [?a :edge ?c] [?c :edge ?b]]
            [(far ?a ?b) (tc ?a ?b) (not (two ?a ?b))]]"""


@pytest.fixture
def chain(engine):
    engine.create_attribute(":edge", type="ref")
    engine.transact([[":db/add", a, ":edge", a + 1] for a in range(1, 12)])  # 1 -> ... -> 12
    engine.register(RULES)
    return engine


def tc_pairs(n: int) -> int:
    return n * (n - 1) // 2


def install_jobs(db, name: str) -> list[str]:
    return [j.description or "" for j in spark_jobs(db.spark, f"factflow-{db._id}-install-{name}")]


def test_queries_calling_a_rule_share_its_state(chain):
    pairs = chain.query("[:find ?a ?b :where (tc ?a ?b)]", name="pairs", join="binary")
    shared = chain.stats()["shared_rules"]
    assert list(shared) == ["shared tc (binary)"]
    assert shared["shared tc (binary)"]["tuples"] == tc_pairs(12)
    assert chain.stats()["query_tuples"]["pairs"] == 0  # the rule's set is not the query's

    count = chain.query("[:find (count ?b) . :with ?a :where (tc ?a ?b) [(> ?a 6)]]", name="count", join="binary")
    assert count.results() == tc_pairs(6)
    # the second install read the maintained closure: no fixpoint iteration ran for it
    assert not [d for d in install_jobs(chain, "count") if "insert" in d]
    shared = chain.stats()["shared_rules"]
    assert shared["shared tc (binary)"]["users"] == ["count", "pairs"]
    assert shared["shared tc (binary)"]["tuples"] == tc_pairs(12)

    chain.transact([[":db/retract", 8, ":edge", 9], [":db/add", 12, ":edge", 13]])
    # 1..8 and 9..13 are separate chains now
    assert len(pairs.results()) == tc_pairs(8) + tc_pairs(5)
    assert count.results() == 1 + tc_pairs(5)  # (7 8), and the chain 9..13
    # one fixpoint for both queries: its first overdeletion step (one collect, perhaps over
    # several Spark jobs with the same description) ran once in the epoch
    steps = [d or "" for d in chain.epoch_log[-1].steps]
    steps = [d for i, d in enumerate(steps) if i == 0 or d != steps[i - 1]]
    assert len([d for d in steps if d.endswith(": overdelete")]) == 1


def test_a_rule_installed_mid_stream_sees_the_maintained_state(chain):
    chain.query("[:find ?a ?b :where (far ?a ?b)]", name="far")
    chain.transact([[":db/retract", 5, ":edge", 6]])
    chain.transact([[":db/add", 5, ":edge", 7]])
    later = chain.query("[:find ?b :where (far 1 ?b)]", name="later")  # far is not recursive: shared
    # 1 -> 2 -> 3 -> 4 -> 5 -> 7 -> ... -> 12; far leaves out the pairs two hops apart
    assert later.results() == {(b,): 1 for b in (2, 4, 5, 7, 8, 9, 10, 11, 12)}
    assert set(chain.stats()["shared_rules"]) == {"shared far (auto)", "shared tc (auto)", "shared two (auto)"}
    assert chain.stats()["shared_rules"]["shared tc (auto)"]["users"] == ["far", "later"]


def test_closing_the_last_reader_releases_the_rule(chain):
    a = chain.query("[:find ?a ?b :where (far ?a ?b)]", name="a")
    b = chain.query("[:find ?a :where (tc ?a 12)]", name="b")  # goal-directed: its own rules
    c = chain.query("[:find ?a ?b :where (tc ?a ?b)]", name="c")
    traces = [t for e in a.dataflow.shared_rules() for t, _ in e.traces]
    assert {e.name for e in b.dataflow.shared_rules()} == set()
    a.close()
    assert {n: e["users"] for n, e in chain.stats()["shared_rules"].items()} == {"shared tc (auto)": ["c"]}
    chain.transact([[":db/add", 12, ":edge", 13]])
    assert len(c.results()) == tc_pairs(13)
    assert b.results() == {(x,): 1 for x in range(1, 12)}
    c.close()
    assert chain.stats()["shared_rules"] == {}
    assert all(not t.batches and not t.handles for t in traces)


def test_each_join_strategy_keeps_its_own_plan(chain):
    chain.query("[:find ?a ?b :where (two ?a ?b)]", join="binary")
    chain.query("[:find ?a ?b :where (two ?a ?b)]", join="delta")
    assert set(chain.stats()["shared_rules"]) == {"shared two (binary)", "shared two (delta)"}


def test_a_rejected_query_leaves_no_shared_rule(chain):
    with pytest.raises(QueryError, match=r"\?z"):
        chain.query("[:find ?z :where (far ?a ?b)]")
    assert chain.stats()["shared_rules"] == {}
    q = chain.query("[:find (count ?a) . :where (far ?a ?b)]")
    assert q.results() == 11  # every node with an outgoing edge
