"""Sinks: a query's changes written to a directory with Spark's writers, atomically per epoch.

A sink directory holds one subdirectory per epoch the query's result changed in,
``epoch=N/``, written by Spark's DataFrame writer (``parquet``, ``json`` or ``csv`` with a
header) with the result's columns (named as in ``Query.frame()``) and ``diff``; ``epoch``
is the partition column, so ``spark.read.parquet(path)`` gives every column and
``spark.readStream.schema(sink_schema(path)).parquet(path)`` streams the epochs as they
come. In ``diffs`` mode an epoch's files hold its changes (the first one, the install's,
the whole result), so summing ``diff`` per row over every epoch up to N gives the result
as of N; in ``snapshot`` mode ``epoch=N/`` holds the whole result as of N (``diff`` its
multiplicity), and the two latest snapshots are kept.

**Atomic per epoch.** Spark writes into a hidden directory ``_tmp-<epoch>-<random>/``
(Spark's readers, batch and streaming, skip names starting with ``_`` or ``.``), then
each ``epoch=N`` directory it produced is renamed into place, in increasing order, and
the sink directory is fsync'd. A rename is atomic on a local (POSIX) file system, so a
reader lists an epoch whole or not at all, and the epochs present are always a prefix of
those written. (Spark's streaming file sink would also be atomic, through its
``_spark_metadata`` log, but only Spark's streaming readers honour that log, it needs a
streaming query per sink, and it writes every micro-batch into one flat directory
without epochs; a rename per epoch serves batch and streaming readers alike.) A crash
leaves at most a ``_tmp-`` directory, removed when a sink next opens the directory.

**Exactly once across restarts.** ``_sink.json`` records the format, mode and columns; a
sink opened on a directory written by another format, mode or query shape is refused
(:class:`SinkError`). The last complete epoch is the highest ``epoch=N``. When a query
is installed (again, after a restart of a durable engine) at epoch ``E`` with a sink
whose directory ends at ``L``: nothing is written if ``L == E``; otherwise the first write
is labelled ``E`` and holds the result as of ``E`` minus what the directory already sums
to (in diffs mode; the whole result in snapshot mode), so no row is written twice and
epochs missed while the engine was down are folded into ``E``. ``L > E`` (a directory
another engine wrote, or a non-durable engine restarted at 0) is refused.

**Off the delivery path.** Each sink has a writer thread: delivering an epoch only
queues its changes (a pandas frame the epoch fetched anyway, or, for an epoch with more
changes than a fetch may bring to the driver, the files Spark keeps them in: a
:class:`SparkChanges`, written from Spark without passing through the driver), so
subscribers and ``transact`` never wait for a write. The thread writes whatever is
queued in one Spark job (every epoch still its own directory), labelled ``factflow sink
QUERY epoch N``. A
failing write is logged and retried with the next epoch (or at :meth:`SinkWriter.close`),
its epochs kept meanwhile; the epoch is never rolled back. The cost is one Spark write
job per epoch the writer keeps up with, plus in snapshot mode a read of the previous
snapshot (see docs/benchmarks.md).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass
from typing import Sequence

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from factflow.arrangement.filed import HeldRows
from factflow.engine.session import label_jobs
from factflow.errors import SinkError
from factflow.model.frames import spark_frame
from factflow.model.types import Kind, spark_type
from factflow.storage.files import fsync_dir, write_atomic

__all__ = ["Sink", "SinkWriter", "SparkChanges", "sinks_of", "EPOCH", "CHANGE", "FORMATS", "MODES", "sink_schema", "last_epoch", "read_sink"]

log = logging.getLogger("factflow.sinks")

#: the column naming the epoch of a change (the partition column of a sink directory)
EPOCH = "epoch"
#: the column holding a change's signed multiplicity (in snapshots: the row's multiplicity)
CHANGE = "diff"
FORMATS = ("parquet", "json", "csv")
MODES = ("diffs", "snapshot")
_META = "_sink.json"
_TMP = "_tmp-"
_EPOCH_DIR = re.compile(rf"^{EPOCH}=(\d+)$")


@dataclass(frozen=True)
class Sink:
    """Where and how a query's changes are written: a directory ``path``, a ``format``
    (parquet, json, csv) and a ``mode`` (``diffs``: each epoch's changes; ``snapshot``:
    each epoch's whole result). See the module docs."""

    path: str
    format: str = "parquet"
    mode: str = "diffs"

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise SinkError(f"a sink needs a directory path, not {self.path!r}")
        if self.format not in FORMATS:
            raise SinkError(f"unknown sink format {self.format!r} (one of {', '.join(FORMATS)})")
        if self.mode not in MODES:
            raise SinkError(f"unknown sink mode {self.mode!r} (one of {', '.join(MODES)})")


@dataclass(frozen=True)
class SparkChanges:
    """An epoch's changes kept in Spark (``held``, whose hold the sink releases once it
    has written them), and the sink's name for each of their columns."""

    held: HeldRows
    columns: dict[str, str]

    def frame(self, spark: SparkSession) -> DataFrame:
        """The changes as a Spark DataFrame with the sink's column names."""
        return self.held.files.frame(spark).select(*[F.col(f"`{a}`").alias(b) for a, b in self.columns.items()])

    def release(self) -> None:
        """The sink is done with the changes."""
        self.held.release()


class _Written:
    """A Spark DataFrame queued as an epoch's changes (the install's result, retried)."""

    def __init__(self, frame: DataFrame):
        self._frame = frame

    def frame(self, spark: SparkSession) -> DataFrame:
        return self._frame

    def release(self) -> None:
        """Nothing to release."""


def sinks_of(sink: "Sink | Sequence[Sink]") -> list[Sink]:
    """The sinks given to ``Engine.query``: one :class:`Sink` or a sequence of them."""
    sinks = [sink] if isinstance(sink, Sink) else list(sink) if isinstance(sink, (list, tuple)) else [sink]
    for each in sinks:
        if not isinstance(each, Sink):
            raise SinkError(f"a sink must be a factflow.Sink, not {each!r}")
    return sinks


def sink_schema(path: str) -> T.StructType:
    """The schema of the rows in the sink directory ``path`` (result columns, ``diff``,
    ``epoch``), from its ``_sink.json``: what ``spark.readStream.schema(...)`` needs."""
    meta = _read_meta(path)
    if meta is None:
        raise SinkError(f"{path} is not a sink directory (it has no {_META})")
    return T.StructType.fromJson(meta["schema"])


def last_epoch(path: str) -> int | None:
    """The last complete epoch written to the sink directory ``path`` (None: none yet)."""
    epochs = _epochs(path)
    return epochs[-1] if epochs else None


def read_sink(spark: SparkSession, path: str) -> DataFrame:
    """Every complete epoch of the sink directory ``path`` as one DataFrame (Spark's reader)."""
    meta = _read_meta(path)
    if meta is None:
        raise SinkError(f"{path} is not a sink directory (it has no {_META})")
    return _reader(spark, meta["format"], T.StructType.fromJson(meta["schema"])).load(path)


class SinkWriter:
    """One query's sink: opens (and checks) its directory, writes the install's output with
    :meth:`start`, then, on its own thread, every epoch :meth:`offer` queues.

    ``columns`` are the output columns and their kinds (the names offered frames carry,
    besides ``diff``)."""

    def __init__(self, spark: SparkSession, query: str, sink: Sink, columns: Sequence[tuple[str, Kind]]):
        names = [n for n, _ in columns]
        for reserved in (EPOCH, CHANGE):
            if reserved in names:
                raise SinkError(f"query {query}: a result column named {reserved!r} would clash with the sink's own")
        self.spark = spark
        self.query = query
        self.sink = sink
        self.names = names
        self.schema = T.StructType([T.StructField(n, spark_type(k), True) for n, k in columns]
                                   + [T.StructField(CHANGE, T.LongType(), False),
                                      T.StructField(EPOCH, T.LongType(), False)])
        self.last = self._open()
        self._pending: list[tuple[int, pd.DataFrame | SparkChanges | _Written]] = []
        self._offers = 0  # epochs offered so far; a failed write is retried once this grows
        self._failed_at: int | None = None  # the offer count at the last failure
        self._writing = False
        self._stopping = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ opening
    def _open(self) -> int | None:
        path = self.sink.path
        try:
            os.makedirs(path, exist_ok=True)
            for name in os.listdir(path):
                if name.startswith(_TMP):  # a write a crash interrupted: never renamed, never read
                    shutil.rmtree(os.path.join(path, name), ignore_errors=True)
        except OSError as exc:
            raise SinkError(f"sink directory {path} cannot be used: {exc}") from exc
        wanted = {"format": self.sink.format, "mode": self.sink.mode, "schema": json.loads(self.schema.json())}
        meta = _read_meta(path)
        if meta is None:
            if _epochs(path):
                raise SinkError(f"{path} holds epoch directories but no {_META}: not a factflow sink")
            write_atomic(os.path.join(path, _META), json.dumps(wanted, indent=1).encode())
        elif meta != wanted:
            differ = ", ".join(k if k != "schema" else "columns" for k in wanted if meta.get(k) != wanted[k])
            theirs = [f.name for f in T.StructType.fromJson(meta["schema"]).fields] if "schema" in meta else None
            raise SinkError(f"query {self.query}: {path} was written by another sink (it differs in {differ}: it has "
                            f"format {meta.get('format')!r}, mode {meta.get('mode')!r}, columns {theirs})")
        return last_epoch(path)

    def start(self, epoch: int, result: DataFrame) -> None:
        """Write the install's output, ``result`` (the whole result as of ``epoch``: output
        columns and ``diff``), as the module docs say, and start the writer thread. Raises
        :class:`SinkError` when the directory already holds epochs after ``epoch``; a
        failing write is logged and retried with the next epoch."""
        if self.last is not None and self.last > epoch:
            raise SinkError(f"query {self.query}: {self.sink.path} already holds epoch {self.last}, after this "
                            f"engine's epoch {epoch} (written by another engine, or one that kept no state_dir?)")
        if self.last != epoch:
            if self.sink.mode == "diffs" and self.last is not None:
                written = read_sink(self.spark, self.sink.path).groupBy(*self.names).agg(
                    (-F.sum(CHANGE)).alias(CHANGE))
                result = _consolidate(result.unionByName(written), self.names)
            try:
                self._write(result.withColumn(EPOCH, F.lit(epoch).cast("long")), [epoch])
            except Exception:  # noqa: BLE001 - kept and retried with the next epoch
                log.exception("sink %s of query %s: writing epoch %d failed (retried with the next epoch)",
                              self.sink.path, self.query, epoch)
                self._pending.append((epoch, _Written(result)))
                self._failed_at = 0
        self._thread = threading.Thread(target=self._run, name=f"factflow sink {self.query}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the queue
    def offer(self, epoch: int, frame: pd.DataFrame | SparkChanges) -> None:
        """Queue an epoch's changes (output columns and ``diff``) for the writer thread;
        the sink releases :class:`SparkChanges` once written (or when it stops)."""
        with self._cond:
            if self._stopping:
                _release([(epoch, frame)])
                return
            if not isinstance(frame, pd.DataFrame) or len(frame):
                self._pending.append((epoch, frame))
            self._offers += 1
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued epoch is written, or a write failed (then it waits for the
        next epoch); returns whether everything queued is written."""
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and (not self._pending or self._failed()), timeout)
            return not self._pending

    def close(self) -> None:
        """Write what is queued (one more attempt after a failure), then stop the thread."""
        with self._cond:
            self._stopping = True
            self._failed_at = None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        if self._pending:
            log.error("sink %s of query %s closed with epochs %s unwritten", self.sink.path, self.query,
                      [e for e, _ in self._pending])
            _release(self._pending)
            self._pending = []

    def _failed(self) -> bool:
        return self._failed_at is not None and self._failed_at == self._offers

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or (self._pending and not self._failed()))
                if not self._pending or (self._stopping and self._failed()):
                    return
                batch, offers = list(self._pending), self._offers
                self._writing = True
            try:
                self._write_batch(batch)
                failed = None
            except Exception:  # noqa: BLE001 - a failing write is logged and retried with the next epoch
                log.exception("sink %s of query %s: writing epochs %d-%d failed (retried with the next epoch)",
                              self.sink.path, self.query, batch[0][0], batch[-1][0])
                failed = offers
            with self._cond:
                done = self.last if self.last is not None else -1
                _release([(e, f) for e, f in self._pending if e <= done])
                self._pending = [(e, f) for e, f in self._pending if e > done]
                self._failed_at = failed
                self._writing = False
                self._cond.notify_all()

    # ------------------------------------------------------------ writing
    def _write_batch(self, batch: list[tuple[int, pd.DataFrame | SparkChanges | _Written]]) -> None:
        epochs = [e for e, _ in batch]
        local = [f.assign(**{EPOCH: e}) for e, f in batch if isinstance(f, pd.DataFrame)]
        parts = [spark_frame(self.spark, pd.concat(local, ignore_index=True)[self.names + [CHANGE, EPOCH]],
                             self.schema)] if local else []
        parts += [f.frame(self.spark).select(*self.names, CHANGE).withColumn(EPOCH, F.lit(e).cast("long"))
                  for e, f in batch if not isinstance(f, pd.DataFrame)]
        changes = parts[0]
        for part in parts[1:]:
            changes = changes.unionByName(part)
        if self.sink.mode == "diffs":
            self._write(changes, epochs)
            return
        latest = epochs[-1]
        snapshot = changes.drop(EPOCH)
        if self.last is not None:
            previous = os.path.join(self.sink.path, f"{EPOCH}={self.last}")
            snapshot = snapshot.unionByName(_reader(self.spark, self.sink.format, self.schema[:-1]).load(previous))
        self._write(_consolidate(snapshot, self.names).withColumn(EPOCH, F.lit(latest).cast("long")), [latest])

    def _write(self, frame: DataFrame, epochs: list[int]) -> None:
        """Write ``frame`` (partitioned by ``epoch``) into a hidden directory, then rename each
        epoch's directory into place in order (see the module docs)."""
        path = self.sink.path
        what = f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}-{epochs[-1]}"
        sc = self.spark.sparkContext
        label_jobs(sc, f"factflow-sink-{self.query}-{epochs[-1]}", f"factflow sink {self.query} {what}")
        tmp = os.path.join(path, f"{_TMP}{epochs[0]}-{uuid.uuid4().hex[:8]}")
        writer = frame.select(*self.names, CHANGE, EPOCH).write.partitionBy(EPOCH).format(self.sink.format)
        if self.sink.format == "csv":
            writer = writer.option("header", "true")
        try:
            writer.save(tmp)
            for epoch in epochs:
                written = os.path.join(tmp, f"{EPOCH}={epoch}")
                if not os.path.isdir(written):
                    if self.sink.mode == "diffs":
                        continue  # no changes (a reinstall with nothing missed, an empty result)
                    os.makedirs(written)  # an empty snapshot is an epoch too
                os.rename(written, os.path.join(path, f"{EPOCH}={epoch}"))
                self.last = epoch
            fsync_dir(path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if self.sink.mode == "snapshot":
            for old in _epochs(path)[:-2]:
                shutil.rmtree(os.path.join(path, f"{EPOCH}={old}"), ignore_errors=True)


def _release(items: list[tuple[int, pd.DataFrame | SparkChanges | _Written]]) -> None:
    """Give up the changes kept in Spark among queued ``items``."""
    for _, item in items:
        if not isinstance(item, pd.DataFrame):
            item.release()


def _consolidate(frame: DataFrame, names: list[str]) -> DataFrame:
    """Sum ``diff`` per row, dropping rows that cancel."""
    return frame.groupBy(*names).agg(F.sum(CHANGE).alias(CHANGE)).where(F.col(CHANGE) != 0)


def _reader(spark: SparkSession, fmt: str, schema: T.StructType):
    reader = spark.read.format(fmt).schema(schema)
    return reader.option("header", "true") if fmt == "csv" else reader


def _read_meta(path: str) -> dict | None:
    try:
        with open(os.path.join(path, _META)) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SinkError(f"{os.path.join(path, _META)} cannot be read: {exc}") from exc


def _epochs(path: str) -> list[int]:
    """The complete epochs of a sink directory, ascending."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_EPOCH_DIR.match, names) if m)
