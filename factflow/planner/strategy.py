"""Choosing the join strategy of one conjunction: the whole decision, in :func:`choose`.

Strategies (``Engine.query(..., join=...)``):

* ``binary``: join-at-a-time in clause order; every intermediate result that is joined
  again is arranged privately (memory grows with intermediate results, speed depends on
  the clause order).
* ``delta``: one delta pipeline per binding that can change, extended by lookups into
  shared arrangements; no private state.
* ``wco``: delta pipelines whose stages are worst-case optimal (Hector) extensions.
* ``auto``: chosen per conjunction by the policy below.

The planner describes each conjunction (a query's ``:where``, a rule body, a negated or
``or`` clause group) by a :class:`ConjunctionSummary`, plain data built by
``_Conjunction.summary`` in :mod:`factflow.planner.conjunction`, and plans it with what
:func:`choose` returns; no other module decides. Its *bindings* are the clauses that bind
variables on their own (data patterns, rule calls, inputs, literal collections, unions);
negations and predicates do not count. The policy, first match wins:

1. the body of a recursive rule: ``binary``; it is re-evaluated in every iteration of
   its fixpoint, so it is joined at a time and arranges nothing (``explain`` shows it
   within the fixpoint, not among the conjunctions);
2. ``binary`` requested: ``binary``;
3. an ``or`` that reads outer bindings (its branches need variables bound by the clauses
   before it): ``binary``, which evaluates the ``or`` on the prefix joined so far;
4. a call of a recursive rule with an argument bound by an earlier clause: ``binary``;
   its goal-directed evaluation (magic sets) is seeded by the join-at-a-time prefix;
5. ``delta`` or ``wco`` requested: ``binary`` for a single binding without negation
   (there is nothing to join), else the requested strategy if every attribute of the
   conjunction's data patterns supports it (``create_attribute(support=...)``: ``wco``
   needs count indexes, ``delta`` lookups that ``support="basic"`` rules out), else a
   QueryError naming the attribute and its setting;
6. ``auto`` with at most one binding: ``binary`` (nothing to join, so nothing is arranged);
7. ``auto`` where every binding is a data pattern over a cardinality-one attribute (no
   inputs, no negation): ``delta`` when there are at least :data:`STAR_FROM` bindings
   and all have one variable in common (a star on one entity, such as a table's columns
   joined by row), else ``binary``. Each join step keeps at most one value per entity, so
   intermediate results never outgrow the inputs, and join-at-a-time plans are the
   cheapest on Spark (thesis figure 8b); but each step arranges its intermediate result
   privately, and a star needs none of it: its delta pipelines look every attribute up by
   the one entity in the shared indexes, and an epoch that changes many of them reads
   each twice by the entities it touches (see :mod:`factflow.dataflow.delta`);
8. ``auto`` where the bindings form a cyclic hypergraph over their variables (for example
   triangles): ``wco``, whose extensions stay within the worst-case output bound whatever
   the skew; unless the hypergraph is acyclic once every edge takes in the variables its
   variables determine through cardinality-one attributes (:func:`closed_under`): then
   ``delta``. TPC-H's Q21 closes a cycle of line item, order and supplier with a rule
   relating orders to suppliers; a line item determines both. Its wco stages counted the
   rule's proposals by order, which its trace (keyed by whole tuples) cannot be probed by,
   so every one-order epoch read the rule's whole result over and over: 146-258 s, and
   the driver's heap exhausted by the third, against 6.3 s as delta pipelines (a pipeline
   that starts from the rule looks line items up by order, where wco would have counted);
9. otherwise (``auto``, acyclic): ``delta``; each stage of an acyclic join has one
   extender, so counting would buy nothing.

Under ``auto``, rules 8 and 9 step down to what the attributes support: ``wco`` becomes
``delta`` when an attribute has ``support="delta"``, and either becomes ``binary`` when one
has ``support="basic"`` (the reason names the attribute). ``index="forward"`` does not
change the strategy: a lookup by value of such an attribute reads its forward index
instead of a reverse one (see ``_Conjunction.pattern``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Collection, Sequence

from factflow.errors import QueryError
from factflow.model.schema import QUERY_SUPPORT, support_allows

__all__ = ["STAR_FROM", "STRATEGIES", "ConjunctionSummary", "Strategy", "choose", "closed_under", "is_acyclic",
           "requested_strategy"]


#: The fewest bindings of a cardinality-one star that ``auto`` joins by delta pipelines.
#: Join-at-a-time arranges ``n - 2`` intermediate results of ``n`` bindings privately:
#: TPC-H's Q1 (seven line item attributes) installed in 1.5-1.9 s without its five
#: arrangements against 3.7 s, and its epochs of one order took 0.76-0.86 s against
#: 1.6-1.7 s (Q6, four attributes: installs 0.44-0.66 s against 0.98-1.22 s, epochs
#: 0.67-0.70 s against 0.80-0.86 s; ``benchmarks/tpch_updates.py``, docs/benchmarks.md).
#: Stars of two or three bindings save at most one arrangement, and delta pipelines made
#: them no faster: LDBC's two-binding star left the five queries' one-change epochs at
#: 0.179-0.184 s against 0.169-0.181 s (``benchmarks/epoch_latency.py``), and TPC-H's
#: Q4, Q18 and Q20 rules gained nothing, so they stay joined at a time.
STAR_FROM = 4


class Strategy(StrEnum):
    """A join strategy (its value is what ``Engine.query(join=...)`` takes)."""

    AUTO = "auto"
    BINARY = "binary"
    DELTA = "delta"
    WCO = "wco"


STRATEGIES = tuple(s.value for s in Strategy)


def requested_strategy(join: str) -> Strategy:
    """The strategy ``join`` names (QueryError listing the known ones otherwise)."""
    if join not in STRATEGIES:
        raise QueryError(f"unknown join strategy {join!r}; use one of {', '.join(STRATEGIES)}")
    return Strategy(join)


@dataclass(frozen=True)
class ConjunctionSummary:
    """What the strategy decision reads about one conjunction."""

    requested: Strategy
    """The strategy the query asked for."""
    edges: tuple[frozenset[str], ...]
    """The variables of each binding (inputs first, then clauses in order)."""
    cardinality_one: bool
    """Whether every binding clause is a data pattern over a cardinality-one attribute."""
    recursive: bool = False
    """Whether this is the body of a recursive rule (planned inside its fixpoint)."""
    seeded_or: str | None = None
    """The first ``or`` that reads outer bindings, as text."""
    seeded_goal: str | None = None
    """The first call of a recursive rule with an argument bound by an earlier clause, as text."""
    negations: int = 0
    """The number of ``not`` clauses."""
    sources: int = 0
    """The number of input relations (``:in`` bindings, seeds of nested clause groups)."""
    support: tuple[tuple[str, str], ...] = ()
    """``(attribute, support)`` of each data pattern binding (see ``create_attribute(support=...)``)."""
    determines: tuple[tuple[str, str], ...] = ()
    """``(entity, value)`` variables of each data pattern over a cardinality-one attribute:
    the entity's value determines the value's (a functional dependency)."""


def is_acyclic(edges: Sequence[Collection[str]]) -> bool:
    """Whether the hypergraph with these edges (sets of variables) is alpha-acyclic (GYO reduction)."""
    work = [set(e) for e in edges if e]
    changed = True
    while changed and work:
        changed = False
        counts: dict[str, int] = {}
        for e in work:
            for v in e:
                counts[v] = counts.get(v, 0) + 1
        for e in work:  # drop variables that occur in one edge only
            lonely = {v for v in e if counts[v] == 1}
            if lonely:
                e -= lonely
                changed = True
        kept: list[set[str]] = []
        for i, e in enumerate(work):  # drop empty edges and edges contained in another
            if not e or any(j != i and e <= f and (e != f or j < i) for j, f in enumerate(work)):
                changed = True
                continue
            kept.append(e)
        work = kept
    return not work


def closed_under(edges: Sequence[Collection[str]], determines: Sequence[tuple[str, str]]) -> list[set[str]]:
    """Each edge with every variable its variables determine, transitively (``determines``:
    functional dependencies ``(from, to)``). A cycle that is acyclic once its edges are so
    closed has a variable that settles the others: binding a line item binds its order and
    its supplier, so a rule relating orders to suppliers only validates what the line item's
    lookups found."""
    closed = []
    for edge in edges:
        found = set(edge)
        grown = True
        while grown:
            grown = False
            for source, target in determines:
                if source in found and target not in found:
                    found.add(target)
                    grown = True
        closed.append(found)
    return closed


def choose(summary: ConjunctionSummary) -> tuple[Strategy, str]:
    """The strategy for the conjunction ``summary`` describes, and why (the module's policy)."""
    if summary.recursive:
        return Strategy.BINARY, "body of a recursive rule"
    if summary.requested == Strategy.BINARY:
        return Strategy.BINARY, "requested"
    if summary.seeded_or is not None:
        return Strategy.BINARY, f"{summary.seeded_or} reads outer bindings"
    if summary.seeded_goal is not None:
        return Strategy.BINARY, f"goal-directed {summary.seeded_goal} is seeded by the clauses before it"
    single = len(summary.edges) <= 1
    if summary.requested != Strategy.AUTO:
        if single and not summary.negations:
            return Strategy.BINARY, "a single binding"
        unsupported = _unsupported(summary, summary.requested)
        if unsupported is not None:
            name, support = unsupported
            raise QueryError(f"join={summary.requested.value!r} cannot read attribute {name}: it was created with "
                             f"support={support!r}, which keeps no {_NEEDS[summary.requested]}; use join="
                             f"{'binary' if support == 'basic' else 'delta'!r} or 'auto', or create the attribute "
                             f"with support={summary.requested.value!r}")
        return summary.requested, "requested"
    if single:
        return Strategy.BINARY, "auto: a single binding"
    if summary.cardinality_one and not summary.sources and not summary.negations:
        if len(summary.edges) < STAR_FROM or not frozenset.intersection(*summary.edges):
            return Strategy.BINARY, "auto: every binding is a cardinality-one attribute"
        strategy, reason = Strategy.DELTA, "auto: a star of cardinality-one attributes on one variable"
    elif not is_acyclic(summary.edges):
        if is_acyclic(closed_under(summary.edges, summary.determines)):
            strategy, reason = Strategy.DELTA, "auto: cyclic join made acyclic by cardinality-one attributes"
        else:
            strategy, reason = Strategy.WCO, "auto: cyclic join"
    else:
        strategy, reason = Strategy.DELTA, "auto: acyclic join"
    weakest = max(summary.support, key=lambda item: QUERY_SUPPORT.index(item[1]), default=None)
    if weakest is not None and not support_allows(weakest[1], strategy):
        strategy = Strategy.DELTA if weakest[1] == "delta" else Strategy.BINARY
        reason = f"{reason}, stepped down: {weakest[0]} has support={weakest[1]!r}"
    return strategy, reason


_NEEDS = {Strategy.WCO: "count indexes", Strategy.DELTA: "lookups for delta pipelines"}


def _unsupported(summary: ConjunctionSummary, strategy: Strategy) -> tuple[str, str] | None:
    """The first ``(attribute, support)`` of the conjunction that ``strategy`` may not read."""
    return next(((name, support) for name, support in summary.support if not support_allows(support, strategy)),
                None)
