"""Goal-directed evaluation of recursive rules (magic sets): what is derived, and the plan."""

from __future__ import annotations

import pytest

CHAIN = [(i, i + 1) for i in range(1, 40)]  # 1 -> 2 -> ... -> 40: full closure 780 pairs
TC = "[[(tc ?a ?b) [?a :edge ?b]] [(tc ?a ?b) (tc ?a ?c) [?c :edge ?b]]]"


@pytest.fixture
def chain(engine):
    engine.create_attribute(":edge", type="ref")
    engine.create_attribute(":start", type="boolean")
    engine.transact([[":db/add", a, ":edge", b] for a, b in CHAIN])
    engine.register(TC)
    return engine


def test_a_constant_argument_derives_only_what_the_goal_needs(chain):
    q = chain.query("[:find ?y :where (tc 35 ?y)]", name="goal")
    assert q.results() == {(y,): 1 for y in range(36, 41)}
    # the adorned rule holds tc(35, y) for 5 targets, its magic set {35}; a full evaluation 780 pairs
    assert chain.stats()["query_tuples"]["goal"] < 40
    full = chain.query("[:find ?x ?y :where (tc ?x ?y)]", name="full")
    assert len(full.results()) == 780
    assert chain.stats()["shared_rules"]["shared tc (auto)"]["tuples"] >= 780  # held by the rule, not the query


def test_explain_shows_the_adornment_and_the_seed(chain):
    plan = chain.query("[:find ?y :where [?s :start true] (tc ?s ?y)]").explain()
    assert "goal-directed: (tc ?s ?y) as tc[bf]#1" in plan
    assert "magic-tc[bf]#1" in plan
    assert "seeded with the distinct bindings of ?s" in plan
    assert "goal-directed" not in chain.query("[:find ?x ?y :where (tc ?x ?y)]").explain()


def test_the_seed_follows_the_data(chain):
    q = chain.query("[:find ?s ?y :where [?s :start true] (tc ?s ?y)]", name="seeded")
    assert q.results() == {}
    chain.transact([[":db/add", 38, ":start", True]])
    assert q.results() == {(38, 39): 1, (38, 40): 1}
    chain.transact([[":db/add", 36, ":start", True], [":db/retract", 38, ":start", True]])
    assert q.results() == {(36, y): 1 for y in (37, 38, 39, 40)}
    chain.transact([[":db/retract", 37, ":edge", 38]])
    assert q.results() == {(36, 37): 1}
    assert chain.stats()["query_tuples"]["seeded"] < 40  # updates held, not just the 1 present tuple


def test_a_bound_second_argument_goes_backwards(chain):
    chain.register("[[(tc-to ?a ?b) [?a :edge ?b]] [(tc-to ?a ?b) [?a :edge ?c] (tc-to ?c ?b)]]")
    q = chain.query("[:find ?x :where (tc-to ?x 4)]", name="to")
    assert q.results() == {(1,): 1, (2,): 1, (3,): 1}
    assert chain.stats()["query_tuples"]["to"] < 20


def test_the_call_keeps_only_its_own_bindings_of_the_adorned_rule(chain):
    # right-linear from a source: the demand spreads to every node reachable from 36, so the
    # adorned rule also holds tc-to(37, ...) and later; the call must keep tc-to(36, ...) only (multiset: each y once)
    chain.register("[[(tc-to ?a ?b) [?a :edge ?b]] [(tc-to ?a ?b) [?a :edge ?c] (tc-to ?c ?b)]]")
    q = chain.query("[:find ?y :where (tc-to 36 ?y)]", name="from", semantics="multiset")
    assert q.results() == {(y,): 1 for y in range(37, 41)}
    assert chain.stats()["query_tuples"]["from"] < 40
