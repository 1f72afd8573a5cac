"""Running one epoch: a transaction in, every installed query brought up to date.

An epoch (one ``transact``) runs in three phases, each a small, fixed number of Spark jobs
whatever the number of installed queries:

1. *changes*: one job validates the transaction and computes every attribute's effective
   changes against the shared arrangements; the changes are appended to them
   (:mod:`factflow.engine.apply`).
2. *queries*: the pending state changes and outputs of every affected query are built as
   one union and fetched in one job (or, for bulk changes, checkpointed in Spark).
3. *maintenance*: traces merge their batches geometrically (amortized) and stored
   batches write their index files (:mod:`factflow.engine.maintenance`).

A small transaction that installed queries read skips the first job when it can: its
operations are appended as the effective changes they usually are, and the queries'
fetch checks that guess in the same job; a wrong guess rolls the epoch back and runs it
again as above (:mod:`factflow.engine.speculation`).

A durable engine logs the epoch's effective changes and offsets (``journal``, see
:mod:`factflow.engine.durability`): small ones while the second phase runs, by the log's
thread, large ones after it; the epoch waits for its record, then commits: the latest
closed epoch moves to it and its changes are queued for the subscribers (:mod:`factflow.engine.delivery`),
who receive them once the engine lock is released. Maintenance never delays results: it
starts after the delivery, and what of it needs Spark runs in the background while the
next epoch computes (see :mod:`factflow.engine.maintenance`), in a job group of its own.

Every job runs in the job group ``factflow-<engine>-epoch-<n>`` with a description naming
its phase, so the Spark UI tells which epoch and which query ran what. If anything fails
before the epoch is committed, the changes already appended are undone: no partial epoch
is ever visible. If the failure took the Spark driver with it (its JVM exited, or the
session was stopped), there is nothing left to undo them in: the epoch raises
:class:`ExecutionError` saying so, and the engine closes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import pandas as pd

from factflow.arrangement.batch import DIFF
from factflow.arrangement.bound import Binder, binding
from factflow.arrangement.filed import HeldRows
from factflow.dataflow.context import EpochContext
from factflow.dataflow.nodes import OUT, Stateful
from factflow.engine import transaction
from factflow.engine.apply import append_known, apply_changes
from factflow.engine.delivery import Deliveries, Notice
from factflow.engine.durability import LogWrite
from factflow.engine.reports import EpochReport, spark_jobs
from factflow.engine.speculation import Misspeculated, speculate
from factflow.engine.session import driver_alive, label_jobs
from factflow.engine.query import Query
from factflow.engine.state import EngineState
from factflow.errors import ExecutionError, FactflowError, TransactionError

__all__ = ["run_epoch"]

log = logging.getLogger("factflow.engine")


Journal = Callable[[int, dict[int, int], dict[str, int], "transaction.WideOps | None"], LogWrite]


def run_epoch(state: EngineState, tx: Any, group_prefix: str, epoch_log: list[EpochReport],
              deliveries: Deliveries, offsets: dict[str, int] | None = None, journal: Journal | None = None,
              known: dict[int, pd.DataFrame] | None = None, epoch: int | None = None) -> int:
    """Apply ``tx`` as the next epoch of ``state`` (jobs in the group ``<group_prefix>-<epoch>``),
    queue its changes on ``deliveries``, append its report to ``epoch_log`` and return the epoch.

    The epoch is ``epoch`` when given (an event time, after the latest closed epoch),
    else the one after the latest closed epoch.

    ``known`` are the engine's own effective changes of reserved attributes
    (introspection), appended with ``tx``'s (see :func:`apply_changes`); ``tx`` itself may
    not write reserved attributes. The report's ``changes`` count both.

    ``offsets`` (``{source: offset}``) are recorded with the epoch; ``journal(epoch,
    changed, offsets, guessed)``, when given, starts logging the epoch once its changes
    are appended, and the epoch commits only once that record is durable (a failure to
    write it rolls the epoch back like any other; a failure after it voids the record). A
    rejected transaction raises and changes nothing; a failure of the maintenance after
    the commit is logged instead of raised. A failure that lost the Spark driver raises
    :class:`ExecutionError` without a rollback (the caller closes the engine).
    """
    epoch = state.epoch + 1 if epoch is None else epoch
    group = f"{group_prefix}-{epoch}"
    spark = state.spark
    sc = spark.sparkContext
    label_jobs(sc, group, f"factflow epoch {epoch}")
    started = time.perf_counter()
    phases: dict[str, float] = {}
    outputs: dict[Stateful, pd.DataFrame | HeldRows] = {}
    writes: list[LogWrite] = []  # the epoch's record on its way to the log

    def write_log(changed: dict[int, int], guessed: bool) -> None:
        if journal is not None:
            mark = time.perf_counter()
            ops = transaction.WideOps(prepared.local, prepared.attributes) if guessed else None
            writes.append(journal(epoch, changed, offsets or {}, ops))
            phases["log"] = time.perf_counter() - mark

    try:
        sc.setJobDescription(f"epoch {epoch}: transaction")
        prepared = transaction.prepare(tx, state.schema, spark, state.config.local_limit)
        reserved = next((a for a in prepared.attributes if a.reserved), None)
        if reserved is not None:
            raise TransactionError(f"attribute {reserved.name} is maintained by the engine (introspection); "
                                   "transactions cannot write it")
        binder = state.binder if prepared.small else None  # small epochs reuse their plans
        counted = (binder.planned, binder.reused, binder.reanalysed) if binder is not None else (0, 0, 0)
        if binder is not None:
            binder.take_on_driver()  # what an epoch that failed left
        try:
            changed, watched, affected, outputs, kept, guessed = _compute(state, prepared, epoch, known, binder,
                                                                          phases, True, write_log)
            if guessed:
                state.guesses.right()
        except Misspeculated as exc:  # run again without the guess; its record replaces the guess's
            if writes:
                writes.pop().settle()
            state.rollback(epoch)
            changed, watched, affected, outputs, kept, _ = _compute(state, prepared, epoch, known, binder, phases,
                                                                    False, write_log)
            state.guesses.wrong(exc.attributes, epoch)  # the transaction was valid: its shape defeated the guess
        if writes:
            mark = time.perf_counter()
            sc.setJobDescription(f"epoch {epoch}: write-ahead log")
            writes[-1].wait()
            phases["log"] += time.perf_counter() - mark
    except FactflowError:
        _void(writes)
        _release_held(outputs)
        state.rollback(epoch)
        raise
    except Exception as exc:
        _void(writes)
        if not driver_alive(spark):
            raise ExecutionError(f"epoch {epoch} failed: the Spark driver is gone ({_first_line(exc)}); "
                                 "the engine is closed") from exc
        _release_held(outputs)
        state.rollback(epoch)
        raise ExecutionError(f"epoch {epoch} failed in Spark and was rolled back: {_first_line(exc)}") from exc
    except BaseException:
        _void(writes)
        _release_held(outputs)
        state.rollback(epoch)
        raise
    state.epoch = epoch
    notices = _notices(affected, outputs) + _feed_notices(state, watched)
    if offsets:
        state.offsets.record(offsets, epoch)
    state.advance(epoch)
    deliveries.put(epoch, notices)
    state.defer_maintenance(epoch, changed, affected)
    planned, reused, reanalysed = ((binder.planned - counted[0], binder.reused - counted[1],
                                    binder.reanalysed - counted[2]) if binder is not None else (0, 0, 0))
    on_driver = binder.take_on_driver() if binder is not None else []
    report = EpochReport(epoch, prepared.rows, sum(changed.values()), [q.name for q in affected],
                         spark_jobs(spark, group), time.perf_counter() - started, phases, kept_in_spark=kept,
                         statements=planned + reused, plans_reused=reused, analyses_reused=reanalysed,
                         on_driver=on_driver, time=time.time(),
                         changed=[n.source.name for n in notices if isinstance(n.source, Query)])
    epoch_log.append(report)
    if log.isEnabledFor(logging.INFO):
        log.info(report.describe())
    return epoch


def _compute(state: EngineState, prepared: transaction.PreparedTransaction, epoch: int,
             known: dict[int, pd.DataFrame] | None, binder: Binder | None, phases: dict[str, float],
             guess: bool, appended: Callable[[dict[int, int], bool], None]
             ) -> tuple[dict[int, int], dict[int, pd.DataFrame], list[Query],
                        dict[Stateful, pd.DataFrame | HeldRows], list[str], bool]:
    """The epoch's effective changes appended and its queries evaluated: the changed rows
    per attribute, the feeds' changes, the affected queries, their outputs, the traces
    kept in Spark and whether the changes were guessed (and right). ``appended(changed,
    guessed)`` is called once the changes are appended, before the queries. With
    ``guess``, the changes of a small transaction may be guessed and checked in the queries' job
    (:mod:`factflow.engine.speculation`); a wrong guess raises :class:`Misspeculated` (the
    caller rolls back and computes again without one), and so does any failure of a
    guessed epoch."""
    mark = time.perf_counter()
    cx = EpochContext(epoch, state.spark, small=prepared.small)
    with binding(binder):
        try:
            speculation = speculate(state, prepared, epoch, cx) if guess else None
        except BaseException:
            cx.release()
            raise
        if speculation is None:
            changed, watched = apply_changes(state, prepared, epoch, known)
        else:
            changed, watched = speculation.changed, speculation.watched
            append_known(state, epoch, known, changed, watched)
    phases["changes"] = time.perf_counter() - mark
    appended(changed, speculation is not None)
    mark = time.perf_counter()
    affected = [q for q in state.queries.values()
                if any(state.schema.get(a).id in changed for a in q.dataflow.attributes)]
    try:
        with binding(binder, restart=speculation is None,  # the check reads the guess's slots
                     owners=[q.dataflow for q in affected]):
            outputs, kept = state.evaluate(
                [q.dataflow for q in affected], cx,
                subscribed={n: None if q.pulls else q.dataflow.report_columns
                            for q in affected for n in q.dataflow.outputs(q.has_subscribers)},
                check=None if speculation is None else speculation.check)
    except Misspeculated as exc:
        raise Misspeculated(exc.attributes or speculation.attributes) from None
    except Exception as exc:
        if speculation is None:
            raise
        raise Misspeculated(set()) from exc
    phases["queries"] = time.perf_counter() - mark
    return changed, watched, affected, outputs, kept, speculation is not None


def _void(writes: list[LogWrite]) -> None:
    """Void the record of a failed epoch once it is written (see :class:`LogWrite`)."""
    if writes:
        writes.pop().void()


def _release_held(outputs: dict[Stateful, pd.DataFrame | HeldRows]) -> None:
    """Remove the change sets a failed epoch kept in Spark for its subscribers."""
    for out in outputs.values():
        if isinstance(out, HeldRows):
            out.release()


def _first_line(exc: BaseException) -> str:
    """The first line of an error's text (Spark's carry a JVM stack trace)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _feed_notices(state: EngineState, watched: dict[int, pd.DataFrame]) -> list[Notice]:
    """The changes of every attribute feed with subscribers."""
    notices = []
    for aid, frame in watched.items():
        feed = state.feeds[aid]
        changes = feed.changes(frame)
        if changes and feed.subscribers:
            notices.append(Notice(feed, feed.subscribers, changes))
    return notices


def _notices(affected: list[Query], outputs: dict[Stateful, pd.DataFrame | HeldRows]) -> list[Notice]:
    """The consolidated changes of every query with subscribers or sinks whose result changed
    (computed once the epoch is committed: queries with pulls update their rows on the
    driver every epoch). A change set kept in Spark goes into its notice as it is (see
    :mod:`factflow.engine.delivery`)."""
    notices = []
    for q in affected:
        if q.pulls:
            changes = q._pull_changes(outputs)
            if changes and q.subscribers:
                notices.append(Notice(q, q.subscribers, changes))
            continue
        out = outputs.get(q.dataflow.result)
        if isinstance(out, HeldRows):
            notices.append(Notice(q, q.subscribers, [], held=out))
        elif out is not None and q.has_subscribers:
            frame = q._output(out, OUT if OUT in out.columns else DIFF)
            if len(frame):
                changes = q._changes(frame, DIFF) if q.subscribers and q.window is None else []
                notices.append(Notice(q, q.subscribers, changes, frame))
    return notices
