"""Streaming facts in: a Structured Streaming query whose every micro-batch is one epoch, exactly once.

``db.ingest(stream, source=NAME, checkpoint=PATH)`` starts a ``foreachBatch`` query on the
streaming DataFrame ``stream`` (columns ``e``, ``a``, ``v`` and optionally ``added``, a
boolean or its text, NULL meaning an assertion; in event time ``t``; any other column is
refused by name, as a transaction's would be: a misspelt ``added`` must not turn
retractions into assertions) with
Spark's checkpoint in ``PATH``. Batch ``N`` is applied as
``db.transact(batch, source=NAME, offset=N)``: one epoch, recorded with its offset (see
:mod:`factflow.engine.offsets`), so a batch Spark replays after a restart (the same id,
the same rows) is skipped by a durable engine that applied it. Values may be typed or
text: a text ``v`` (what CSV, JSON and socket sources carry) is converted per attribute
by Spark (see :func:`factflow.engine.transaction.prepare`).

A batch the engine rejects (:class:`TransactionError`: an unknown attribute, a value that
does not convert, a conflict) changes nothing; it is written by Spark as JSON, with the
error text in a column ``error``, to ``PATH/rejected/batch-<N>/`` and logged. Then, with
``on_error="skip"`` (the default), an empty epoch records offset ``N`` so the batch is
never applied nor retried again, and the stream goes on; with ``"stop"`` the error is
raised from the batch, which stops the query with it as its exception (a restart tries
the batch again, e.g. once the missing attribute exists). Any other failure (Spark,
storage) stops the query too.

Event time (``Engine(time="event")``): the stream must have a column ``t`` holding each
fact's event time (a positive integer or a timestamp, see :mod:`factflow.engine.clock`).
Batch ``N`` is split by time: the facts of each of its times are one transaction
buffered for that time, ``db.transact(part, time=T, source=NAME, offset=N * 2**20 + i)``
(``i`` the time's rank in the batch), so a replayed batch is skipped time by time; the
times close when the application calls ``db.advance_to``. A batch with a time before
the frontier (late) or a missing time is rejected whole, before anything is buffered; a
part that the engine rejects later (a value that does not convert, a conflict with what
is buffered for its time) is rejected with the parts after it, the parts before it stay
buffered (the error names the time).

Spark jobs of a batch outside its epoch (the rejected batch's files) run in the job group
``factflow-ingest-<NAME>-<N>`` described ``factflow ingest NAME batch N``; the epoch's
own jobs run in the engine's epoch group, and the log says which epoch each batch became.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from factflow.engine.clock import event_time
from factflow.engine.session import label_jobs
from factflow.errors import IngestError, LateTransactionError, TransactionError
from factflow.text import plural

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.engine import Engine

__all__ = ["ingest", "rejected_path"]

log = logging.getLogger("factflow.ingest")

_ON_ERROR = ("skip", "stop")


def rejected_path(checkpoint: str, batch_id: int) -> str:
    """Where the rejected batch ``batch_id`` of a stream checkpointed in ``checkpoint`` is written."""
    return os.path.join(checkpoint, "rejected", f"batch-{batch_id}")


def ingest(db: "Engine", stream: DataFrame, source: str, checkpoint: str, on_error: str = "skip",
           trigger: dict[str, Any] | None = None) -> StreamingQuery:
    """Start the query applying ``stream``'s micro-batches to ``db`` (see the module
    docstring); ``trigger`` is passed to ``DataStreamWriter.trigger`` (e.g.
    ``{"availableNow": True}``, ``{"processingTime": "1 second"}``). Raises
    :class:`IngestError`, starting nothing, for a bad stream or option."""
    if not isinstance(stream, DataFrame) or not stream.isStreaming:
        raise IngestError(f"ingest needs a streaming DataFrame (spark.readStream...), got {type(stream).__name__}")
    if not isinstance(source, str) or not source:
        raise IngestError(f"ingest: source must be a non-empty string naming the stream, not {source!r}")
    if not isinstance(checkpoint, str) or not checkpoint:
        raise IngestError(f"ingest {source}: checkpoint must be a directory path, not {checkpoint!r}")
    if on_error not in _ON_ERROR:
        raise IngestError(f"ingest {source}: on_error must be one of {', '.join(_ON_ERROR)}, not {on_error!r}")
    missing = [c for c in ("e", "a", "v") if c not in stream.columns]
    if missing:
        raise IngestError(f"ingest {source}: the stream lacks {plural(len(missing), 'column')}: {', '.join(missing)} "
                          f"(it has {', '.join(stream.columns)})")
    event = db.time == "event"
    unknown = [c for c in stream.columns if c not in ("e", "a", "v", "added", "t")]
    if unknown:
        raise IngestError(f"ingest {source}: the stream has {plural(len(unknown), 'unknown column')}: "
                          f"{', '.join(map(repr, unknown))} (factflow reads e, a, v, added and, in event time, t; "
                          "select those first)")
    if event != ("t" in stream.columns):
        raise IngestError(f"ingest {source}: " + ("an engine in event time needs a column t with each fact's time"
                                                  if event else "column t (event time) needs Engine(time='event')"))
    columns = [F.col("e"), F.col("a"), F.col("v")] + ([F.col("t")] if event else [])
    if "added" in stream.columns:  # a JSON line without the field reads as NULL: an assertion
        columns.append(F.when(F.col("added").isNull(), F.lit(True)).otherwise(F.col("added")).alias("added"))
    writer = (stream.select(*columns).writeStream
              .foreachBatch(_batch_applier(db, source, checkpoint, on_error))
              .option("checkpointLocation", checkpoint)
              .queryName(f"factflow-ingest-{source}"))
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()


def _batch_applier(db: "Engine", source: str, checkpoint: str, on_error: str) -> Callable[[DataFrame, int], None]:
    """The ``foreachBatch`` function: one epoch per batch, a rejected batch written and skipped or raised."""

    def label(batch_id: int) -> None:
        label_jobs(db.spark.sparkContext, f"factflow-ingest-{source}-{batch_id}",
                   f"factflow ingest {source} batch {batch_id}")

    def apply(batch: DataFrame, batch_id: int) -> None:
        label(batch_id)
        batch = batch.persist()  # an epoch reads its transaction several times: the source once
        try:
            epoch = _apply_by_time(db, batch, source, batch_id) if db.time == "event" else \
                db.transact(batch, source=source, offset=batch_id)
        except TransactionError as exc:
            path = rejected_path(checkpoint, batch_id)
            label(batch_id)  # the epoch labelled its own jobs
            batch.withColumn("error", F.lit(str(exc))).write.mode("overwrite").json(path)
            log.warning("ingest %s: batch %d rejected (%s; written to %s): %s", source, batch_id,
                        "skipped" if on_error == "skip" else "the stream stops", path, exc)
            if on_error == "stop":
                raise
            epoch = (db.transact([], time=db.frontier, source=source, offset=batch_id * TIMES_PER_BATCH)
                     if db.time == "event" else db.transact([], source=source, offset=batch_id))  # never retried
        finally:
            batch.unpersist()
        log.info("ingest %s: batch %d is epoch %d", source, batch_id, epoch)

    return apply


#: Event time: offsets per batch, one per time in it (batch N's times get N * TIMES_PER_BATCH + rank).
TIMES_PER_BATCH = 2**20


def _apply_by_time(db: "Engine", batch: DataFrame, source: str, batch_id: int) -> int:
    """Buffer an event-time batch, one transaction per time in it; returns its latest time."""
    times = [row[0] for row in batch.select("t").distinct().orderBy("t").collect()]  # the batch's times, not facts
    if None in times:
        raise TransactionError(f"batch {batch_id} of {source}: a fact has no event time (column t is null)")
    if len(times) > TIMES_PER_BATCH:
        raise TransactionError(f"batch {batch_id} of {source}: {plural(len(times), 'distinct time')}, at most {TIMES_PER_BATCH:,}")
    if times and event_time(times[0]) < db.frontier:
        raise LateTransactionError(f"batch {batch_id} of {source} is late: time {times[0]} is before the frontier "
                                   f"{db.frontier}")
    latest = db.frontier
    for rank, at in enumerate(times):
        part = batch.where(F.col("t") == F.lit(at)).drop("t")
        latest = db.transact(part, time=at, source=source, offset=batch_id * TIMES_PER_BATCH + rank)
    return latest
