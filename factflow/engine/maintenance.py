"""Maintenance after delivery: merging the batches epochs and installs appended.

Once an epoch's results are delivered (or a query installed), the traces it appended to
merge their batches (see :mod:`factflow.arrangement.trace`). Merging trailing batches that
live on the driver is cheap and happens at once, under the engine lock. What needs Spark
(merges that write a stored batch, and the index files of stored batches) runs in a
background thread, on a snapshot of the batches, and takes the engine lock only to swap
its result in. So ``transact`` returns as soon as the epoch is delivered, and merges use
the time until the next command.

By default the next epoch or install waits for that round before it starts
(``EngineConfig.overlap_merges=False``), so merges never compete with an epoch for task
slots. With ``overlap_merges=True`` a round runs beside the next epoch, and the lag is
bounded instead: one round runs at a time, and the maintenance after the next epoch
first waits for it (with writers in several threads, one that finds a round running
leaves its merges to the next call). An epoch that needs an index file a round has not
written yet writes it itself (a stored batch is indexed once, by whichever thread asks
first). On a session factflow started, the background's Spark jobs run in a scheduler
pool of their own (``factflow-maintenance``) that gives an epoch's tasks the free task
slots first. A failing merge is logged and changes nothing: the batches stay as they were
and the next round merges them. A round skips the traces of queries closed since it began
(and stops writing a closed trace's index files), so a query installed and closed at once
(a one-shot query) does not keep the next command waiting for index files nobody reads.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from factflow.arrangement.trace import StoredMerge
from factflow.engine.reports import EpochReport, spark_jobs
from factflow.engine.session import label_jobs

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.state import EngineState

__all__ = ["Maintenance", "POOL"]

log = logging.getLogger("factflow.engine")

#: the Spark scheduler pool of background merges (used when the session schedules FAIR)
POOL = "factflow-maintenance"


class Maintenance:
    """One engine's maintenance: :meth:`run` after each command that appended to traces."""

    def __init__(self, state: "EngineState", lock: threading.RLock, group_prefix: str,
                 epoch_log: list[EpochReport]):
        self._state = state
        self._lock = lock
        self._group_prefix = group_prefix
        self._epoch_log = epoch_log
        self._round: threading.Thread | None = None
        self._closing = False

    def run(self) -> None:
        """Wait for the previous background round, then merge local batches (under the engine
        lock) and start the merges that need Spark in the background. Call it without
        holding the engine lock. Its time, merges and Spark jobs go into the report of the
        latest epoch it covers (``phases["maintenance"]`` for the part under the lock,
        ``phases["background merges"]`` for the rest)."""
        self.wait()
        with self._lock:
            state = self._state
            if self._closing or not state.unmaintained or self._busy():
                return  # a round another writer started is still running: the next call merges
            epoch = state.unmaintained[-1][0]
            group = f"{self._group_prefix}-{epoch}"
            label_jobs(state.spark.sparkContext, group, f"factflow maintenance after epoch {epoch}")
            mark = time.perf_counter()
            try:
                merges, stored = state.maintain()
            except Exception:
                log.exception("merging the batches of epochs up to %d failed (the next epoch merges again)", epoch)
                merges, stored = 0, []
            report = self._report(epoch)
            if report is not None:
                report.phases["maintenance"] = time.perf_counter() - mark
                report.merges = merges
                report.maintenance_jobs = spark_jobs(state.spark, group)
            if stored:
                self._round = threading.Thread(target=self._background, args=(stored, epoch, group),
                                               name=f"{self._group_prefix}-{epoch}", daemon=True)
                self._round.start()

    def wait(self) -> None:
        """Wait until the background round (if any) is done. Not under the engine lock."""
        current = self._round
        if current is not None and current is not threading.current_thread():
            current.join()

    def _busy(self) -> bool:
        return self._round is not None and self._round.is_alive()

    def close(self) -> None:
        """Stop: a running round throws its result away (callable under the engine lock)."""
        self._closing = True
        self.wait()

    def _report(self, epoch: int) -> EpochReport | None:
        return next((r for r in reversed(self._epoch_log) if r.epoch == epoch), None)

    def _background(self, stored: list[StoredMerge], epoch: int, group: str) -> None:
        sc = self._state.spark.sparkContext
        mark = time.perf_counter()
        pending, done = list(stored), []
        try:
            label_jobs(sc, group, f"factflow maintenance after epoch {epoch} (background)")
            sc.setLocalProperty("spark.scheduler.pool", POOL)
            while pending and not self._closing:
                each = pending.pop(0)
                if each.trace.closed:  # its query was closed since: nobody would read the result
                    each.abandon()
                    continue
                try:
                    each.run()
                    done.append(each)
                except Exception:
                    log.exception("merging %s after epoch %d failed (the next round merges again)", each.trace.name,
                                  epoch)
                    each.abandon()
        finally:
            for each in pending:
                each.abandon()
            self._commit(done, epoch, group, time.perf_counter() - mark)

    def _commit(self, done: list[StoredMerge], epoch: int, group: str, seconds: float) -> None:
        """Swap the round's merges in under the engine lock (or abandon them if the engine closes)."""
        while not self._lock.acquire(timeout=0.05):
            if self._closing:
                for each in done:
                    each.abandon()
                return
        try:
            if self._closing:
                for each in done:
                    each.abandon()
                return
            merges = 0
            for each in done:
                try:
                    merges += each.commit()
                except Exception:
                    log.exception("swapping in the merges of %s failed", each.trace.name)
                    each.abandon()
            report = self._report(epoch)
            if report is not None:
                report.phases["background merges"] = seconds
                report.merges += merges
                report.maintenance_jobs = spark_jobs(self._state.spark, group)
        finally:
            self._lock.release()
