"""What ``register`` rejects at once (no Spark): calls with the wrong number of arguments and
negation through recursion, among the rules known when they are registered; all or nothing,
and nothing logged. The planner still checks what only a query reveals."""

from __future__ import annotations

import pytest

from factflow import RuleError
from factflow.lang.rules import RuleStore
from factflow.model.schema import Schema
from factflow.planner.synthesis import plan_query

NEGATED_CYCLE = "[[(p ?x) [?x :n/a _] (not (q ?x))] [(q ?x) [?x :n/b _] (p ?x)]]"


def _register(store: RuleStore, logged: list[str], text: str) -> list[str]:
    """Register ``text``, appending what the registration logs to ``logged``."""
    return store.register(text, log=logged.append)


def _schema() -> Schema:
    schema = Schema()
    for name in (":n/a", ":n/b"):
        schema.create(name, "ref", "set")
    return schema


@pytest.mark.parametrize("rules, fragments", [
    (NEGATED_CYCLE, ["rules p -> q are not stratifiable", "p negates q, which depends on p"]),
    ("[[(p ?x) [?x :n/a _] (not (p ?x))]]", ["rules p are not stratifiable", "p negates p"]),
    ("[[(p ?x) [?x :n/a _] (or (q ?x) [?x :n/b _])] [(q ?x) [?x :n/b _] (not-join [?x] (p ?x))]]",
     ["rules p -> q are not stratifiable", "q negates p"]),
], ids=["mutual", "self", "nested-in-or-and-not-join"])
def test_negation_through_recursion_is_rejected_when_registered(rules, fragments):
    store, logged = RuleStore(), []
    with pytest.raises(RuleError) as info:
        _register(store, logged, rules)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    assert store.names() == [] and logged == [] and store.texts == []


def test_a_cycle_closed_by_a_later_registration_rejects_that_registration_only():
    store, logged = RuleStore(), []
    _register(store, logged, "[[(q ?x) [?x :n/b _] (p ?x)]]")  # p is not registered yet: allowed
    with pytest.raises(RuleError, match="not stratifiable: p negates q, which depends on p"):
        _register(store, logged, "[[(p ?x) [?x :n/a _] (not (q ?x))] [(r ?x) [?x :n/a _]]]")
    assert store.names() == ["q"] and len(logged) == 1  # neither p nor r was stored or logged
    _register(store, logged, "[[(p ?x) [?x :n/a _]]]")  # a definition without the negation is welcome
    assert store.names() == ["p", "q"] and len(logged) == 2


def test_negating_a_rule_that_does_not_depend_on_the_caller_is_fine():
    store, logged = RuleStore(), []
    _register(store, logged, "[[(p ?x) [?x :n/a _] (not (q ?x))] [(q ?x) [?x :n/b _]]]")
    _register(store, logged, "[[(s ?x) [?x :n/a _] (not (s2 ?x))] [(s2 ?x) (p ?x) (q ?x)]]")
    assert store.names() == ["p", "q", "s", "s2"]


@pytest.mark.parametrize("earlier, rules, fragment", [
    (None, "[[(adult ?p) [?p :n/a ?a] (grown ?a ?p)] [(grown ?a) [?a :n/b _]]]",
     "rule adult, (grown ?a ?p): rule grown takes 1 argument, got 2"),
    ("[[(grown ?a) [?a :n/b _]]]", "[[(adult ?p) [?p :n/a ?a] (not (grown ?a ?p))]]",
     "rule adult, (grown ?a ?p): rule grown takes 1 argument, got 2"),
    ("[[(adult ?p) [?p :n/a ?a] (or (grown ?a) [?a :n/b ?p])]]", "[[(grown ?a ?b) [?a :n/b ?b]]]",
     "rule adult, (grown ?a): rule grown takes 2 arguments, got 1"),
], ids=["same-registration", "callee-registered-before", "caller-registered-before"])
def test_a_call_with_the_wrong_number_of_arguments_is_rejected_once_both_rules_are_known(earlier, rules, fragment):
    store, logged = RuleStore(), []
    if earlier is not None:
        _register(store, logged, earlier)
    before = list(store.names())
    with pytest.raises(RuleError) as info:
        _register(store, logged, rules)
    assert fragment in str(info.value), str(info.value)
    assert store.names() == before and len(logged) == len(before)


def test_a_call_of_a_rule_not_registered_yet_is_allowed():
    store, logged = RuleStore(), []
    assert _register(store, logged, "[[(adult ?p) [?p :n/a ?a] (grown ?a ?p ?p)]]") == ["adult"]
    assert len(logged) == 1


def test_restore_keeps_what_an_older_factflow_registered_and_the_planner_still_refuses_it():
    store = RuleStore()
    store.restore(NEGATED_CYCLE)  # a state directory written before register checked calls
    store.restore("[[(adult ?p) [?p :n/a ?a] (grown ?a ?p)] [(grown ?a) [?a :n/b _]]]")
    assert store.names() == ["adult", "grown", "p", "q"]
    with pytest.raises(RuleError, match="not stratifiable: p negates q"):
        plan_query("[:find ?x :where (p ?x)]", _schema(), store)
    with pytest.raises(RuleError, match="rule grown takes 1 argument, got 2"):
        plan_query("[:find ?p :where (adult ?p)]", _schema(), store)


def test_the_planner_checks_a_query_s_own_calls():
    store = RuleStore()
    store.register("[[(grown ?a) [?a :n/b _]]]")
    with pytest.raises(RuleError) as info:
        plan_query("[:find ?a :where [?a :n/a ?b] (grown ?a ?b)]", _schema(), store)
    assert "(grown ?a ?b): rule grown takes 1 argument, got 2" in str(info.value), str(info.value)
