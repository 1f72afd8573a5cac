"""Group commit: which of several pending transactions may share one epoch.

A server applies the transactions that arrive while an epoch runs together, as the next
epoch (:meth:`factflow.Engine.transact_many`). Applying a group as one transaction must
give exactly what applying its members one after another would, and a member that is
rejected must not take the others down with it. Both hold when no two members touch one
fact in opposite directions, and no two give a cardinality-one attribute of one entity
different values: then the effective changes of the union equal those of the sequence.

:func:`plan_runs` cuts the transactions, in arrival order, into *runs* that satisfy
this; each run becomes one epoch. A transaction that conflicts with itself (which Spark
will reject with the exact message) runs alone, so its rejection leaves the rest intact.
"""

from __future__ import annotations

from typing import Sequence

from factflow.engine.transaction import SLOT, WideOps

__all__ = ["plan_runs"]


class _Touches:
    """The facts a set of transactions asserts and retracts, and the cardinality-one values it gives."""

    def __init__(self) -> None:
        self.asserted: set[tuple] = set()
        self.retracted: set[tuple] = set()
        self.one_values: dict[tuple[int, int], object] = {}

    def conflicts_with(self, other: "_Touches") -> bool:
        if self.asserted & other.retracted or self.retracted & other.asserted:
            return True
        return any(key in other.one_values and other.one_values[key] != value
                   for key, value in self.one_values.items())

    def absorb(self, other: "_Touches") -> None:
        self.asserted |= other.asserted
        self.retracted |= other.retracted
        self.one_values.update(other.one_values)


def _touches(ops: WideOps) -> tuple[_Touches, bool]:
    """What one transaction touches, and whether it conflicts with itself."""
    touches = _Touches()
    frame = ops.frame
    consistent = True
    for attribute in ops.attributes:
        rows = frame[frame["a"] == attribute.id]
        values = rows[SLOT[attribute.kind]].tolist()
        facts = list(zip(rows["e"].tolist(), values))
        for (e, v), op in zip(facts, rows["op"].tolist()):
            fact = (attribute.id, e, v)
            (touches.asserted if op > 0 else touches.retracted).add(fact)
            if op > 0 and attribute.semantics == "one":
                key = (attribute.id, e)
                if touches.one_values.setdefault(key, v) != v:
                    consistent = False
    if touches.asserted & touches.retracted:
        consistent = False
    return touches, consistent


def plan_runs(transactions: Sequence[WideOps]) -> list[list[int]]:
    """Positions of ``transactions`` cut, in order, into runs that can each be one epoch."""
    runs: list[list[int]] = []
    current: _Touches | None = None
    for position, ops in enumerate(transactions):
        touches, consistent = _touches(ops)
        if not consistent:
            runs.append([position])
            current = None
            continue
        if current is None or current.conflicts_with(touches):
            runs.append([position])
            current = touches
            continue
        runs[-1].append(position)
        current.absorb(touches)
    return runs
