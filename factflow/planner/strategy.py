"""Choosing a join strategy for one conjunction: the ``join="auto"`` policy.

Strategies (``Engine.query(..., join=...)``):

* ``binary``: join-at-a-time in clause order; every intermediate result that is joined
  again is arranged privately (memory grows with intermediate results, speed depends on
  the clause order).
* ``delta``: one delta pipeline per binding that can change, extended by lookups into
  shared arrangements; no private state.
* ``wco``: delta pipelines whose stages are worst-case optimal (Hector) extensions.

``auto`` decides per conjunction (a query's ``:where`` and each rule body), from its
bindings (data patterns, rule calls, inputs, unions; negations and predicates do not
count):

1. at most one binding: ``binary`` (there is nothing to join, so nothing is arranged);
2. every binding a data pattern over a cardinality-one attribute: ``binary`` (each join
   step keeps at most one value per entity, so intermediate results never outgrow the
   inputs, and join-at-a-time plans are the cheapest on Spark: thesis figure 8b);
3. the bindings form a cyclic hypergraph over their variables (for example triangles):
   ``wco``, whose extensions stay within the worst-case output bound whatever the skew;
4. otherwise (acyclic): ``delta``; each stage of an acyclic join has one extender, so
   counting would buy nothing.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["STRATEGIES", "choose", "is_acyclic"]

STRATEGIES = ("auto", "binary", "delta", "wco")


def is_acyclic(edges: Sequence[set[str]]) -> bool:
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


def choose(requested: str, edges: Sequence[set[str]], all_cardinality_one: bool) -> tuple[str, str]:
    """The strategy for a conjunction with binding variable sets ``edges``, and why."""
    if requested != "auto":
        return requested, "requested"
    if len(edges) <= 1:
        return "binary", "auto: a single binding"
    if all_cardinality_one:
        return "binary", "auto: every binding is a cardinality-one attribute"
    if not is_acyclic(edges):
        return "wco", "auto: cyclic join"
    return "delta", "auto: acyclic join"
