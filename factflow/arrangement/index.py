"""Sorted index files of stored batches, and key probes that run inside Spark tasks.

A batch held in Spark (a *stored* batch, see :mod:`.batch`) is scanned whole by a SQL
join, however few keys an epoch asks for. So every stored batch is also written as an
*index*: per Spark partition one Arrow IPC file whose rows are sorted by ``_h``, Spark's
64-bit ``xxhash64`` of the trace's key columns. Reading the rows of K keys is then a
binary search per key in each file (``numpy.searchsorted`` over the memory-mapped hash
column) followed by a gather of the matching rows: work that grows with K and with the
logarithm of the batch, never with its size.

Probes run inside Spark tasks, as a ``mapInArrow`` over the probing relation (the
*prefix*: the rows that need their keys looked up, carrying ``_ph``, the same hash of
their key columns computed by Spark so both sides hash identically). A probe reads every
index file of the trace's stored batches and the trace's small batches, shipped with the
probe as Arrow tables; keeps the updates at or before the epoch read; optionally
consolidates them to the set they describe; and joins them to the prefix by Arrow's hash
join. Its output is the prefix's columns, the trace's requested value columns and
``_tdiff``, the trace rows' diffs, so the SQL around it multiplies or sums as it needs.

Files are written once and never changed; a worker process keeps the files it opened
memory-mapped (bounded, least recently used first), so the operating system's page
cache, not each worker, holds them. Why this form: a SQL join against a stored batch
reads all of it (the two-hop query over the Facebook graph read 3.2 million result rows
to update a few thousand), Parquet's row-group statistics prune only by ranges of a
literal filter, and a Spark-side sort of the probe keys would cost a shuffle per lookup.
Sorted immutable files are also what a checkpoint writes and what executors of a cluster
can read from shared storage.
"""

from __future__ import annotations

import os
import shutil
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from factflow import workers
from factflow.model.types import Kind, spark_type

__all__ = ["KEY_HASH", "PROBE_HASH", "TRACE_DIFF", "hash_sql", "write_index", "remove_index", "Probe",
           "arrow_type", "arrow_schema"]

KEY_HASH = "_h"
PROBE_HASH = "_ph"
TRACE_DIFF = "_tdiff"
_TIME, _DIFF = "_t", "_diff"
_OPEN_LIMIT = 256

_ARROW_TYPES = {
    Kind.LONG: pa.int64(),
    Kind.DOUBLE: pa.float64(),
    Kind.STRING: pa.string(),
    Kind.BOOLEAN: pa.bool_(),
    Kind.INSTANT: pa.timestamp("us"),
}


def arrow_type(kind: Kind) -> pa.DataType:
    """The Arrow type Spark uses for values of ``kind``."""
    return _ARROW_TYPES[kind]


def arrow_schema(columns: Sequence[tuple[str, Kind]]) -> pa.Schema:
    """An Arrow schema (nullable fields) for ``columns``."""
    return pa.schema([pa.field(name, arrow_type(kind)) for name, kind in columns])


def hash_sql(columns: Sequence[str]) -> str:
    """SQL of the 64-bit key hash of ``columns`` (identical for equal values of equal kinds)."""
    return "xxhash64(" + ", ".join("`" + c.replace("`", "``") + "`" for c in columns) + ")"


# ------------------------------------------------------------------ writing

def write_index(frame: DataFrame, key: Sequence[str], directory: str) -> tuple[list[str], int]:
    """Write ``frame`` (a stored batch) as sorted index files under ``directory``, one Spark
    job; returns the paths of the files written (partitions without rows write none) and
    the rows they hold.

    Each task sorts its rows by ``_h`` itself (numpy): a Spark sort before the hand-over
    to Python cost more than the rest of the job's work on a partition."""
    os.makedirs(directory, exist_ok=True)
    hashed = frame.selectExpr("*", f"{hash_sql(key)} AS `{KEY_HASH}`")
    written = hashed.mapInArrow(_IndexWriter(directory), "path STRING, rows BIGINT").collect()
    return sorted(r["path"] for r in written if r["rows"]), sum(r["rows"] for r in written)


class _IndexWriter:
    """The task side of :func:`write_index`: one file per partition, sorted by ``_h``,
    written then renamed."""

    def __init__(self, directory: str):
        self.directory = directory

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        workers.prepare()
        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        path = os.path.join(self.directory, f"part-{part:05d}.arrow")
        rows = [b for b in batches if b.num_rows]
        if rows:
            # one record batch per file: its hash column then maps to numpy without a copy
            table = pa.Table.from_batches(rows).combine_chunks()
            table = table.take(pa.array(np.argsort(table.column(KEY_HASH).to_numpy(), kind="stable")))
            with pa.ipc.new_file(path + ".tmp", table.schema) as writer:
                writer.write_table(table, max_chunksize=max(table.num_rows, 1))
            os.replace(path + ".tmp", path)
        yield pa.RecordBatch.from_pydict({"path": [path], "rows": [sum(b.num_rows for b in rows)]},
                                         schema=pa.schema([("path", pa.string()), ("rows", pa.int64())]))


def remove_index(directory: str) -> None:
    """Delete an index directory written by :func:`write_index`."""
    shutil.rmtree(directory, ignore_errors=True)


# ------------------------------------------------------------------ probing

_opened: "OrderedDict[str, tuple[pa.Table, np.ndarray]]" = OrderedDict()


def _open(path: str) -> tuple[pa.Table, np.ndarray]:
    """An index file memory-mapped, with its hash column as a numpy array (cached per process)."""
    found = _opened.get(path)
    if found is not None:
        _opened.move_to_end(path)
        return found
    table = pa.ipc.open_file(pa.memory_map(path)).read_all()
    hashes = table.column(KEY_HASH).to_numpy()  # one chunk without nulls: no copy
    _opened[path] = (table, hashes)
    while len(_opened) > _OPEN_LIMIT:
        _opened.popitem(last=False)
    return table, hashes


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenation of ``range(s, s + n)`` for every pair, vectorized."""
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total, dtype=np.int64) - offsets + np.repeat(starts, counts)


@dataclass
class Probe:
    """One lookup of a prefix's keys in a trace, as of an epoch (see the module docs).

    ``hash_on`` pairs each key column of the trace with the prefix column that carries it
    (the prefix's ``_ph`` hashes those, in this order); ``join_on`` pairs every column the
    rows must agree on (the key and possibly more). ``values`` names the trace's other
    columns to output and their output names. ``how``: ``inner`` (prefix rows times
    matching trace rows), ``left`` (prefix rows without a match are kept, ``_tdiff`` 0) or
    ``semi`` (the matching trace rows themselves, each once, under their output names).
    ``present`` consolidates the trace rows to the set they describe (each present row
    once, ``_tdiff`` 1) before joining.
    """

    paths: list[str]
    local: list[pa.Table]
    trace_schema: pa.Schema
    prefix_columns: list[tuple[str, Kind]]
    hash_on: list[tuple[str, str]]
    join_on: list[tuple[str, str]]
    values: list[tuple[str, str]]
    as_of: int
    how: str = "inner"
    present: bool = False
    output: list[tuple[str, Kind]] = field(default_factory=list)

    def __post_init__(self) -> None:
        kinds = dict(self.prefix_columns)
        trace_kinds = {f.name: f.type for f in self.trace_schema}
        if self.how == "semi":
            self.output = ([(p, kinds[p]) for p, _ in self.join_on]
                           + [(out, _kind_of_arrow(trace_kinds[t])) for t, out in self.values]
                           + [(TRACE_DIFF, Kind.LONG)])
        else:
            self.output = (list(self.prefix_columns)
                           + [(out, _kind_of_arrow(trace_kinds[t])) for t, out in self.values]
                           + [(TRACE_DIFF, Kind.LONG)])

    def spark_schema(self) -> T.StructType:
        """The schema of the probe's output rows."""
        return T.StructType([T.StructField(n, spark_type(k), True) for n, k in self.output])

    def run(self, prefix: DataFrame) -> DataFrame:
        """The probe as a lazy Spark DataFrame over ``prefix`` (which carries ``_ph``)."""
        return prefix.mapInArrow(self, self.spark_schema())

    # -------------------------------------------------------------- task side
    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Probe every batch of prefix rows (runs inside a Spark task)."""
        workers.prepare()
        target = arrow_schema(self.output)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            out = self._probe(pa.Table.from_batches([batch]))
            for piece in out.cast(target).to_batches():
                yield piece

    def _candidates(self, hashes: np.ndarray) -> pa.Table:
        """Trace rows whose key hash is among ``hashes`` (local batches: all their rows)."""
        wanted = np.unique(hashes)
        parts = []
        for path in self.paths:
            table, sorted_hashes = _open(path)
            lo = np.searchsorted(sorted_hashes, wanted, side="left")
            hi = np.searchsorted(sorted_hashes, wanted, side="right")
            counts = hi - lo
            hit = counts > 0
            if hit.any():
                parts.append(table.take(pa.array(_ranges(lo[hit], counts[hit]))).select(self.trace_schema.names))
        parts += [t.select(self.trace_schema.names) for t in self.local]
        if not parts:
            return self.trace_schema.empty_table()
        return pa.concat_tables([p.cast(self.trace_schema) for p in parts])

    def _probe(self, prefix: pa.Table) -> pa.Table:
        rows = self._candidates(prefix.column(PROBE_HASH).to_numpy())
        rows = rows.filter(pc.less_equal(rows.column(_TIME), self.as_of))
        data = [n for n in self.trace_schema.names if n not in (_TIME, _DIFF)]
        if self.present:
            summed = rows.group_by(data).aggregate([(_DIFF, "sum")])
            summed = summed.filter(pc.greater(summed.column(f"{_DIFF}_sum"), 0))
            rows = summed.select(data).append_column(_DIFF, pa.array(np.ones(summed.num_rows, dtype=np.int64)))
        renames = {t: p for p, t in self.join_on}
        renames.update({t: out for t, out in self.values})
        keep = [t for t in data if t in renames]
        rows = rows.select(keep + [_DIFF]).rename_columns([renames[t] for t in keep] + [TRACE_DIFF])
        keys = [p for p, _ in self.join_on]
        for name in keys:  # make the key types of both sides equal for the hash join
            rows = rows.set_column(rows.schema.get_field_index(name), name,
                                   rows.column(name).cast(prefix.schema.field(name).type))
        if self.how == "semi":
            distinct_keys = prefix.select(keys).group_by(keys).aggregate([])
            return rows.join(distinct_keys, keys=keys, join_type="left semi")
        joined = prefix.drop_columns([PROBE_HASH]).join(rows, keys=keys,
                                                       join_type="inner" if self.how == "inner" else "left outer")
        if self.how == "left":
            joined = joined.set_column(joined.schema.get_field_index(TRACE_DIFF), TRACE_DIFF,
                                       pc.fill_null(joined.column(TRACE_DIFF), 0))
        return joined.select([n for n, _ in self.output])


def _kind_of_arrow(t: pa.DataType) -> Kind:
    for kind, arrow in _ARROW_TYPES.items():
        if t == arrow or (kind is Kind.STRING and pa.types.is_large_string(t)) or (
                kind is Kind.INSTANT and pa.types.is_timestamp(t)):
            return kind
    raise TypeError(f"no factflow kind for Arrow type {t}")
