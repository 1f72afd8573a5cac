"""Facts on disk: one attribute's rows ``(e, v, _diff)`` as checksummed Parquet files or Arrow IPC.

The log and checkpoints hold the same thing, an attribute's changes or its consolidated
facts, as rows ``e`` (int64), ``v`` (the attribute's kind; instants as UTC microsecond
timestamps) and ``_diff`` (int64, the multiplicity change). Small sets travel inside log
records as Arrow IPC streams; large ones are Parquet files (zstd) written by the
driver (:func:`write_table`) or, for rows held in Spark, by one Spark task per partition
(:func:`write_frame`), and read back on the driver (:func:`read_tables`) or by Spark tasks
(:func:`read_frame`). Driver and tasks go through the same
:class:`~factflow.storage.location.Location`, so the files may be on a local disk, a
shared mount or an object store. Every file is written whole (locally under a temporary
name, fsync'd and renamed) and described by an entry ``{"name", "rows", "size", "crc32"}``
whose checksum is taken of the bytes written (the writer computes it, so verifying means
reading the file once). The caller makes the directory's names durable.
"""

from __future__ import annotations

import zlib
from functools import partial
from typing import Iterator, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from factflow import workers
from factflow.errors import CorruptStateError
from factflow.model.types import Kind, sql_type
from factflow.storage.files import verify_file
from factflow.storage.location import Location
from factflow.storage.tasks import files_frame
from factflow.text import plural

__all__ = ["facts_schema", "from_pandas", "to_ipc", "from_ipc", "write_table", "write_frame", "read_tables", "read_frame",
           "as_pandas", "as_spark_rows", "verify", "FILE_ENTRY"]

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


def write_table(table: pa.Table, location: Location, name: str) -> dict:
    """Write ``table`` as the Parquet file ``name`` of ``location`` (atomically and durably,
    see :meth:`Location.write`); returns its entry."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    data = sink.getvalue().to_pybytes()
    location.write(name, data)
    return {"name": name, "rows": table.num_rows, "size": len(data), "crc32": zlib.crc32(data)}


def verify(location: Location, name: str, size: int, crc32: int) -> None:
    """Raise :class:`CorruptStateError` naming the file unless ``name`` has ``size`` bytes
    and checksum ``crc32``."""
    if location.is_local:
        verify_file(location.file(name), size, crc32)
        return
    try:
        data = location.read(name)
    except FileNotFoundError:
        raise CorruptStateError(f"{location.file(name)} is missing") from None
    if len(data) != size:
        raise CorruptStateError(f"{location.file(name)} has {plural(len(data), 'byte')} where {size:,} were written")
    if zlib.crc32(data) != crc32:
        raise CorruptStateError(f"{location.file(name)} fails its checksum (CRC32 {zlib.crc32(data):08x}, "
                                f"written {crc32:08x})")


class _TaskWriter:
    """The task side of :func:`write_frame`: the partition's rows as one Parquet file."""

    def __init__(self, location: Location, prefix: str, kind: Kind):
        self.location = location
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
            entry = write_table(table, self.location, f"{self.prefix}part-{part:05d}.parquet")
            yield pa.RecordBatch.from_pylist([entry], schema=pa.schema(
                [("name", pa.string()), ("rows", pa.int64()), ("size", pa.int64()), ("crc32", pa.int64())]))


def write_frame(frame: DataFrame, location: Location, prefix: str, kind: Kind) -> list[dict]:
    """Write ``frame``'s rows ``e, v, _diff`` as Parquet files in ``location`` (one per
    non-empty partition, named ``<prefix>part-<n>.parquet``, written by Spark tasks through
    the same :class:`Location`; one Spark job); makes the names durable and returns the
    entries, sorted by name."""
    location.makedirs()
    written = frame.select("e", "v", DIFF).mapInArrow(_TaskWriter(location, prefix, kind), FILE_ENTRY).collect()
    location.sync()
    return sorted((r.asDict() for r in written), key=lambda entry: entry["name"])


def _read_table(location: Location, name: str) -> pa.Table:
    return pq.read_table(pa.py_buffer(location.read(name)))


def read_tables(location: Location, entries: Sequence[dict], kind: Kind) -> pa.Table:
    """The rows of the files ``entries`` of ``location``, read on the driver."""
    tables = [_read_table(location, e["name"]) for e in entries]
    if not tables:
        return facts_schema(kind).empty_table()
    return pa.concat_tables([_conform(t, kind) for t in tables])


def _read_conformed(location: Location, name: str, kind: Kind) -> pa.Table:
    """The rows of the Parquet file ``name`` as Spark reads them back (see :func:`read_frame`)."""
    return as_spark_rows(_conform(_read_table(location, name), kind))


def read_frame(spark: SparkSession, location: Location, entries: Sequence[dict], kind: Kind) -> DataFrame:
    """The rows of the files ``entries`` of ``location`` as a Spark DataFrame (typed as the
    engine's traces): a task per file reads it through the same :class:`Location`, so no
    file system connector of Spark's is needed."""
    return files_frame(spark, location, [e["name"] for e in entries], partial(_read_conformed, kind=kind),
                       f"e BIGINT, v {sql_type(kind)}, {DIFF} BIGINT")


def as_spark_rows(table: pa.Table) -> pa.Table:
    """Rows read from disk as Spark reads them back: instants as naive UTC timestamps."""
    v = table.schema.field("v").type
    if pa.types.is_timestamp(v) and v.tz is not None:
        table = table.set_column(1, "v", table.column("v").cast(pa.timestamp("us")))
    return table


def as_pandas(table: pa.Table) -> pd.DataFrame:
    """Rows read from disk as a driver frame (instants as naive UTC, as the engine's batches hold them)."""
    return as_spark_rows(table).to_pandas()
