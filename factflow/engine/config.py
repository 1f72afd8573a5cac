"""The engine's tuning knobs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    """Tuning knobs.

    ``local_limit``: change sets and merged batches of at most this many rows are held on
    the driver and shipped to Spark as local relations; larger ones are checkpointed in Spark.
    ``merge_factor``: geometric merging factor of traces. ``partitions``: partitions of
    checkpointed batches (default: ``spark.sql.shuffle.partitions``). ``small_conf``: SQL
    settings for the statements of small epochs, whose cost is Spark's fixed overhead per
    task and per compiled stage rather than data (one shuffle partition, no whole-stage
    code generation, no broadcast joins: each broadcast is a Spark job of its own); they
    apply only while such a statement is planned.
    ``recompute_fraction``: a recursive component whose delete-and-rederive overdeletes more
    than this fraction of the tuples it holds is derived again from scratch instead (see
    :meth:`factflow.dataflow.recursion.Fixpoint.run`).
    """

    local_limit: int = 20_000
    merge_factor: int = 2
    partitions: int | None = None
    small_conf: tuple[tuple[str, str], ...] = (
        ("spark.sql.shuffle.partitions", "1"),
        ("spark.sql.codegen.wholeStage", "false"),
        ("spark.sql.autoBroadcastJoinThreshold", "-1"),
    )
    recompute_fraction: float = 0.5
