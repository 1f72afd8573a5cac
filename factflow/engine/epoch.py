"""Running one epoch: a transaction in, every installed query brought up to date.

An epoch (one ``transact``) runs in three phases, each a small, fixed number of Spark jobs
whatever the number of installed queries:

1. *changes*: one job validates the transaction and computes every attribute's effective
   changes against the shared arrangements; the changes are appended to them
   (:mod:`factflow.engine.apply`).
2. *queries*: the pending state changes and outputs of every affected query are built as
   one union and fetched in one job (or, for bulk changes, checkpointed in Spark).
3. *maintenance*: traces merge their batches geometrically (amortized).

Every job runs in the job group ``factflow-<engine>-epoch-<n>`` with a description naming
its phase, so the Spark UI tells which epoch and which query ran what. If anything fails
before the epoch is committed, the changes already appended are undone: no partial epoch
is ever visible.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from factflow.arrangement.batch import DIFF
from factflow.dataflow.context import EpochContext
from factflow.dataflow.nodes import OUT
from factflow.engine import transaction
from factflow.engine.apply import apply_changes
from factflow.engine.reports import EpochReport, spark_jobs
from factflow.engine.state import EngineState
from factflow.errors import FactflowError

__all__ = ["run_epoch"]

log = logging.getLogger("factflow.engine")


def run_epoch(state: EngineState, tx: Any, group_prefix: str, epoch_log: list[EpochReport]) -> int:
    """Apply ``tx`` as the next epoch of ``state`` (jobs in the group ``<group_prefix>-<epoch>``),
    append its report to ``epoch_log`` and return the epoch. A rejected transaction changes nothing."""
    epoch = state.epoch + 1
    group = f"{group_prefix}-{epoch}"
    spark = state.spark
    sc = spark.sparkContext
    sc.setJobGroup(group, f"factflow epoch {epoch}", interruptOnCancel=False)
    started = time.perf_counter()
    phases: dict[str, float] = {}
    try:
        sc.setJobDescription(f"epoch {epoch}: transaction")
        prepared = transaction.prepare(tx, state.schema, spark, state.config.local_limit)
        changed = apply_changes(state, prepared, epoch)
        phases["changes"] = time.perf_counter() - started
        mark = time.perf_counter()
        affected = [q for q in state.queries.values()
                    if any(state.schema.get(a).id in changed for a in q.dataflow.attributes)]
        outputs = state.evaluate([q.dataflow for q in affected], EpochContext(epoch, small=prepared.small),
                                 subscribed={q.dataflow.result for q in affected if q.has_subscribers})
        phases["queries"] = time.perf_counter() - mark
    except BaseException:
        state.rollback(epoch)
        raise
    state.epoch = epoch
    state.advance(epoch)
    errors = []
    for q in affected:
        out = outputs.get(q.dataflow.result)
        if out is not None and q.has_subscribers:
            errors += q.deliver(epoch, out, OUT if OUT in out.columns else DIFF)
    mark = time.perf_counter()
    merges = state.maintain(changed, affected)
    phases["maintenance"] = time.perf_counter() - mark
    report = EpochReport(epoch, prepared.rows, sum(changed.values()), [q.name for q in affected],
                         spark_jobs(spark, group), time.perf_counter() - started, phases, merges)
    epoch_log.append(report)
    if log.isEnabledFor(logging.INFO):
        log.info(report.describe())
    if errors:
        raise FactflowError(f"epoch {epoch} was applied, but {len(errors)} subscriber(s) failed: {errors[0]!r}")
    return epoch
