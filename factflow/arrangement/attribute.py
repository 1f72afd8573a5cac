"""The shared arrangement of one attribute: its indexes, maintained once for every query.

Every attribute has a *forward* index ``e -> v`` (a trace keyed and partitioned by entity).
The *reverse* index ``v -> e`` and the *count* indexes (``e -> number of values`` and
``v -> number of entities``, which worst-case optimal joins use to choose a proposer) are
built the first time a query needs them, from the forward index's current state, and
from then on maintained with every epoch's changes, unless the attribute's settings rule
them out (``index="forward"`` keeps no reverse index, ``support`` other than ``wco`` no
count indexes: see :meth:`factflow.model.schema.Attribute.keeps`; the planner never asks
for those). Count indexes store, per key, rows
whose diffs sum to the key's count, so they are ordinary traces too.
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from factflow.arrangement.batch import DIFF, TIME, Batch, Layout
from factflow.arrangement.trace import MergePolicy, Trace
from factflow.model.frames import consolidated
from factflow.model.schema import Attribute
from factflow.model.types import Kind

__all__ = ["AttributeArrangement", "FACES"]

FACES = ("forward", "reverse", "count_e", "count_v")


class AttributeArrangement:
    """Forward, reverse and count indexes of one attribute."""

    def __init__(self, spark: SparkSession, attribute: Attribute, policy: MergePolicy, upper: int):
        self.spark = spark
        self.attribute = attribute
        self.policy = policy
        value = ("v", attribute.kind)
        entity = ("e", Kind.LONG)
        self._layouts = {
            "forward": Layout((entity, value), ("e",)),
            "reverse": Layout((entity, value), ("v",)),
            "count_e": Layout((entity,), ("e",)),
            "count_v": Layout((value,), ("v",)),
        }
        self.traces: dict[str, Trace] = {"forward": self._new_trace("forward", upper)}

    @property
    def forward(self) -> Trace:
        """The entity -> value index (always present)."""
        return self.traces["forward"]

    def index(self, face: str) -> Trace:
        """The trace of ``face``, building it from the forward index on first use (QueryError
        for a face the attribute's settings do not keep)."""
        if face not in self.traces:
            self.attribute.require(face)
            self.traces[face] = self._build(face)
        return self.traces[face]

    def apply_pandas(self, delta: pd.DataFrame, epoch: int) -> None:
        """Add one epoch's consolidated changes ``(e, v, _diff)`` held on the driver."""
        delta = delta.assign(**{TIME: epoch})
        for face, trace in self.traces.items():
            trace.append_pandas(self._face_rows_pandas(face, delta), epoch)

    def apply_frame(self, delta: DataFrame, epoch: int) -> int:
        """Add one epoch's consolidated changes held in Spark; returns the number of changes."""
        rows = 0
        for face, trace in self.traces.items():
            batch = trace.append_frame(self._face_rows_frame(face, delta), epoch)
            if face == "forward":
                rows = batch.rows
        return rows

    def load(self, facts: pd.DataFrame | DataFrame, epoch: int) -> None:
        """Start the (empty) arrangement from its facts as of ``epoch``, rows ``(e, v, _diff)``
        with each fact once (recovery): one batch ``[0, epoch + 1)`` whose rows carry time
        ``epoch``, on the driver for a pandas frame, stored in Spark (or moved to the driver
        when small) for a Spark one. The other indexes are built from it when first needed."""
        if len(self.traces) != 1 or self.forward.batches:
            raise ValueError(f"{self.attribute.name}: only a new arrangement can be loaded")
        trace = self.forward
        if isinstance(facts, pd.DataFrame):
            batch = Batch.from_pandas(self.spark, trace.layout, facts.assign(**{TIME: epoch}), 0, epoch + 1)
        else:
            timed = facts.selectExpr("`e`", "`v`", f"CAST({epoch} AS BIGINT) AS `{TIME}`", f"`{DIFF}`")
            batch = trace.materialize(timed, 0, epoch + 1)
        trace.load(batch)

    def advance_upper(self, upper: int) -> None:
        """Record an epoch in which this attribute did not change."""
        for trace in self.traces.values():
            trace.advance_upper(upper)

    def truncate(self, epoch: int) -> None:
        """Forget the changes of ``epoch`` and later (undo of a failed epoch)."""
        for trace in self.traces.values():
            trace.truncate(epoch)

    @property
    def tuples(self) -> int:
        """Rows held across all of this attribute's indexes."""
        return sum(t.tuples for t in self.traces.values())

    def close(self) -> None:
        """Release every index."""
        for trace in self.traces.values():
            trace.close()
        self.traces = {}

    # ------------------------------------------------------------ internals
    def _new_trace(self, face: str, upper: int) -> Trace:
        return Trace(self.spark, f"{self.attribute.name} {face}", self._layouts[face], self.policy, upper)

    def _build(self, face: str) -> Trace:
        forward = self.forward
        trace = self._new_trace(face, forward.upper)
        as_of = forward.upper - 1
        if forward.batches:
            full = self.spark.sql(f"SELECT `e`, `v`, {as_of}L AS `{TIME}`, `{DIFF}` FROM {forward.read(as_of)}")
            rows = self._face_rows_frame(face, full)
            layout = self._layouts[face]
            summed = (trace.by_key(rows).groupBy(*layout.names, TIME).agg(F.sum(DIFF).alias(DIFF))
                      .where(F.col(DIFF) != 0).select(*layout.all_names))
            self.spark.sparkContext.setJobDescription(f"build {trace.name}")
            batch = trace.materialize(summed, 0, forward.upper, by_key=True)
            if batch.rows:
                trace.batches.append(batch)
                if self.policy.directory is not None:
                    trace.index_stored()
        trace.since = max(forward.since, as_of)
        return trace

    def _face_rows_pandas(self, face: str, delta: pd.DataFrame) -> pd.DataFrame:
        if face in ("forward", "reverse"):
            return delta
        key = "e" if face == "count_e" else "v"
        return consolidated(delta, [key, TIME], DIFF)

    def _face_rows_frame(self, face: str, delta: DataFrame) -> DataFrame:
        if face in ("forward", "reverse"):
            return delta.select("e", "v", *( [TIME] if TIME in delta.columns else []), DIFF)
        key = "e" if face == "count_e" else "v"
        group = [key] + ([TIME] if TIME in delta.columns else [])
        return delta.groupBy(*group).agg(F.sum(DIFF).alias(DIFF)).where(F.col(DIFF) != 0)
