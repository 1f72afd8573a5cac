"""Applying a transaction: its effective changes, computed and appended to the shared arrangements.

One statement (:func:`factflow.engine.transaction.effective_changes`, which documents the
semantics) validates the transaction and computes every attribute's effective changes
against the state as of the closed epoch. Rows that fail validation carry an error
message instead, and any error rejects the transaction as a whole, naming the offending
items.

In a small transaction the current state of the touched entities is probed by key from
attributes whose index holds stored batches, so the statement's work does not grow with
the attribute. A small transaction is fetched to the driver with one job and appended as local batches;
a bulk one stays in Spark: one job validates it, and each changed attribute's changes are
arranged from Spark (stored there unless they turn out small), a few attributes at once
(:data:`ARRANGING_THREADS`); a failure of any rolls the epoch back as a whole.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from factflow.arrangement import bound
from factflow.arrangement.batch import DIFF, local_relation
from factflow.arrangement.views import drop_view
from factflow.dataflow.context import EpochContext
from factflow.dataflow.lookup import probe_tagged
from factflow.engine import transaction
from factflow.engine.session import label_jobs
from factflow.errors import TransactionError
from factflow.model.schema import Attribute
from factflow.model.types import Kind

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.state import EngineState

__all__ = ["apply_changes", "current_states", "append_known", "small_statements", "ARRANGING_THREADS"]

#: Threads arranging a bulk transaction's attributes at once (each attribute is one Spark
#: job, about half of whose time is the driver planning it). Loading TPC-H lineitem at
#: SF 0.01 (17 attributes) from Parquet took 6.69 s one at a time, 6.17 s with two threads
#: and 5.92 s with four (medians of 3, one session, on this project's 2-core machine).
ARRANGING_THREADS = 4


def apply_changes(state: "EngineState", prepared: transaction.PreparedTransaction, epoch: int,
                  known: dict[int, pd.DataFrame] | None = None) -> tuple[dict[int, int], dict[int, pd.DataFrame]]:
    """Compute and append the effective changes of ``epoch``; returns the rows changed per
    attribute id, and the changes ``(e, v, _diff)`` of every changed attribute whose feed
    has subscribers (see :mod:`factflow.engine.feeds`).

    ``known`` are effective changes ``(e, v, _diff)`` per attribute id that the engine
    computed itself (introspection, on attributes the transaction does not touch): they
    are appended as they are, without a Spark job."""
    spark = state.spark
    watched: dict[int, pd.DataFrame] = {}
    tx_view, registered = prepared.relation(spark)
    cx = EpochContext(epoch, spark, small=prepared.small)
    try:
        current, probed = current_states(cx, state, prepared, tx_view, epoch - 1)
        sql = transaction.effective_changes(tx_view, prepared, current, inline_entities=bound.current() is None,
                                            probed=probed)
        changed = {} if sql is None else (
            _apply_small(state, cx, sql, prepared, epoch, watched) if prepared.small
            else _apply_bulk(state, sql, epoch, watched))
    finally:
        cx.release()
        if registered:
            drop_view(spark, registered)
    append_known(state, epoch, known, changed, watched)
    return changed, watched


def append_known(state: "EngineState", epoch: int, known: dict[int, pd.DataFrame] | None,
                 changed: dict[int, int], watched: dict[int, pd.DataFrame]) -> None:
    """Append the engine's own effective changes ``known`` (see :func:`apply_changes`) to
    ``changed`` and ``watched``, and close ``epoch`` on every attribute it did not change."""
    for aid, frame in (known or {}).items():
        state.arrangements[aid].apply_pandas(frame, epoch)
        changed[aid] = len(frame)
        if state.watched(aid):
            watched[aid] = frame
    for aid, arrangement in state.arrangements.items():
        if aid not in changed:
            arrangement.advance_upper(epoch + 1)


def current_states(cx: EpochContext, state: "EngineState", prepared: transaction.PreparedTransaction, tx_view: str,
                    as_of: int) -> tuple[dict[int, str], str | None]:
    """The forward indexes as of ``as_of`` of the attributes the transaction writes: per
    attribute id a SQL relation ``(e, v, _diff)``, and one relation in the transaction's
    wide form (``a``, ``e``, the value slots, ``_tdiff``) for the attributes not in the
    first. A bulk transaction reads every index whole. A small one reads only the rows of
    the entities it touches: selected on the driver from an index that is all local,
    looked up in the others' index files by one probe for all of them (see
    :func:`factflow.dataflow.lookup.probe_tagged`)."""
    handles = {a.id: state.tx_handles[a.id] for a in prepared.attributes}
    if not (cx.small and prepared.entities is not None):
        return {aid: handle.read(as_of) for aid, handle in handles.items()}, None
    current = {}
    for aid, handle in handles.items():
        rows = handle.local_rows(as_of, "e", prepared.entities.get(aid, []))
        if rows is not None:
            relation, view = local_relation(cx.spark, rows, handle.layout.spark_schema())
            if view is not None:
                cx.views.append(view)
            current[aid] = relation
    rest = {aid: handle for aid, handle in handles.items() if aid not in current}
    if not rest:
        return current, None
    keys = (f"(SELECT DISTINCT `a`, `e`, CAST(1 AS BIGINT) AS `{DIFF}` FROM {tx_view} "
            f"WHERE `a` IN ({', '.join(map(str, rest))}) AND `e` IS NOT NULL)")
    columns = {a.id: transaction.SLOT[a.kind] for a in prepared.attributes}
    probed, covered = probe_tagged(cx, keys, "a", "e", rest, "v", columns,
                                   [(transaction.SLOT[k], k) for k in Kind], as_of)
    current.update({aid: handle.read(as_of) for aid, handle in rest.items() if aid not in covered})
    return current, probed


_EXCLUDED_RULES = "spark.sql.optimizer.excludedRules"


@contextmanager
def small_statements(spark: SparkSession, settings: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """Plan the statements inside with the SQL ``settings`` (``EngineConfig.small_conf``),
    restored afterwards. Optimizer rules the session excludes already stay excluded."""
    conf = spark.conf
    saved = [(key, conf.get(key, None)) for key, _ in settings]
    for (key, value), (_, before) in zip(settings, saved):
        if key == _EXCLUDED_RULES and before:
            value = ",".join(dict.fromkeys([*before.split(","), *value.split(",")]))
        conf.set(key, value)
    try:
        yield
    finally:
        for key, value in saved:
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)


def _apply_small(state: "EngineState", cx: EpochContext, sql: str, prepared: transaction.PreparedTransaction,
                 epoch: int, watched: dict[int, pd.DataFrame]) -> dict[int, int]:
    spark = state.spark
    spark.sparkContext.setJobDescription(f"epoch {epoch}: effective changes")
    with small_statements(spark, state.config.small_conf):
        table = bound.run(spark, sql, cx.persist_shared)
    _raise_errors(table.filter(pc.is_valid(table.column(transaction.ERR))))
    rows = table.filter(pc.is_null(table.column(transaction.ERR)))
    changed: dict[int, int] = {}
    for attribute in prepared.attributes:
        part = rows.filter(pc.equal(rows.column("a"), pa.scalar(attribute.id, pa.int32())))
        if part.num_rows == 0:
            continue
        slot = transaction.SLOT[attribute.kind]
        frame = part.select(["e", slot, DIFF]).rename_columns(["e", "v", DIFF]).to_pandas()
        state.arrangements[attribute.id].apply_pandas(frame, epoch)
        changed[attribute.id] = len(frame)
        if state.watched(attribute.id):
            watched[attribute.id] = frame
    return changed


def _apply_bulk(state: "EngineState", sql: str, epoch: int, watched: dict[int, pd.DataFrame]) -> dict[int, int]:
    spark = state.spark
    wide = spark.sql(sql).persist()
    changed: dict[int, int] = {}
    try:
        spark.sparkContext.setJobDescription(f"epoch {epoch}: validate bulk transaction")
        summary = (wide.groupBy("a").agg(
            F.sum(F.col(transaction.ERR).isNull().cast("long")).alias("rows"),
            F.count(transaction.ERR).alias("errors"),
            F.slice(F.collect_list(transaction.ERR), 1, 5).alias("examples"),
        ).collect())
        if any(r["errors"] for r in summary):
            _raise_errors(pa.table({transaction.ERR: [m for r in summary for m in r["examples"]]}),
                          total=sum(r["errors"] for r in summary))
        attributes = [state.schema.by_id(r["a"]) for r in summary if r["rows"]]
        group = spark.sparkContext.getLocalProperty("spark.jobGroup.id") or ""

        def arrange(attribute: Attribute) -> tuple[int, pd.DataFrame | None]:
            sc = spark.sparkContext
            slot = transaction.SLOT[attribute.kind]
            delta = wide.where((F.col("a") == attribute.id) & F.col(transaction.ERR).isNull()) \
                .select("e", F.col(slot).alias("v"), DIFF)
            label_jobs(sc, group, f"epoch {epoch}: arrange {attribute.name}")
            rows = state.arrangements[attribute.id].apply_frame(delta, epoch)
            if not state.watched(attribute.id):
                return rows, None
            sc.setJobDescription(f"epoch {epoch}: changes of {attribute.name} for its subscribers")
            return rows, delta.toArrow().to_pandas()

        # A few threads overlap one attribute's planning with another's job; leaving the
        # pool waits for all of them, so the first failure is raised (and the epoch rolled
        # back) only once none is running.
        with ThreadPoolExecutor(max_workers=min(ARRANGING_THREADS, max(len(attributes), 1))) as pool:
            futures = {a.id: pool.submit(arrange, a) for a in attributes}
        for a_id, future in futures.items():
            rows, changes = future.result()
            changed[a_id] = rows
            if changes is not None:
                watched[a_id] = changes
    finally:
        wide.unpersist()
    return changed


def _raise_errors(table: pa.Table, total: int | None = None) -> None:
    """Reject the transaction with the distinct messages of ``table`` (its error column; each
    names its attribute and entity)."""
    if table.num_rows == 0:
        return
    messages = list(dict.fromkeys(table.column(transaction.ERR).to_pylist()))
    raise TransactionError(transaction.format_errors(messages, total or len(messages)))
