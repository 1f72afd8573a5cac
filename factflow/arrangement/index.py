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
their key columns computed by Spark so both sides hash identically, and ``_pp``, Spark's
Murmur3 hash of them). A stored batch is hash-partitioned by its key, each file holding one
partition: where its name says so (``part-<p>-of-<n>.arrow``, checked by the task that
wrote it), a probe opens only the files of the partitions ``pmod(_pp, n)`` its keys fall
in, not every file of every batch; that matters most when the files are in an object
store and each first open on an executor is a fetch (:mod:`factflow.storage.cache`). A
probe reads those index files of the trace's stored batches and the trace's small
batches, shipped with the probe as Arrow tables; keeps the updates at or before the epoch read; optionally
consolidates them to the set they describe; and joins them to the prefix by Arrow's hash
join. Its output is the prefix's columns, the trace's requested value columns and
``_tdiff``, the trace rows' diffs, so the SQL around it multiplies or sums as it needs.
Probes that follow one another in a pipeline run as one :class:`ProbeChain`, in one
worker: the rows between them stay in Python, hashed there as Spark hashes them
(:func:`long_hash` and :func:`long_partition_hash`, for LONG keys).

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

import dataclasses
import pickle
import re
from collections import OrderedDict
from functools import partial
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from factflow import workers
from factflow.model.types import Kind, ident, spark_type
from factflow.storage.cache import local_file
from factflow.storage.location import Location
from factflow.storage.tasks import files_frame

__all__ = ["KEY_HASH", "PROBE_HASH", "PROBE_PART", "TRACE_DIFF", "hash_sql", "partition_hash_sql", "long_hash",
           "long_partition_hash", "write_index", "read_index",
           "read_index_locally", "remove_index",
           "Probe",
           "ProbeChain", "TaggedProbes", "ParameterizedProbes", "PROBE_PARAMETERS",
           "arrow_type", "arrow_schema"]

KEY_HASH = "_h"
PROBE_HASH = "_ph"
PROBE_PART = "_pp"
TRACE_DIFF = "_tdiff"
#: the column of a :class:`ParameterizedProbes`' input whose one non-NULL value is its parameters
PROBE_PARAMETERS = "_pparameters"
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
    return "xxhash64(" + ", ".join(ident(c) for c in columns) + ")"


def partition_hash_sql(columns: Sequence[str]) -> str:
    """SQL of the hash Spark partitions rows by ``columns`` with (its Murmur3 ``hash``, seed
    42: a row of a hash-partitioned frame is in partition ``pmod(hash, n)``)."""
    return "hash(" + ", ".join(ident(c) for c in columns) + ")"


# ------------------------------------------------------------------ writing

def write_index(frame: DataFrame, key: Sequence[str], directory: Location) -> tuple[list[str], int]:
    """Write ``frame`` (a stored batch) as sorted index files in ``directory``, one Spark
    job; returns the names of the files written (partitions without rows write none) and
    the rows they hold.

    Each task sorts its rows by ``_h`` itself (numpy): a Spark sort before the hand-over
    to Python cost more than the rest of the job's work on a partition. A file whose rows
    all lie in the hash partition of the key that the task's partition number says (the
    frame is hash-partitioned by the key, as stored batches are) is named
    ``part-<p>-of-<n>.arrow``: a probe of that batch then opens only the files its keys can
    be in (see :meth:`Probe._candidates`). Otherwise it is ``part-<p>.arrow``."""
    directory.makedirs()
    # a plan Spark's optimizer proved empty has no partitions (and the hash needs a modulus)
    partitions = max(frame._jdf.queryExecution().executedPlan().outputPartitioning().numPartitions(), 1)
    hashed = frame.selectExpr("*", f"{hash_sql(key)} AS `{KEY_HASH}`",
                              f"pmod({partition_hash_sql(key)}, {partitions}) AS `{PROBE_PART}`")
    written = hashed.mapInArrow(_IndexWriter(directory, partitions), "name STRING, rows BIGINT").collect()
    return sorted(r["name"] for r in written if r["rows"]), sum(r["rows"] for r in written)


class _IndexWriter:
    """The task side of :func:`write_index`: one file per partition, sorted by ``_h``,
    written whole through the directory's :class:`Location`."""

    def __init__(self, directory: Location, partitions: int):
        self.directory = directory
        self.partitions = partitions

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        workers.prepare()
        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        name = f"part-{part:05d}.arrow"
        rows = [b for b in batches if b.num_rows]
        if rows:
            # one record batch per file: its hash column then maps to numpy without a copy
            table = pa.Table.from_batches(rows).combine_chunks()
            if pc.all(pc.equal(table.column(PROBE_PART), part)).as_py():
                name = f"part-{part:05d}-of-{self.partitions:05d}.arrow"
            table = table.drop_columns([PROBE_PART])
            table = table.take(pa.array(np.argsort(table.column(KEY_HASH).to_numpy(), kind="stable")))
            with self.directory.open_output(name) as stream, pa.ipc.new_file(stream, table.schema) as writer:
                writer.write_table(table, max_chunksize=max(table.num_rows, 1))
        yield pa.RecordBatch.from_pydict({"name": [name], "rows": [sum(b.num_rows for b in rows)]},
                                         schema=pa.schema([("name", pa.string()), ("rows", pa.int64())]))


def read_index_locally(directory: Location, names: Sequence[str], columns: Sequence[str],
                       cache_bytes: int = 4 << 30) -> pa.Table:
    """The ``columns`` of the index files ``names`` of ``directory``, read on the driver."""
    return pa.concat_tables([_columns_of(directory, name, list(columns), cache_bytes) for name in names])


def read_index(spark, directory: Location, names: Sequence[str], schema: T.StructType,
               cache_bytes: int = 4 << 30) -> DataFrame:
    """The rows of the index files ``names`` of ``directory`` as a Spark DataFrame with
    ``schema`` (their columns without ``_h``): one partition per file, read inside the
    task through the same :class:`Location` (remote files from the executor's copy, see
    :mod:`factflow.storage.cache`). Its plan is a scan of a range and a Python function,
    however many epochs made the files, and nothing of it lives only in an executor:
    a task that fails, or whose executor is lost, reads the files again."""
    nullable = T.StructType([T.StructField(f.name, f.dataType, True) for f in schema.fields])
    return files_frame(spark, directory, names, partial(_columns_of, columns=schema.fieldNames(),
                                                        cache_bytes=cache_bytes), nullable)


def _columns_of(directory: Location, name: str, columns: list[str], cache_bytes: int) -> pa.Table:
    """The ``columns`` of the index file ``name`` (memory-mapped, see :func:`_open`)."""
    return _open(directory, name, cache_bytes)[0].select(columns)


def remove_index(directory: Location) -> None:
    """Delete an index directory written by :func:`write_index`."""
    directory.remove_tree()


# ------------------------------------------------------------------ probing

_opened: "OrderedDict[str, tuple[pa.Table, np.ndarray]]" = OrderedDict()


def _open(directory: Location, name: str, cache_bytes: int) -> tuple[pa.Table, np.ndarray]:
    """An index file memory-mapped (a remote one from this executor's copy, see
    :mod:`factflow.storage.cache`), with its hash column as a numpy array (cached per process)."""
    path = directory.file(name)
    found = _opened.get(path)
    if found is not None:
        _opened.move_to_end(path)
        return found
    table = pa.ipc.open_file(pa.memory_map(local_file(directory, name, cache_bytes))).read_all()
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

    files: list[tuple[Location, str]]
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
    cache_bytes: int = 4 << 30

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

    def parameters(self) -> tuple:
        """What changes from epoch to epoch: the index files and local batches read, the epoch."""
        return self.files, self.local, self.as_of

    def stripped(self) -> "Probe":
        """This probe without its :meth:`parameters`: what stays the same from epoch to epoch."""
        return dataclasses.replace(self, files=[], local=[], as_of=0)

    def given(self, parameters: tuple) -> "Probe":
        """This (stripped) probe with ``parameters`` (as :meth:`parameters` gave them)."""
        files, local, as_of = parameters
        return dataclasses.replace(self, files=files, local=local, as_of=as_of)

    def hashes_in_task(self) -> bool:
        """Whether a task can compute this probe's ``_ph`` itself (:func:`long_hash`): every
        key column is a LONG, so the probe can follow another in a :class:`ProbeChain`."""
        kinds = dict(self.prefix_columns)
        return all(kinds[p] is Kind.LONG for p, _ in self.hash_on)

    # -------------------------------------------------------------- task side
    def _prefix_after(self, product: pa.Table) -> pa.Table:
        """This probe's prefix from the output of the probe before it in a chain: that
        output's rows with their diff multiplied by the trace rows' (``_diff * _tdiff``,
        the product SQL takes of a lone probe) and ``_ph`` computed here."""
        diff = pc.multiply(product.column(_DIFF), product.column(TRACE_DIFF))
        columns = [diff if name == _DIFF else product.column(name) for name, _ in self.prefix_columns]
        keys = [product.column(p) for p, _ in self.hash_on]
        return pa.Table.from_arrays(columns + [pa.array(long_hash(keys)), pa.array(long_partition_hash(keys))],
                                    [n for n, _ in self.prefix_columns] + [PROBE_HASH, PROBE_PART])

    def _candidates(self, prefix: pa.Table) -> pa.Table:
        """Trace rows whose key hash is among the prefix's (local batches: all their rows),
        opening of a batch whose files are named by hash partition only those its keys can
        be in (see :func:`write_index`)."""
        hashes = prefix.column(PROBE_HASH).to_numpy()
        partition_hashes = prefix.column(PROBE_PART).to_numpy()
        parts = []
        for directory, name, wanted in self._files_to_open(hashes, partition_hashes):
            table, sorted_hashes = _open(directory, name, self.cache_bytes)
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

    def _files_to_open(self, hashes: np.ndarray,
                       partition_hashes: np.ndarray) -> Iterator[tuple[Location, str, np.ndarray]]:
        """Each index file to search, with the sorted distinct key hashes to search it for."""
        by_directory: dict[Location, list[str]] = {}
        for directory, name in self.files:
            by_directory.setdefault(directory, []).append(name)
        everything = np.unique(hashes)
        for directory, names in by_directory.items():
            routed = [_ROUTED.fullmatch(name) for name in names]
            counts = {int(m.group(2)) for m in routed if m}
            if not all(routed) or len(counts) != 1:
                yield from ((directory, name, everything) for name in names)
                continue
            partition = np.mod(partition_hashes.astype(np.int64), counts.pop())
            for name, match in zip(names, routed):
                mine = partition == int(match.group(1))
                if mine.any():
                    yield directory, name, np.unique(hashes[mine])

    def _probe(self, prefix: pa.Table) -> pa.Table:
        rows = self._candidates(prefix)
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
            # (in the output's column order: the trace's may differ, as in a reverse index)
            return rows.join(distinct_keys, keys=keys, join_type="left semi").select([n for n, _ in self.output])
        joined = prefix.drop_columns([PROBE_HASH, PROBE_PART]).join(rows, keys=keys,
                                                       join_type="inner" if self.how == "inner" else "left outer")
        if self.how == "left":
            joined = joined.set_column(joined.schema.get_field_index(TRACE_DIFF), TRACE_DIFF,
                                       pc.fill_null(joined.column(TRACE_DIFF), 0))
        return joined.select([n for n, _ in self.output])


@dataclass
class ProbeChain:
    """Probes that run one after another in the same Spark task (one ``mapInArrow``).

    The first probe reads the prefix Spark hands over; every later one reads the output of
    the one before times its trace diffs (see :meth:`Probe._prefix_after`), hashing the keys
    itself, so that rows between probes never go back to the JVM. In a delta pipeline a
    lookup is often followed by a validation whose input is many times the change (the
    heaviest triangle epoch over oregon1 looks up 6.3 million paths for 4,093 changed edges
    and keeps a few thousand): chained, those rows are neither converted to Spark rows and
    back nor projected and hashed by Spark. A probe's output goes on to the next probe in
    slices of at most ``slice_rows`` rows, so the probes after the first work on a bounded
    number of rows at a time.
    """

    probes: list[Probe]
    slice_rows: int = 1 << 20

    def spark_schema(self) -> T.StructType:
        """The schema of the chain's output rows (its last probe's)."""
        return self.probes[-1].spark_schema()

    def then(self, probe: Probe) -> "ProbeChain":
        """This chain followed by ``probe``."""
        return ProbeChain(self.probes + [probe], self.slice_rows)

    def listed(self) -> list[Probe]:
        """The probes, in order."""
        return list(self.probes)

    def with_probes(self, probes: list[Probe]) -> "ProbeChain":
        """This chain with ``probes`` (as many, in :meth:`listed`'s order) instead."""
        return dataclasses.replace(self, probes=list(probes))

    def run(self, prefix: DataFrame) -> DataFrame:
        """The chain as a lazy Spark DataFrame over ``prefix`` (which carries ``_ph``)."""
        return prefix.mapInArrow(self, self.spark_schema())

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Probe every batch of prefix rows through the chain (runs inside a Spark task)."""
        workers.prepare()
        target = arrow_schema(self.probes[-1].output)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            for out in self._from(0, pa.Table.from_batches([batch])):
                for piece in out.cast(target).to_batches():
                    yield piece

    def _from(self, position: int, prefix: pa.Table) -> Iterator[pa.Table]:
        out = self.probes[position]._probe(prefix)
        if position + 1 == len(self.probes):
            yield out
            return
        following = self.probes[position + 1]
        for start in range(0, out.num_rows, self.slice_rows):
            yield from self._from(position + 1, following._prefix_after(out.slice(start, self.slice_rows)))


@dataclass
class TaggedProbes:
    """Semi probes of several traces keyed alike, in one Spark task (one ``mapInArrow``).

    Each prefix row names in its column ``tag`` the probe that looks it up. Probe ``t``'s
    one value column goes to output column ``columns[t]``, and every other column of
    ``value_columns`` is NULL on its rows, so that one relation carries the matches of all of
    them. Output: ``tag``, the probes' key columns, ``value_columns`` and ``_tdiff``.

    A small transaction reads the current values of the entities it touches in every
    attribute it writes: one probe per attribute ran one Python worker each in the
    statement's task (a TPC-H order with its line items: 26 attributes, 17 of them stored).
    """

    probes: dict[int, Probe]
    tag: str
    columns: dict[int, str]
    value_columns: list[tuple[str, Kind]]

    @property
    def output(self) -> list[tuple[str, Kind]]:
        """The output columns and their kinds."""
        first = next(iter(self.probes.values()))
        return [(self.tag, Kind.LONG), *first.output[:len(first.join_on)], *self.value_columns, (TRACE_DIFF, Kind.LONG)]

    def spark_schema(self) -> T.StructType:
        """The schema of the output rows."""
        return T.StructType([T.StructField(n, spark_type(k), True) for n, k in self.output])

    def run(self, prefix: DataFrame) -> DataFrame:
        """The probes as a lazy Spark DataFrame over ``prefix`` (which carries ``_ph``)."""
        return prefix.mapInArrow(self, self.spark_schema())

    def listed(self) -> list[Probe]:
        """The probes, in the order of their tags."""
        return list(self.probes.values())

    def with_probes(self, probes: list[Probe]) -> "TaggedProbes":
        """These probes replaced by ``probes`` (as many, in :meth:`listed`'s order)."""
        return dataclasses.replace(self, probes=dict(zip(self.probes, probes)))

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Look up every batch of prefix rows in the probe its tag names (runs inside a Spark task)."""
        workers.prepare()
        target = arrow_schema(self.output)
        for batch in batches:
            prefix = pa.Table.from_batches([batch])
            tags = prefix.column(self.tag)
            for tag, probe in self.probes.items():
                rows = prefix.filter(pc.equal(tags, tag))
                if rows.num_rows == 0:
                    continue
                found = probe._probe(rows.drop_columns([self.tag]))
                columns = [pa.array(np.full(found.num_rows, tag, dtype=np.int64))]
                columns += [found.column(name) for name, _ in probe.output[:len(probe.join_on)]]
                value = found.column(probe.output[len(probe.join_on)][0])
                columns += [value if name == self.columns[tag] else pa.nulls(found.num_rows, arrow_type(kind))
                            for name, kind in self.value_columns]
                columns.append(found.column(TRACE_DIFF))
                yield from pa.Table.from_arrays(columns, names=target.names).cast(target).to_batches()


Probes = Union[ProbeChain, TaggedProbes]


@dataclass
class ParameterizedProbes:
    """Probes (a :class:`ProbeChain` or :class:`TaggedProbes`) whose parameters arrive with
    their input instead of with their function, so that one plan serves every epoch.

    A probe's function goes into the plan of the statement that reads it, and with it the
    index files and local batches it reads and the epoch (:meth:`Probe.parameters`), which
    change every epoch: no plan with a probe could be kept (see
    :mod:`factflow.arrangement.bound`). Here the function holds the probes without them
    (``probes``, :meth:`Probe.stripped`), and its input is the prefix's rows plus one row whose
    column :data:`PROBE_PARAMETERS` holds them, pickled (:meth:`parameters_of`), bound to a
    slot of the epoch's binder: a kept plan reads the new epoch's parameters as it reads
    the new epoch's rows. The prefix's rows have NULL there; the input is one partition.
    """

    probes: Probes

    @staticmethod
    def parameters_of(probes: Probes) -> bytes:
        """The parameters of ``probes``, pickled, in :meth:`listed` order."""
        return pickle.dumps([p.parameters() for p in probes.listed()], protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def of(cls, probes: Probes) -> "ParameterizedProbes":
        """``probes`` without their parameters."""
        return cls(probes.with_probes([p.stripped() for p in probes.listed()]))

    def spark_schema(self) -> T.StructType:
        """The schema of the output rows."""
        return self.probes.spark_schema()

    def run(self, prefix: DataFrame) -> DataFrame:
        """The probes as a lazy Spark DataFrame over ``prefix`` (one partition: the prefix's
        rows and the parameters' row)."""
        return prefix.mapInArrow(self, self.spark_schema())

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Probe the prefix's rows once the parameters' row is read (runs inside a Spark task)."""
        probes: Probes | None = None
        held: list[pa.RecordBatch] = []
        for batch in batches:
            marks = batch.column(PROBE_PARAMETERS)
            if probes is None and marks.null_count < batch.num_rows:
                given = pickle.loads(marks.filter(pc.is_valid(marks))[0].as_py())
                probes = self.probes.with_probes([p.given(x) for p, x in zip(self.probes.listed(), given)])
            rows = batch.filter(pc.is_null(marks)).drop_columns([PROBE_PARAMETERS])
            if probes is None:
                held.append(rows)
                continue
            yield from probes(iter(held + [rows]))
            held = []
        if any(b.num_rows for b in held):
            raise RuntimeError("factflow: a parameterized probe's input has rows but no parameters")


# Spark's Murmur3 hash (seed 42) of LONG columns, the 32-bit arithmetic wrapping in uint32
_M_C1, _M_C2, _M_N, _M_F1, _M_F2 = (np.uint32(c) for c in (0xCC9E2D51, 0x1B873593, 0xE6546B64, 0x85EBCA6B, 0xC2B2AE35))
_ROUTED = re.compile(r"part-(\d+)-of-(\d+)\.arrow")


def _rotl32(x: np.ndarray, bits: int) -> np.ndarray:
    return (x << np.uint32(bits)) | (x >> np.uint32(32 - bits))


def _mix(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    k = _rotl32(k * _M_C1, 15) * _M_C2
    return _rotl32(h ^ k, 13) * np.uint32(5) + _M_N


def _fold_long_columns(columns: Sequence[pa.Array | pa.ChunkedArray], seed: np.generic,
                       step: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """Spark's way of hashing several columns: starting from ``seed``, each non-null value
    (as uint64) is hashed into the hash so far by ``step``; a null leaves it as it is."""
    with np.errstate(over="ignore"):
        h = np.full(len(columns[0]) if columns else 0, seed, dtype=seed.dtype)
        for column in columns:
            values = pc.fill_null(column, 0).to_numpy().astype(np.int64, copy=False).view(np.uint64)
            h = np.where(pc.is_valid(column).to_numpy(zero_copy_only=False), step(h, values), h)
    return h


def _murmur3_long(h: np.ndarray, values: np.ndarray) -> np.ndarray:
    step = _mix(_mix(h, (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)),
                (values >> np.uint64(32)).astype(np.uint32))
    step ^= np.uint32(8)
    step ^= step >> np.uint32(16)
    step *= _M_F1
    step ^= step >> np.uint32(13)
    step *= _M_F2
    step ^= step >> np.uint32(16)
    return step


def long_partition_hash(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Spark's ``hash`` (Murmur3, seed 42) of LONG ``columns`` (what
    :func:`partition_hash_sql` computes, and hash partitioning uses), vectorized, its low
    then its high 32 bits per value."""
    return _fold_long_columns(columns, np.uint32(42), _murmur3_long).view(np.int32)


# Spark's xxhash64 (seed 42) of LONG columns, the 64-bit arithmetic wrapping in uint64
_PRIME1, _PRIME2, _PRIME3, _PRIME4, _PRIME5 = (np.uint64(p) for p in (
    0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5))
_SEED = np.uint64(42)


def _rotl(x: np.ndarray, bits: int) -> np.ndarray:
    return (x << np.uint64(bits)) | (x >> np.uint64(64 - bits))


def _xxhash64_long(h: np.ndarray, values: np.ndarray) -> np.ndarray:
    step = h + _PRIME5 + np.uint64(8)
    step ^= _rotl(values * _PRIME2, 31) * _PRIME1
    step = _rotl(step, 27) * _PRIME1 + _PRIME4
    step ^= step >> np.uint64(33)
    step *= _PRIME2
    step ^= step >> np.uint64(29)
    step *= _PRIME3
    step ^= step >> np.uint64(32)
    return step


def long_hash(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Spark's ``xxhash64`` of LONG ``columns`` (what :func:`hash_sql` computes), vectorized."""
    return _fold_long_columns(columns, _SEED, _xxhash64_long).view(np.int64)


def _kind_of_arrow(t: pa.DataType) -> Kind:
    for kind, arrow in _ARROW_TYPES.items():
        if t == arrow or (kind is Kind.STRING and pa.types.is_large_string(t)) or (
                kind is Kind.INSTANT and pa.types.is_timestamp(t)):
            return kind
    raise TypeError(f"no factflow kind for Arrow type {t}")
