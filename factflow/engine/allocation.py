"""Allocating a plan's slots when its query is installed.

A :class:`~factflow.planner.plan.Plan` holds slots (:mod:`factflow.dataflow.slots`)
where its operators will hold handles, private traces and views. An :class:`Allocation`
allocates those of one install, as of the engine's closed epoch: the slots of the query
(held by the query under its name) and of the shared rules installing it creates (held
by each rule). It records everything in the owner's :class:`~factflow.planner.holdings.Holdings`,
so that a failed install releases all of it and a closed query exactly what it holds.
Operators of shared rules installed before are bound already and left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from pyspark.sql import types as T

from factflow.arrangement.batch import DIFF, Layout
from factflow.arrangement.views import register_view
from factflow.arrangement.trace import OPERATOR_PROBE_ROWS, Trace, TraceHandle
from factflow.dataflow.slots import QUERY, HandleSlot, RowsSlot, TraceSlot
from factflow.model.frames import spark_frame
from factflow.model.types import spark_type
from factflow.planner.holdings import Holdings
from factflow.planner.plan import Plan
from factflow.planner.shared import SharedRule

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.state import EngineState

__all__ = ["Allocation"]


class Allocation:
    """The allocations of one install of query ``name`` (an :class:`~factflow.dataflow.slots.Allocator`)."""

    def __init__(self, state: "EngineState", name: str, holdings: Holdings, new_rules: list[SharedRule]):
        self._state = state
        self.name = name
        self.new_rules = list(new_rules)
        self._holders: dict[str, Holdings] = {QUERY: holdings, **{e.name: e for e in new_rules}}
        for holder in self._holders.values():
            holder.spark = state.spark

    def owns(self, owner: str) -> bool:
        """Whether this install allocates for ``owner``."""
        return owner in self._holders

    def _owner_name(self, owner: str) -> str:
        return self.name if owner == QUERY else owner

    def handle(self, slot: HandleSlot) -> TraceHandle:
        """A handle on the slot's index as of the closed epoch (the index built on first use)."""
        trace = self._state.arrangements[slot.attribute_id].index(slot.face)
        handle = trace.handle(self._state.epoch, self._owner_name(slot.owner))
        self._holders[slot.owner].handles.append(handle)
        return handle

    def trace(self, slot: TraceSlot) -> tuple[Trace, str]:
        """A new private trace named ``<owner>: <label>``, and its owner's name."""
        owner = self._owner_name(slot.owner)
        trace = Trace(self._state.spark, f"{owner}: {slot.label}", Layout(slot.columns, slot.key),
                      self._state.policy, self._state.epoch, probe_local_rows=OPERATOR_PROBE_ROWS)
        self._holders[slot.owner].traces.append((trace, slot.role))
        return trace, owner

    def view(self, slot: RowsSlot) -> str:
        """A temp view of the slot's rows, each with diff 1 (dropped when its owner is released)."""
        data = {n: [row[j] for row in slot.rows] for j, (n, _) in enumerate(slot.columns)}
        data[DIFF] = [1] * len(slot.rows)
        frame = pd.DataFrame(data, columns=[n for n, _ in slot.columns] + [DIFF])
        schema = T.StructType([T.StructField(n, spark_type(k), False) for n, k in slot.columns]
                              + [T.StructField(DIFF, T.LongType(), False)])
        name = register_view(spark_frame(self._state.spark, frame, schema), prefix="ff_s", lasting=True)
        self._holders[slot.owner].views.append(name)
        return name

    def bind(self, plan: Plan) -> None:
        """Allocate and bind the slots of ``plan``'s operators owned by this install."""
        for node in plan.operators():
            slots = node.slots()
            if slots and self.owns(slots[0].owner):
                node.bind(self)

    def release(self) -> None:
        """Release everything allocated (a failed install)."""
        for holder in self._holders.values():
            holder.release()
