"""Plans as plain data (factflow.planner.plan): planned without Spark, compared, serialized, installed.

Most tests plan against a Schema and RuleStore built in Python, with the allocating
classes patched to fail: planning must touch none of them. The last tests install plans
in a real engine: ``Engine.plan`` equals ``Query.plan``, ``Engine.query(plan)`` installs the
plan it is given or refuses it, results match the brute-force oracle, and an install that
fails midway leaves no handle, trace, view or shared rule.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from factflow import Engine, QueryError
from factflow.arrangement import attribute as attribute_module
from factflow.arrangement import trace as trace_module
from factflow.engine import allocation as allocation_module
from factflow.lang.parser import parse_query
from factflow.lang.rules import RuleStore
from factflow.model.schema import Schema
from factflow.planner.plan import Plan
from factflow.planner.shared import SharedRules
from factflow.planner.synthesis import plan_query
from oracle import Oracle

ATTRIBUTES = [(":e", "ref", "set"), (":name", "string", "one"), (":age", "long", "one"), (":tag", "string", "raw"),
              (":born", "instant", "one")]
RULES = """[[(tc ?x ?y) [?x :e ?y]]
            [(tc ?x ?y) [?x :e ?z] (tc ?z ?y)]
            [(adult ?p) [?p :age ?a] [(>= ?a 18)]]]"""

QUERIES = [  # (text, inputs, join): every kind of operator and slot
    ("[:find ?a ?b ?c :where [?a :e ?b] [?b :e ?c] [?a :e ?c]]", (), "auto"),
    ("[:find ?a ?b ?c :where [?a :e ?b] [?b :e ?c] [?a :e ?c]]", (), "binary"),
    ("[:find ?n :in $ ?min :where [?p :age ?a] [(>= ?a ?min)] [?p :name ?n]]", (30,), "auto"),
    ("[:find ?x ?y :where (tc ?x ?y)]", (), "auto"),
    ("[:find ?y :in $ [?s ...] :where (tc ?s ?y)]", ([1, 2],), "auto"),
    ("[:find ?n (count ?p) :where (adult ?p) [?p :name ?n] (not [?p :tag \"x\"])]", (), "delta"),
    ("[:find (pull ?p [* {:e [:name]}]) :where [?p :age 40]]", (), "auto"),
    ("[:find ?p :in $ ?t :where (or [?p :tag \"a\"] [?p :name \"b\"]) [?p :born ?b] [(< ?b ?t)]]",
     (dt.datetime(2020, 1, 2, tzinfo=dt.timezone.utc),), "auto"),
    ("[:find ?p ?k :where [(ground [[1 \"a\"] [2 \"b\"]]) [[?p ?k]]] [?p :tag ?k]]", (), "wco"),
]


def schema_and_rules(rules: str = RULES) -> tuple[Schema, RuleStore]:
    schema = Schema()
    for name, kind, semantics in ATTRIBUTES:
        schema.create(name, kind, semantics)
    store = RuleStore()
    store.register(rules)
    return schema, store


def plan(text: str, inputs=(), join: str = "auto", semantics: str = "set", rules: str = RULES,
         shared: SharedRules | None = None) -> Plan:
    schema, store = schema_and_rules(rules)
    return plan_query(text, schema, store, inputs, join, semantics, SharedRules() if shared is None else shared)


@pytest.fixture
def no_allocation(monkeypatch):
    """Make every allocation of a trace, handle, index or view fail."""
    def refuse(*args, **kwargs):
        raise AssertionError("planning allocated something")

    monkeypatch.setattr(trace_module.Trace, "__init__", refuse)
    monkeypatch.setattr(trace_module.Trace, "handle", refuse)
    monkeypatch.setattr(attribute_module.AttributeArrangement, "index", refuse)
    monkeypatch.setattr(allocation_module, "register_view", refuse)


@pytest.mark.parametrize("text, inputs, join", QUERIES)
def test_the_same_query_planned_twice_gives_equal_plans(text, inputs, join, no_allocation):
    first = plan(text, inputs, join)
    again = plan(" ".join(text.replace("[", " [ ").split()), list(inputs), join)  # spaced differently
    assert first == again and first.fingerprint() == again.fingerprint() and hash(first) == hash(again)
    assert first.to_data() == again.to_data()
    assert len(first.fingerprint()) == 64


@pytest.mark.parametrize("text, inputs, join", QUERIES)
def test_to_data_is_json_naming_every_operator(text, inputs, join, no_allocation):
    planned = plan(text, inputs, join)
    data = planned.to_data()
    text_form = json.dumps(data, sort_keys=True, separators=(",", ":"))
    assert json.loads(text_form) == data
    assert planned.fingerprint() == hashlib.sha256(text_form.encode()).hexdigest()
    operators = data["operators"]
    for number, operator in enumerate(operators):
        assert operator["op"] and all(n < number for n in operator["inputs"])
        assert all(isinstance(name, str) and kind for name, kind in operator["columns"])
    assert operators[data["result"]]["slot"]["role"] == "result"
    assert data["strategies"][0][0] == "query" and data["strategies"][0][2]  # the reason it was chosen


def test_plan_data_names_slots_strategies_and_constants(no_allocation):
    triangle = plan(QUERIES[0][0]).to_data()
    assert triangle["strategies"] == [["query", "wco", "auto: cyclic join"]]
    (join,) = [o for o in triangle["operators"] if o["op"] == "DeltaJoin"]
    assert join["strategy"] == "wco"
    counted = [e["count_index"]["slot"] for p in join["pipelines"] for s in p["stages"] if "extend" in s
               for e in s["extenders"] if e["count_index"]]
    assert counted and {c["face"] for c in counted} <= {"count_e", "count_v"} and counted[0]["handle"] == ":e"
    scans = [o["slot"] for o in triangle["operators"] if o["op"] == "Scan"]
    assert {(s["handle"], s["owner"]) for s in scans} == {(":e", "query")}
    inputs = plan(*QUERIES[2]).to_data()
    assert [o["slot"]["rows"] for o in inputs["operators"] if o["op"] == "Static"] == [[[30]]]
    instant = plan(*QUERIES[7]).to_data()
    assert [o["slot"]["rows"] for o in instant["operators"] if o["op"] == "Static"] == \
        [[[{"instant": "2020-01-02T00:00:00"}]]]
    rules = plan(*QUERIES[3]).to_data()
    (tc,) = rules["shared_rules"]
    assert tc["name"] == "shared tc (auto)" and tc["attributes"] == [":e"]
    assert rules["operators"][tc["relations"]["tc"]]["op"] == "RuleOutput"
    assert all(o["slot"]["owner"] == tc["name"] for o in rules["operators"] if o["op"] == "Scan")


def test_count_sum_and_avg_are_accumulated_with_hidden_columns_that_rules_project_away(no_allocation):
    def reduce_of(text: str) -> dict:
        (reduce,) = [o for o in plan(text).to_data()["operators"] if o["op"] == "Reduce"]
        return reduce

    reduce = reduce_of("[:find ?n (avg ?a) (count ?p) :with ?p :where [?p :age ?a] [(>= ?a 18)] [?p :name ?n]]")
    assert reduce["accumulated"]
    assert [n for n, _ in reduce["slot"]["columns"]][-2:] == ["_tuples", f"_sum_{reduce['specs'][0]['column']}"]
    reduce = reduce_of("[:find ?n (max ?a) :with ?p :where [?p :age ?a] [?p :name ?n]]")
    assert not reduce["accumulated"] and "_tuples" not in [n for n, _ in reduce["slot"]["columns"]]
    rules = "[[(mean-age ?n (avg ?a)) [?p :name ?n] [?p :age ?a]]]"
    operators = plan("[:find ?n ?m :where (mean-age ?n ?m)]", rules=rules).to_data()["operators"]
    (reduce,) = [o for o in operators if o["op"] == "Reduce"]
    assert reduce["accumulated"] and "_tuples" in [n for n, _ in reduce["slot"]["columns"]]
    readers = [o for o in operators if operators.index(reduce) in o["inputs"]]
    assert [o["op"] for o in readers] == ["Project"]  # the rule's relation has its head's columns only


@pytest.mark.parametrize("text, distinct", [
    # accumulated, and ?p determines every variable: each derivation is a distinct tuple
    ("[:find ?n (avg ?a) (count ?p) :with ?p :where [?p :age ?a] [(>= ?a 18)] [?p :name ?n]]", False),
    ("[:find (sum ?b) :with ?p :where [?p :age ?a] [(* ?a 2) ?b]]", False),
    # ?p dropped: two persons of one age are one tuple
    ("[:find (sum ?a) :where [?p :age ?a]]", True),
    # a set attribute's value is not determined by its entity
    ("[:find (count ?c) :with ?p :where [?p :e ?c] [?p :age ?a]]", False),
    ("[:find (count ?a) :with ?p :where [?p :e ?c] [?p :age ?a]]", True),
    # max is recomputed over the touched groups' input, which the Distinct holds
    ("[:find ?n (max ?a) :with ?p :where [?p :age ?a] [?p :name ?n]]", True),
    # a rule relation is not known to be a set of unique derivations here
    ("[:find (count ?p) :with ?p :where (adult ?p)]", True),
])
def test_an_aggregate_input_is_made_a_set_only_when_it_may_not_be_one(text, distinct, no_allocation):
    operators = plan(text).to_data()["operators"]
    (reduce,) = [o for o in operators if o["op"] == "Reduce"]
    assert (operators[reduce["inputs"][0]]["op"] == "Distinct") is distinct


@pytest.mark.parametrize("a, b", [
    (("[:find ?p :where [?p :age 30]]",), ("[:find ?p :where [?p :age 31]]",)),
    ((QUERIES[2][0], (30,)), (QUERIES[2][0], (31,))),
    (("[:find ?p :in $ ?n :where [?p :name ?n]]", ("ann",)), ("[:find ?p :in $ ?n :where [?p :name ?n]]", ("bob",))),
    ((QUERIES[0][0], (), "delta"), (QUERIES[0][0], (), "wco")),
    ((QUERIES[0][0], (), "auto", "set"), (QUERIES[0][0], (), "auto", "multiset")),
    (("[:find ?n :where (adult ?p) [?p :name ?n]]",),
     ("[:find ?n :where (adult ?p) [?p :name ?n]]", (), "auto", "set", RULES.replace("18", "21"))),
    (("[:find ?n :where [?p :name ?n]]",), ("[:find ?m :where [?p :name ?m]]",)),
])
def test_a_different_constant_input_strategy_semantics_or_rule_gives_a_different_plan(a, b, no_allocation):
    first, second = plan(*a), plan(*b)
    assert first != second and first.fingerprint() != second.fingerprint()
    assert first.to_data() != second.to_data()


def test_planning_allocates_nothing_and_leaves_the_registry_alone(no_allocation):
    registry = SharedRules()
    for text, inputs, join in QUERIES:
        planned = plan(text, inputs, join, shared=registry)
        for node in planned.nodes:
            assert all(getattr(node, what, None) in (None, {}) for what in ("handle", "writer", "view", "handles"))
    assert registry.entries() == []


def test_a_plan_is_the_same_whether_its_shared_rules_are_installed_or_not(no_allocation):
    registry = SharedRules()
    text = "[:find ?x ?y :where (tc ?x ?y) [?y :name \"z\"]]"
    fresh = plan(text, shared=registry)
    assert [e.installed for e in fresh.shared] == [False]
    registry.commit("q1", fresh.shared)  # what installing the first plan records
    reused = plan(text, shared=registry)
    assert reused.shared == fresh.shared and reused == fresh
    other = "[:find ?y :where (tc 1 ?y) (adult ?y)]"
    assert plan(other, join="binary", shared=registry) == plan(other, join="binary")
    assert [e.name for e in plan(other, join="binary", shared=registry).shared] == ["shared adult (binary)"]


def test_planning_needs_no_spark_session_and_fingerprints_are_stable_across_processes():
    code = ("import json, sys; from pyspark import SparkContext; from test_plans import QUERIES, plan; "
            "print(json.dumps([plan(*q).fingerprint() for q in QUERIES])); "
            "assert SparkContext._active_spark_context is None")
    tests = os.path.dirname(__file__)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.path.dirname(tests)])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [plan(*q).fingerprint() for q in QUERIES]


@pytest.mark.parametrize("text, inputs, named", [
    ("[:find ?p :in $ ?min :where [?p :age ?a] [(>= ?a ?min)]]", (), "expects 1 input"),
    ("[:find ?p :in $ ?min :where [?p :age ?a] [(>= ?a ?min)]]", ("old",), "?min"),
    ("[:find ?p :where [?p :height ?h]]", (), ":height"),
    ("[:find ?x :where (nope ?x)]", (), "nope"),
])
def test_bad_queries_are_rejected_by_planning_naming_the_item(text, inputs, named, no_allocation):
    with pytest.raises(QueryError) as info:
        plan(text, inputs)
    assert named in str(info.value)


# ---------------------------------------------------------------- installing plans (Spark)

def declare(target, rules: str = RULES) -> None:
    """Create the first four attributes and register ``rules`` in an engine or the oracle."""
    for name, kind, semantics in ATTRIBUTES[:4]:
        target.create_attribute(name, kind, semantics)
    target.register(rules)


def held(engine) -> tuple[int, int, int]:
    """Live handles on the shared arrangements, shared rules, and temp views of constant relations."""
    state = engine._state
    handles = sum(len(t.handles) for a in state.arrangements.values() for t in a.traces.values())
    views = [t.name for t in engine.spark.catalog.listTables() if t.isTemporary and t.name.startswith("ff_s")]
    return handles, len(state.shared.entries()), len(views)


def test_engine_plan_is_the_installed_plan_and_a_failed_install_holds_nothing(engine, monkeypatch):
    oracle = Oracle()
    declare(engine)
    declare(oracle)
    facts = [[":db/add", a, ":e", a + 1] for a in range(1, 6)]
    facts += [[":db/add", 3, ":e", 1], [":db/add", 2, ":age", 20], [":db/add", 4, ":age", 9]]
    engine.transact(facts)
    oracle.transact(facts)
    baseline = held(engine)

    text, inputs = "[:find ?y :in $ [?s ...] :where (tc ?s ?y) [(> ?y 2)]]", [[1, 4]]
    planned = engine.plan(text, inputs=inputs)
    assert held(engine) == baseline  # planning allocated nothing
    q = engine.query(text, inputs=inputs)
    assert q.plan == planned and q.plan is not planned and q.plan.to_data() == planned.to_data()
    assert Counter(q.rows()) == oracle.query(text, inputs)
    with_q = held(engine)
    assert with_q[0] > baseline[0] and with_q[2] == baseline[2] + 1

    # an install failing once the result trace is due: handles, views and a new shared rule were allocated
    failing = "[:find ?n :in $ [?n ...] :where (adult ?p) [?p :age ?n]]"
    allocate = allocation_module.Allocation.trace

    def fail_on_result(self, slot):
        if slot.role == "result":
            assert self.new_rules and self._holders["query"].views and self._holders["query"].handles
            raise QueryError("refused for the test")
        return allocate(self, slot)

    monkeypatch.setattr(allocation_module.Allocation, "trace", fail_on_result)
    with pytest.raises(QueryError, match="refused for the test"):
        engine.query(failing, name="fails", inputs=[[20, 9]])
    assert held(engine) == with_q and "fails" not in engine.queries
    assert engine._state.shared.get("adult", "auto") is None
    monkeypatch.undo()

    again = engine.query(failing, name="works", inputs=[[20, 9]])
    assert again.plan == engine.plan(failing, inputs=[[9, 20, 9]])  # inputs as a set: order and repeats aside
    assert Counter(again.rows()) == oracle.query(failing, [[20, 9]])
    engine.transact([[":db/add", 5, ":age", 20]])
    oracle.transact([[":db/add", 5, ":age", 20]])
    assert Counter(again.rows()) == oracle.query(failing, [[20, 9]])
    again.close()
    q.close()
    assert held(engine) == baseline


def test_a_plan_is_installed_as_given_any_number_of_times_and_refused_from_an_engine_planning_otherwise(engine):
    """``Engine.query(plan)``: the plan object stays unbound and installs twice; a plan with
    arguments beside it, one without text, and one another engine's rules made different are
    refused without a trace; one from an engine with the same schema and rules installs."""
    oracle = Oracle()
    declare(engine)
    declare(oracle)
    facts = [[":db/add", 1, ":age", 30], [":db/add", 2, ":age", 12], [":db/add", 3, ":age", 18],
             [":db/add", 1, ":name", "ann"], [":db/add", 3, ":name", "cy"], [":db/add", 1, ":e", 3]]
    engine.transact(facts)
    oracle.transact(facts)
    text, inputs = "[:find ?n :in $ [?x ...] :where (adult ?p) [?p :name ?n] [?x :e ?p]]", [[1, 2]]
    planned = engine.plan(text, inputs=inputs, join="delta")
    data = planned.to_data()
    assert planned.source.query == text and planned.source.inputs == (inputs[0],) and planned.source.join == "delta"

    before = held(engine)
    first = engine.query(planned, name="first")
    second = engine.query(planned, name="second")
    assert first.plan == planned == second.plan and first.plan is not planned
    assert planned.to_data() == data and planned.result.writer is None  # the plan given stays unbound
    engine.transact([[":db/add", 2, ":age", 40], [":db/add", 2, ":name", "bo"], [":db/add", 1, ":e", 2]])
    oracle.transact([[":db/add", 2, ":age", 40], [":db/add", 2, ":name", "bo"], [":db/add", 1, ":e", 2]])
    expected = oracle.query(text, inputs)
    assert Counter(first.rows()) == Counter(second.rows()) == expected and expected

    baseline = held(engine)
    with pytest.raises(QueryError, match="give none of them"):
        engine.query(planned, name="third", inputs=inputs)
    with pytest.raises(QueryError, match="only a plan made by Engine.plan"):
        engine.query(plan_query(parse_query(text), engine.schema, engine.rules, inputs), name="third")
    other, same = Engine(spark=engine.spark), Engine(spark=engine.spark)
    try:
        declare(other, RULES.replace("18", "21"))  # adults from 21 on
        declare(same)
        with pytest.raises(QueryError, match="not this engine's plan"):
            engine.query(other.plan(text, inputs=inputs, join="delta"), name="third")
        assert held(engine) == baseline and "third" not in engine.queries
        third = engine.query(same.plan(text, inputs=inputs, join="delta"), name="third")
    finally:
        other.close()
        same.close()
    assert Counter(third.rows()) == expected
    for q in (first, second, third):
        q.close()
    assert held(engine) == before


@pytest.mark.parametrize("text, inputs, join, nothing", [
    ("[:find ?a ?b :where [?a :e ?b]]", (), "auto", True),
    ("[:find ?p :in $ [?n ...] :where [?p :name ?n]]", (["a", "b"],), "binary", True),  # joined: no match
    ("[:find ?p ?k :where [(ground [[1 \"a\"] [2 \"b\"]]) [[?p ?k]]] [?p :tag ?k]]", (), "wco", True),
    ("[:find ?n (count ?p) :where (adult ?p) [?p :name ?n] (not [?p :tag \"x\"])]", (), "delta", True),
    ("[:find ?x ?y :where (tc ?x ?y)]", (), "auto", True),
    ("[:find ?n :in $ [?n ...] :where (not-join [?n] [?p :name ?n])]", (["a"],), "auto", False),
    ("[:find ?x :where (or [?x :age 3] [(ground 7) ?x])]", (), "auto", False),
    ("[:find (count ?x) :where [(ground [1 2]) [?x ...]]]", (), "auto", False),
    ("[:find ?x ?y :where (seeded ?x ?y)]", (), "auto", False),
])
def test_an_install_over_empty_attributes_computes_only_what_constants_reach(text, inputs, join, nothing,
                                                                             no_allocation):
    """With every attribute empty, a query's stateful operators get rows only from constant
    relations that reach them other than through a join: alone, in a union, on the left of
    a negation, or as a recursive rule's base case."""
    from types import SimpleNamespace

    from factflow.dataflow.nodes import Scan
    from factflow.engine.install import produces_nothing

    seeded = """[(one ?v) [(ground 1) ?v]]
                 [(seeded ?x ?y) (one ?x) (one ?y)]
                 [(seeded ?x ?y) [?x :e ?z] (seeded ?z ?y)]]"""
    planned = plan(text, inputs, join, rules=RULES[:-1] + seeded)
    for node in planned.nodes:
        if isinstance(node, Scan):
            node.handle = SimpleNamespace(tuples=0)
    assert produces_nothing(planned) is nothing
    for node in planned.nodes:
        if isinstance(node, Scan):
            node.handle = SimpleNamespace(tuples=3)
    assert not produces_nothing(planned) or not any(isinstance(n, Scan) for n in planned.nodes)
