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
    # only the base body (and its copy for rederivation) joins the magic set: the recursive
    # step reads its own adorned rule with the same bound argument, whose tuples are all in it
    assert plan.count("Recursive reference magic-tc[bf]#1") == 2
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
    # sg from 36 asks for every ancestor's same-generation set; the call must keep sg(36, ...)
    # only (multiset: each y once)
    chain.transact([[":db/add", 100, ":edge", 37], [":db/add", 100, ":edge", 200], [":db/add", 200, ":edge", 201]])
    chain.register("[[(sg ?x ?y) [?p :edge ?x] [?p :edge ?y] [(!= ?x ?y)]] "
                   " [(sg ?x ?y) [?a :edge ?x] (sg ?a ?b) [?b :edge ?y]]]")
    q = chain.query("[:find ?y :where (sg 38 ?y)]", name="from", semantics="multiset")
    assert q.results() == {(201,): 1}


@pytest.mark.parametrize("rule, call, expected, after", [
    ("[[(r ?a ?b) [?a :edge ?b]] [(r ?a ?b) (r ?a ?c) [?c :edge ?b]]]", "(r ?y 36)", range(1, 36), range(21, 36)),
    ("[[(r ?a ?b) [?a :edge ?b]] [(r ?a ?b) [?a :edge ?c] (r ?c ?b)]]", "(r 5 ?y)", range(6, 41), range(6, 21)),
])
def test_a_linear_rule_is_turned_around_for_the_bound_argument(chain, rule, call, expected, after):
    # written the unsuited way round, the demand would take in every node before 36 (or after
    # 5) and derive their closures too: hundreds of tuples instead of one per answer
    chain.register(rule)
    q = chain.query(f"[:find ?y :where {call}]", name="turned")
    assert q.results() == {(y,): 1 for y in expected}
    assert chain.stats()["query_tuples"]["turned"] < 3 * len(expected)
    assert "r-turned[" in q.explain()
    chain.transact([[":db/retract", 20, ":edge", 21]])
    assert q.results() == {(y,): 1 for y in after}
