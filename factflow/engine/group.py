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

__all__ = ["plan_runs", "Touches", "touches"]


class Touches:
    """The facts a set of transactions asserts and retracts, and the cardinality-one values it gives
    (facts as ``(attribute id, entity, value)``)."""

    def __init__(self) -> None:
        self.asserted: set[tuple] = set()
        self.retracted: set[tuple] = set()
        self.one_values: dict[tuple[int, int], object] = {}

    def conflict(self, other: "Touches") -> tuple | None:
        """A fact, or an ``(attribute id, entity)`` of a cardinality-one attribute, that
        ``other`` touches in a way that does not commute with this set; None if none."""
        opposite = (self.asserted & other.retracted) | (self.retracted & other.asserted)
        if opposite:
            return min(opposite, key=repr)
        return next((key for key, value in self.one_values.items()
                     if key in other.one_values and other.one_values[key] != value), None)

    def conflicts_with(self, other: "Touches") -> bool:
        """Whether applying both together differs from applying them one after the other."""
        return self.conflict(other) is not None

    def absorb(self, other: "Touches") -> None:
        """Add what ``other`` touches."""
        self.asserted |= other.asserted
        self.retracted |= other.retracted
        self.one_values.update(other.one_values)


def touches(ops: WideOps) -> tuple[Touches, tuple | None]:
    """What one transaction touches, and where it conflicts with itself (a fact both asserted
    and retracted, or the ``(attribute id, entity)`` given two cardinality-one values), if it does."""
    touched = Touches()
    frame = ops.frame
    clash = None
    for attribute in ops.attributes:
        rows = frame[frame["a"] == attribute.id]
        values = rows[SLOT[attribute.kind]].tolist()
        facts = list(zip(rows["e"].tolist(), values))
        for (e, v), op in zip(facts, rows["op"].tolist()):
            fact = (attribute.id, e, v)
            (touched.asserted if op > 0 else touched.retracted).add(fact)
            if op > 0 and attribute.semantics == "one":
                key = (attribute.id, e)
                if touched.one_values.setdefault(key, v) != v and clash is None:
                    clash = key
    both = touched.asserted & touched.retracted
    if both:
        clash = min(both, key=repr)
    return touched, clash


def plan_runs(transactions: Sequence[WideOps]) -> list[list[int]]:
    """Positions of ``transactions`` cut, in order, into runs that can each be one epoch."""
    runs: list[list[int]] = []
    current: Touches | None = None
    for position, ops in enumerate(transactions):
        touched, clash = touches(ops)
        if clash is not None:
            runs.append([position])
            current = None
            continue
        if current is None or current.conflicts_with(touched):
            runs.append([position])
            current = touched
            continue
        runs[-1].append(position)
        current.absorb(touched)
    return runs
