"""Facts on disk: one attribute's rows ``(e, v, _diff)`` as checksummed Parquet files or Arrow IPC.

The log and checkpoints hold the same thing, an attribute's changes or its consolidated
facts, as rows ``e`` (int64), ``v`` (the attribute's kind; instants as UTC microsecond
timestamps) and ``_diff`` (int64, the multiplicity change). Small sets travel inside log
records as Arrow IPC streams; large ones are Parquet files (zstd) written by the
driver (:func:`write_table`) or, for rows held in Spark, by one Spark task per partition
(:func:`write_frame`). Every file is written under a temporary name, fsync'd and renamed,
and described by an entry ``{"name", "rows", "size", "crc32"}`` whose checksum is taken
of the bytes written (the writer computes it, so verifying means reading the file once).
The caller fsyncs the directory.
"""

from __future__ import annotations

import os
import zlib
from typing import Iterator, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from factflow import workers
from factflow.model.types import Kind, spark_type
from factflow.storage.files import fsync_dir, write_atomic

__all__ = ["facts_schema", "from_pandas", "to_ipc", "from_ipc", "write_table", "write_frame", "read_tables", "read_frame",
           "as_pandas", "FILE_ENTRY"]

DIFF = "_diff"
#: the Spark schema of the rows :func:`write_frame`'s tasks report
FILE_ENTRY = "name STRING, rows BIGINT, size BIGINT, crc32 BIGINT"

_VALUE_TYPES = {
    Kind.LONG: pa.int64(),
    Kind.DOUBLE: pa.float64(),
    Kind.STRING: pa.string(),
    Kind.BOOLEAN: pa.bool_(),
    Kind.INSTANT: pa.timestamp("us", tz="UTC"),
}


def facts_schema(kind: Kind) -> pa.Schema:
    """The Arrow schema of an attribute's rows on disk."""
    return pa.schema([pa.field("e", pa.int64()), pa.field("v", _VALUE_TYPES[kind]), pa.field(DIFF, pa.int64())])


def _conform(table: pa.Table, kind: Kind) -> pa.Table:
    """``table``'s columns ``e, v, _diff`` cast to :func:`facts_schema` (naive timestamps are UTC)."""
    schema = facts_schema(kind)
    table = table.select(schema.names)
    if kind is Kind.INSTANT and table.schema.field("v").type.tz is None:
        table = table.set_column(1, "v", table.column("v").cast(pa.timestamp("us")).cast(schema.field("v").type))
    return table.cast(schema)


def from_pandas(frame: pd.DataFrame, kind: Kind) -> pa.Table:
    """Rows ``e, v, _diff`` of a driver frame (as batches hold them: naive UTC instants) as
    a table with :func:`facts_schema` (column by column: ``Table.from_pandas`` costs a
    millisecond more per small epoch and attribute)."""
    schema = facts_schema(kind)
    values = frame["v"]
    if kind is Kind.INSTANT:
        values = pd.to_datetime(values).dt.tz_localize(None) if getattr(values.dtype, "tz", None) else values
        values = values.to_numpy("datetime64[us]")
    else:
        values = values.to_numpy()
    columns = [pa.array(frame["e"].to_numpy(), pa.int64()), pa.array(values, schema.field("v").type),
               pa.array(frame[DIFF].to_numpy(), pa.int64())]
    return pa.Table.from_arrays(columns, schema=schema)


def to_ipc(table: pa.Table) -> bytes:
    """``table`` as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    """The table of an Arrow IPC stream written by :func:`to_ipc`."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def write_table(table: pa.Table, path: str) -> dict:
    """Write ``table`` as the Parquet file ``path`` (atomically, see :func:`write_atomic`); returns its entry."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    data = sink.getvalue()
    write_atomic(path, data)
    return {"name": os.path.basename(path), "rows": table.num_rows, "size": data.size, "crc32": zlib.crc32(data)}


class _TaskWriter:
    """The task side of :func:`write_frame`: the partition's rows as one Parquet file."""

    def __init__(self, directory: str, prefix: str, kind: Kind):
        self.directory = directory
        self.prefix = prefix
        self.kind = kind

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        workers.prepare()
        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        rows = [b for b in batches if b.num_rows]
        if rows:
            table = _conform(pa.Table.from_batches(rows), self.kind)
            entry = write_table(table, os.path.join(self.directory, f"{self.prefix}part-{part:05d}.parquet"))
            yield pa.RecordBatch.from_pylist([entry], schema=pa.schema(
                [("name", pa.string()), ("rows", pa.int64()), ("size", pa.int64()), ("crc32", pa.int64())]))


def write_frame(frame: DataFrame, directory: str, prefix: str, kind: Kind) -> list[dict]:
    """Write ``frame``'s rows ``e, v, _diff`` as Parquet files under ``directory`` (one
    per non-empty partition, named ``<prefix>part-<n>.parquet``, written by Spark tasks;
    one Spark job); fsyncs the directory and returns the entries, sorted by name."""
    os.makedirs(directory, exist_ok=True)
    written = frame.select("e", "v", DIFF).mapInArrow(_TaskWriter(directory, prefix, kind), FILE_ENTRY).collect()
    fsync_dir(directory)
    return sorted((r.asDict() for r in written), key=lambda entry: entry["name"])


def read_tables(directory: str, entries: Sequence[dict], kind: Kind) -> pa.Table:
    """The rows of the files ``entries`` under ``directory``, read on the driver."""
    tables = [pq.read_table(os.path.join(directory, e["name"])) for e in entries]
    if not tables:
        return facts_schema(kind).empty_table()
    return pa.concat_tables([_conform(t, kind) for t in tables])


def read_frame(spark: SparkSession, directory: str, entries: Sequence[dict], kind: Kind) -> DataFrame:
    """The rows of the files ``entries`` under ``directory`` as a Spark DataFrame (typed as the engine's traces)."""
    paths = [os.path.join(directory, e["name"]) for e in entries]
    frame = spark.read.parquet(*paths)
    return frame.select(F.col("e").cast("bigint"), F.col("v").cast(spark_type(kind)), F.col(DIFF).cast("bigint"))


def as_pandas(table: pa.Table) -> pd.DataFrame:
    """Rows read from disk as a driver frame (instants as naive UTC, as the engine's batches hold them)."""
    v = table.schema.field("v").type
    if pa.types.is_timestamp(v) and v.tz is not None:
        table = table.set_column(1, "v", table.column("v").cast(pa.timestamp("us")))
    return table.to_pandas()
