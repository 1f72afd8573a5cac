"""The join strategy decision (factflow.planner.strategy), without Spark.

Summaries in, (strategy, reason) out: one case per rule of the policy and per override,
then summaries built from query text by the planner's conjunction class (a PlanContext
without a Spark session: building a summary reads only the schema and the rules).
"""

from __future__ import annotations

import pytest

from factflow import QueryError
from factflow.lang.parser import parse_query
from factflow.lang.rules import RuleStore
from factflow.model.schema import Schema
from factflow.planner.conjunction import Scope, _Conjunction
from factflow.planner.context import PlanContext
from factflow.planner.strategy import (
    STRATEGIES, ConjunctionSummary, Strategy, choose, closed_under, is_acyclic, requested_strategy,
)

AUTO, BINARY, DELTA, WCO = Strategy.AUTO, Strategy.BINARY, Strategy.DELTA, Strategy.WCO

TRIANGLE = ("a b", "b c", "a c")
FOUR_CYCLE = ("a b", "b c", "c d", "d a")
STAR = ("p x", "p y", "p z")
PATH = ("a b", "b c", "c d")
COVERED = ("a b c", "a b", "b c", "a c")  # a triangle inside one edge
OR = "(or-join [?a] [(> ?a 5)] [?a :e 1])"
GOAL = "(tc ?s ?y)"


def summary(requested: Strategy, *edges: str, **fields) -> ConjunctionSummary:
    """A summary whose edges are written as space-separated variables."""
    return ConjunctionSummary(requested, tuple(frozenset(e.split()) for e in edges),
                              fields.pop("cardinality_one", False), **fields)


CASES = [
    # 1. the body of a recursive rule is joined at a time, whatever else holds
    ("recursive body", summary(WCO, *TRIANGLE, recursive=True), BINARY, "body of a recursive rule"),
    ("recursive body before seeded clauses", summary(AUTO, *PATH, recursive=True, seeded_or=OR, seeded_goal=GOAL),
     BINARY, "body of a recursive rule"),
    # 2. binary requested
    ("binary requested", summary(BINARY, *TRIANGLE), BINARY, "requested"),
    ("binary requested before a seeded or", summary(BINARY, *PATH, seeded_or=OR), BINARY, "requested"),
    # 3. an or reading outer bindings
    ("seeded or", summary(AUTO, *TRIANGLE, seeded_or=OR), BINARY, f"{OR} reads outer bindings"),
    ("seeded or overrides wco", summary(WCO, *TRIANGLE, seeded_or=OR), BINARY, f"{OR} reads outer bindings"),
    ("seeded or before a seeded goal", summary(DELTA, *PATH, seeded_or=OR, seeded_goal=GOAL),
     BINARY, f"{OR} reads outer bindings"),
    # 4. a goal-directed call seeded by earlier clauses
    ("seeded goal", summary(AUTO, "s", "s y", seeded_goal=GOAL),
     BINARY, f"goal-directed {GOAL} is seeded by the clauses before it"),
    ("seeded goal overrides delta", summary(DELTA, *PATH, seeded_goal=GOAL),
     BINARY, f"goal-directed {GOAL} is seeded by the clauses before it"),
    # 5. delta or wco requested
    ("delta requested, one binding", summary(DELTA, "a b"), BINARY, "a single binding"),
    ("wco requested, no binding", summary(WCO), BINARY, "a single binding"),
    ("delta requested, one binding and a negation", summary(DELTA, "a b", negations=1), DELTA, "requested"),
    ("delta requested, cyclic", summary(DELTA, *TRIANGLE), DELTA, "requested"),
    ("wco requested, acyclic", summary(WCO, *PATH), WCO, "requested"),
    ("wco requested, cardinality one", summary(WCO, *STAR, cardinality_one=True), WCO, "requested"),
    # 6. auto: at most one binding
    ("auto, no binding", summary(AUTO), BINARY, "auto: a single binding"),
    ("auto, one binding", summary(AUTO, "a b"), BINARY, "auto: a single binding"),
    ("auto, one binding and a negation", summary(AUTO, "a b", negations=1), BINARY, "auto: a single binding"),
    # 7. auto: every binding a cardinality-one pattern, no input, no negation
    ("auto, cardinality one, a star on one variable", summary(AUTO, *STAR, "p w", cardinality_one=True),
     DELTA, "auto: a star of cardinality-one attributes on one variable"),
    ("auto, cardinality one, a star of three", summary(AUTO, *STAR, cardinality_one=True),
     BINARY, "auto: every binding is a cardinality-one attribute"),
    ("auto, cardinality one, a star stepped down", summary(AUTO, *STAR, "p w", cardinality_one=True,
                                                           support=(("x", "basic"),)),
     BINARY, "auto: a star of cardinality-one attributes on one variable, stepped down: x has support='basic'"),
    ("auto, cardinality one, a path", summary(AUTO, *PATH, cardinality_one=True),
     BINARY, "auto: every binding is a cardinality-one attribute"),
    ("auto, cardinality one before cyclic", summary(AUTO, *TRIANGLE, cardinality_one=True),
     BINARY, "auto: every binding is a cardinality-one attribute"),
    ("auto, cardinality one with a negation", summary(AUTO, *STAR, cardinality_one=True, negations=1),
     DELTA, "auto: acyclic join"),
    ("auto, cardinality one with an input", summary(AUTO, "x", *TRIANGLE, cardinality_one=True, sources=1),
     WCO, "auto: cyclic join"),
    # 8. auto: cyclic
    ("auto, triangle", summary(AUTO, *TRIANGLE), WCO, "auto: cyclic join"),
    ("auto, 4-cycle", summary(AUTO, *FOUR_CYCLE), WCO, "auto: cyclic join"),
    ("auto, triangle whose one variable determines the others", summary(AUTO, *TRIANGLE, determines=(("a", "b"), ("a", "c"))),
     DELTA, "auto: cyclic join made acyclic by cardinality-one attributes"),
    ("auto, 4-cycle with a dependency that closes no cycle", summary(AUTO, *FOUR_CYCLE, determines=(("a", "b"),)),
     WCO, "auto: cyclic join"),
    ("auto, 4-cycle closed by a chain of dependencies", summary(AUTO, *FOUR_CYCLE, determines=(("a", "b"), ("b", "c"))),
     DELTA, "auto: cyclic join made acyclic by cardinality-one attributes"),
    # 9. auto: acyclic
    ("auto, path", summary(AUTO, *PATH), DELTA, "auto: acyclic join"),
    ("auto, star", summary(AUTO, *STAR), DELTA, "auto: acyclic join"),
    ("auto, covered triangle", summary(AUTO, *COVERED), DELTA, "auto: acyclic join"),
]


@pytest.mark.parametrize("case, given, strategy, reason", CASES, ids=[c[0] for c in CASES])
def test_choose(case, given, strategy, reason):
    assert choose(given) == (strategy, reason)


ACYCLICITY = [
    ("no edge", (), True),
    ("one edge", ("a b c",), True),
    ("path", PATH, True),
    ("star", STAR, True),
    ("disconnected", ("a b", "c d"), True),
    ("repeated edge", ("a b", "a b"), True),
    ("hypergraph with a covering edge", COVERED, True),
    ("4-cycle with a covering edge", (*FOUR_CYCLE, "a b c d"), True),
    ("triangle", TRIANGLE, False),
    ("4-cycle", FOUR_CYCLE, False),
    ("triangle with a tail", (*TRIANGLE, "c d"), False),
]


def test_closed_under_takes_in_what_an_edge_determines_transitively():
    assert closed_under([{"l", "s"}, {"o", "s"}, {"x"}], [("l", "o"), ("o", "c"), ("s", "n")]) == [
        {"l", "s", "o", "c", "n"}, {"o", "s", "c", "n"}, {"x"}]


@pytest.mark.parametrize("case, edges, acyclic", ACYCLICITY, ids=[c[0] for c in ACYCLICITY])
def test_is_acyclic(case, edges, acyclic):
    assert is_acyclic([set(e.split()) for e in edges]) is acyclic


def test_requested_strategy():
    assert STRATEGIES == ("auto", "binary", "delta", "wco")
    assert [requested_strategy(s) for s in STRATEGIES] == [AUTO, BINARY, DELTA, WCO]
    assert requested_strategy("wco") == "wco" and f"{WCO}" == "wco"
    with pytest.raises(QueryError, match="unknown join strategy 'magic'; use one of auto, binary, delta, wco"):
        requested_strategy("magic")


# ---------------------------------------------------------------- summaries of query text

RULES = """[[(tc ?x ?y) [?x :e ?y]]
            [(tc ?x ?y) [?x :e ?z] (tc ?z ?y)]
            [(edge ?x ?y) [?x :e ?y]]]"""


def context(requested: Strategy, recursive: bool = False) -> PlanContext:
    """A plan context over a small schema and rules, with no Spark session."""
    schema = Schema()
    schema.create(":e", "ref")
    schema.create(":start", "boolean")
    schema.create(":name", "string", "one")
    schema.create(":age", "long", "one")
    rules = RuleStore()
    rules.register(RULES)
    pc = PlanContext(schema, rules, "set", requested)
    pc.transient = recursive
    return pc


def summarize(text: str, requested: Strategy = AUTO, recursive: bool = False) -> ConjunctionSummary:
    """The summary of ``text``'s ``:where``; checks that building it allocates no column."""
    scope = Scope(context(requested, recursive))
    built = _Conjunction(parse_query(text).where, [], scope, scope.pc, ()).summary()
    assert scope.columns == {}
    return built


def shown(edges) -> str:
    """Edges as text: each edge's variables sorted, edges separated by ``|``."""
    return " | ".join(" ".join(sorted(e)) for e in edges)


TEXTS = [
    ("[:find ?a :where [?a :e ?b] [?b :e ?c] [?a :e ?c]]",
     "?a ?b | ?b ?c | ?a ?c", (WCO, "auto: cyclic join")),
    ("[:find ?p :where [?p :age ?a] [?p :name ?n] (edge ?a ?n)]",
     "?a ?p | ?n ?p | ?a ?n", (DELTA, "auto: cyclic join made acyclic by cardinality-one attributes")),
    ("[:find ?a :where [?a :e ?b] [?b :e ?c] [(< ?a ?c)]]",
     "?a ?b | ?b ?c", (DELTA, "auto: acyclic join")),
    ("[:find ?p :where [?p :name ?n] [?p :age ?a]]",
     "?n ?p | ?a ?p", (BINARY, "auto: every binding is a cardinality-one attribute")),
    ("[:find ?p :where [?p :name ?n] [?p :age ?a] [?p :age ?b] [?p :name ?m]]",
     "?n ?p | ?a ?p | ?b ?p | ?m ?p", (DELTA, "auto: a star of cardinality-one attributes on one variable")),
    ("[:find ?p :where [?p :name ?n] [?q :name ?n] [?q :age ?a]]",
     "?n ?p | ?n ?q | ?a ?q", (BINARY, "auto: every binding is a cardinality-one attribute")),
    ("[:find ?p :where [?p :name ?n] [?p :age ?a] (not [?p :e 1])]",
     "?n ?p | ?a ?p", (DELTA, "auto: acyclic join")),
    ("[:find ?a :where [?a :e 1]]",
     "?a", (BINARY, "auto: a single binding")),
    ("[:find ?x ?y :where [(ground [[1 2]]) [[?x ?y]]] (edge ?x ?y)]",
     "?x ?y | ?x ?y", (DELTA, "auto: acyclic join")),
    ("[:find ?y :where [?s :start true] (tc ?s ?y)]",
     "?s | ?s ?y", (BINARY, "goal-directed (tc ?s ?y) is seeded by the clauses before it")),
    ("[:find ?y :where [?s :start true] (edge ?s ?y)]",
     "?s | ?s ?y", (DELTA, "auto: acyclic join")),
    ("[:find ?x ?y :where (tc ?x ?y) [?y :e ?z]]",
     "?x ?y | ?y ?z", (DELTA, "auto: acyclic join")),
    (f"[:find ?a :where [?a :e ?b] {OR}]",
     "?a ?b | ?a", (BINARY, f"{OR} reads outer bindings")),
    ("[:find ?a :where [?a :e ?b] (or [?a :name ?b] [?b :e ?a])]",
     "?a ?b | ?a ?b", (DELTA, "auto: acyclic join")),
]


@pytest.mark.parametrize("text, edges, decision", TEXTS, ids=[t[0] for t in TEXTS])
def test_summary_of_query_text(text, edges, decision):
    built = summarize(text)
    assert shown(built.edges) == edges
    assert choose(built) == decision


def test_summary_fields_from_query_text():
    assert summarize("[:find ?a :where [?a :e ?b] (not [?b :e ?a]) (not [?a :e 1])]").negations == 2
    assert summarize("[:find ?a :where [?a :e ?b]]", WCO) == ConjunctionSummary(
        WCO, (frozenset({"?a", "?b"}),), False, negations=0, support=((":e", "wco"),))
    assert choose(summarize("[:find ?a :where [?a :e ?b] (not [?b :e ?a])]", DELTA)) == (DELTA, "requested")
    seeded = summarize(f"[:find ?y :where [?s :start true] (tc ?s ?y) [?a :e ?y] {OR}]")
    assert (seeded.seeded_goal, seeded.seeded_or) == (GOAL, OR)
    recursive = summarize("[:find ?x ?y :where [?x :e ?z] (tc ?z ?y)]", recursive=True)
    assert recursive.recursive and choose(recursive) == (BINARY, "body of a recursive rule")
