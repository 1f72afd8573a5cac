"""Immutable batches of updates: the unit a trace is made of.

A batch holds update rows ``(columns..., _t, _diff)`` for the epochs ``[lower, upper)``.
Two physical forms exist:

* a *local* batch keeps its (small) rows on the driver as a pandas frame and exposes them
  to Spark as a ``LocalRelation``: no cache, no lineage, exact statistics, free to broadcast
  (written into the statement as an inline table when it has only a few rows, see
  :func:`local_relation`);
* a *stored* batch is a DataFrame checkpointed on the executors (``localCheckpoint``),
  hash-partitioned and sorted by the trace's key so joins on that key need not shuffle it
  (or, when Spark computed it in one partition, such as an install from a constant, kept
  in that partition and sorted: a single partition needs no shuffle either).
  Checkpointing cuts the lineage: the batch's plan is a plain scan of stored blocks, so
  plans never grow with the number of epochs. (Spark's columnar cache scans about a
  third faster, but plans that read a cached relation twice trip analyzer bugs in
  Spark 4.1 (relation deduplication and InMemoryRelation canonicalization), so batches
  are kept as checkpoints.)

* a *filed* batch (on a cluster, see :meth:`Batch.from_files`) is kept in its index files
  only, read by a Spark plan that scans them (:func:`~factflow.arrangement.index.read_index`):
  nothing of it lives only in an executor, so losing one loses nothing the engine holds
  (a checkpoint's blocks go with their executor, and every later read of them fails).

All report their exact row count, so tuple accounting is exact, and all are read by
the SQL the dataflow generates through :attr:`Batch.source` (a temp view, or an inline
table). A stored batch
is also written, once, as sorted index files that probes read by key (:mod:`.index`); a
local batch offers its rows as an Arrow table for the same probes.

A batch may be *pinned* by a reader outside the engine lock (a checkpoint being written in
the background): its release is then deferred until the last pin is given up.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from factflow.arrangement import bound
from factflow.arrangement.index import arrow_schema, read_index, remove_index, write_index
from factflow.arrangement.views import drop_view, one_partition, register_view
from factflow.model.frames import INLINE_ROWS, spark_frame, values_sql
from factflow.model.types import Kind, spark_type
from factflow.storage.location import Location

__all__ = ["Layout", "Batch", "TIME", "DIFF", "PANDAS_DTYPES", "local_relation"]

TIME = "_t"
DIFF = "_diff"
_PINS = threading.Lock()

#: The pandas dtype of a column of each kind in driver-held batches.
PANDAS_DTYPES = {
    Kind.LONG: "int64",
    Kind.DOUBLE: "float64",
    Kind.STRING: "object",
    Kind.BOOLEAN: "bool",
    Kind.INSTANT: "datetime64[us]",
}


@dataclass(frozen=True)
class Layout:
    """Column layout of a trace: data columns with kinds, and the key it is partitioned by."""

    columns: tuple[tuple[str, Kind], ...]
    key: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        """Data column names (without time and diff)."""
        return [name for name, _ in self.columns]

    @property
    def index_key(self) -> tuple[str, ...]:
        """The columns batches are partitioned, sorted and probed by: the key, or every
        data column when the layout has none."""
        return self.key or tuple(self.names)

    @property
    def all_names(self) -> list[str]:
        """Data columns followed by ``_t`` and ``_diff``."""
        return self.names + [TIME, DIFF]

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of a batch with this layout."""
        return arrow_schema(list(self.columns) + [(TIME, Kind.LONG), (DIFF, Kind.LONG)])

    def spark_schema(self) -> T.StructType:
        """The Spark schema of a batch with this layout."""
        fields = [T.StructField(name, spark_type(kind), False) for name, kind in self.columns]
        fields += [T.StructField(TIME, T.LongType(), False), T.StructField(DIFF, T.LongType(), False)]
        return T.StructType(fields)

    def normalize_pandas(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Give a pandas frame exactly this layout's columns and dtypes."""
        wanted = {name: PANDAS_DTYPES[kind] for name, kind in self.columns} | {TIME: "int64", DIFF: "int64"}
        out = frame[self.all_names] if list(frame.columns) != self.all_names else frame
        dtypes = dict(zip(out.columns, out.dtypes))
        converting = {name: dtype for name, dtype in wanted.items() if dtypes[name] != dtype}
        out = out.astype(converting) if converting else out.copy()
        out.index = pd.RangeIndex(len(out))  # a copy of its own: no second copy to reset the index
        return out


def local_relation(spark: SparkSession, frame: pd.DataFrame, schema: T.StructType,
                   prefix: str = "ff_b") -> tuple[str, str | None]:
    """SQL reading the rows of a driver-side frame (typed as ``schema``), and the temp view
    registered for them, to drop when done: None when at most
    :data:`~factflow.model.frames.INLINE_ROWS` rows are written inline instead, or when the
    rows are bound to a slot of the active :class:`~factflow.arrangement.bound.Binder`
    (read as one partition then)."""
    binder = bound.current()
    if binder is not None:
        return binder.relation(frame, schema), None
    if len(frame) <= INLINE_ROWS:
        return values_sql(frame, schema), None
    view = register_view(spark_frame(spark, frame, schema), prefix)
    return view, view


#: Checkpoints expected to hold more rows than this keep their blocks serialized.
SERIALIZED_ROWS = 1_000_000


def storage_level(expected_rows: int) -> StorageLevel | None:
    """How a checkpoint of about ``expected_rows`` rows keeps its blocks (None: Spark's default).

    Spark's default for local checkpoints keeps each row as objects (an ``UnsafeRow`` and
    its byte array: about 90 bytes for three longs), which the heap's garbage collector
    must trace; in local mode that heap is the driver's. Ten million such rows (one
    reachability closure) took 900 MB of a 2 GiB driver and left too little for the rest.
    Serialized blocks take about a third of that in a few large arrays, and Spark sizes
    them exactly when it decides what to spill to disk; scanning them costs about three
    times as long, so only large checkpoints are kept that way."""
    return StorageLevel.MEMORY_AND_DISK if expected_rows > SERIALIZED_ROWS else None


def _local_checkpoint(frame: DataFrame, expected_rows: int, eager: bool = False) -> DataFrame:
    return frame.localCheckpoint(eager, storage_level(expected_rows))


def checkpoint(frame: DataFrame, expected_rows: int = 0) -> tuple[DataFrame, int]:
    """Materialize ``frame`` on the executors with its lineage cut; returns it and its row count.

    One Spark job: the checkpoint is lazy, and the count materializes it (its blocks are
    stored as the count reads them, and the lineage is cut when the job ends). An eager
    checkpoint followed by a count runs two jobs over the same rows. The rows are counted
    per partition by the job's own tasks (a count of the stored rows' RDD), not by
    ``DataFrame.count``, which plans an aggregate and a stage of its own above them.
    ``expected_rows`` chooses how the blocks are kept (:func:`storage_level`)."""
    stored = _local_checkpoint(frame, expected_rows)
    return stored, stored._jdf.queryExecution().toRdd().count()


def checkpoint_eagerly(frame: DataFrame, expected_rows: int = 0) -> DataFrame:
    """``frame`` materialized at once with its lineage cut (a frame handed to a user, whose
    blocks Spark frees when it is garbage collected); see :func:`storage_level`."""
    return _local_checkpoint(frame, expected_rows, eager=True)


def checkpoint_indexed(frame: DataFrame, key: tuple[str, ...], directory: Location,
                       expected_rows: int = 0) -> tuple[DataFrame, int, list[str]]:
    """:func:`checkpoint` and :func:`~factflow.arrangement.index.write_index` in one Spark
    job: the index files are written from the rows the job stores. Returns the stored
    frame, its row count and the names of its index files; a failed job leaves neither
    blocks nor files behind."""
    stored = _local_checkpoint(frame, expected_rows)
    try:
        paths, rows = write_index(stored, key, directory)
    except BaseException:
        release_checkpoint(stored)
        remove_index(directory)
        raise
    return stored, rows, paths


def release_checkpoint(frame: DataFrame) -> None:
    """Free the blocks of a frame made by :func:`checkpoint`."""
    frame._jdf.queryExecution().analyzed().rdd().unpersist(False)


class Batch:
    """An immutable batch of updates covering epochs ``[lower, upper)``, readable as a view."""

    __slots__ = ("lower", "upper", "rows", "frame", "local", "view", "index", "index_paths", "single_time", "_stored",
                 "_arrow", "_spark", "_layout", "_pins", "_released", "_indexing", "_relation")

    def __init__(self, lower: int, upper: int, rows: int, frame: DataFrame | None,
                 local: pd.DataFrame | None = None, stored: DataFrame | None = None,
                 spark: SparkSession | None = None, layout: Layout | None = None):
        self.lower = lower
        self.upper = upper
        self.rows = rows
        self.frame = frame
        self.local = local
        self._stored = stored
        self._arrow: pa.Table | None = None
        self._spark = spark
        self._layout = layout
        self.index: Location | None = None  # directory of the sorted index files (stored batches)
        self.index_paths: list[str] = []  # their names in it
        #: a local batch whose rows are consolidated (distinct, no zero diff) and all at one
        #: time: that time (set by the merge that made it, see ``Trace._merged_locally``)
        self.single_time: int | None = None
        self.view = register_view(frame, lasting=True) if rows and frame is not None else None
        self._relation: str | None = None  # SQL reading a local batch, once read
        self._pins = 0
        self._released = False
        self._indexing = threading.Lock()

    @property
    def source(self) -> str:
        """SQL that reads this batch (a local batch is read as a single partition).

        A local batch becomes a Spark relation only when SQL first reads it (most are merged
        on the driver before any statement does): written inline when it has few rows, else
        a DataFrame registered as a temp view."""
        if self.local is not None:
            binder = bound.current()
            if binder is not None:
                return binder.relation(self.local, self._layout.spark_schema(), owner=self)
            if self._relation is None:
                relation, self.view = local_relation(self._spark, self.local, self._layout.spark_schema())
                self._relation = one_partition(relation)
            return self._relation
        return self.view

    @property
    def is_local(self) -> bool:
        """Whether the rows live on the driver (a LocalRelation) rather than in Spark's cache."""
        return self.local is not None

    def hash_partitions(self, key: tuple[str, ...]) -> int | None:
        """How many partitions a batch kept in Spark is hash-partitioned into by ``key``, as
        Spark's plan of it says (None: partitioned otherwise, or held on the driver). Two
        such batches with the same count are partitioned alike: a join of them on the key
        needs no shuffle."""
        if self.frame is None or self.is_local:
            return None
        partitioning = self.frame._jdf.queryExecution().executedPlan().outputPartitioning()
        if partitioning.getClass().getSimpleName() != "HashPartitioning":
            return None
        expressions = [partitioning.expressions().apply(i) for i in range(partitioning.expressions().size())]
        names = tuple(e.name() if e.getClass().getSimpleName() == "AttributeReference" else None for e in expressions)
        return partitioning.numPartitions() if names == key else None

    def arrow(self, layout: Layout) -> pa.Table:
        """The rows of a local batch as an Arrow table with ``layout``'s schema (cached)."""
        if self._arrow is None:
            self._arrow = pa.Table.from_pandas(self.local, schema=layout.arrow_schema(), preserve_index=False)
        return self._arrow

    def write_index(self, key: tuple[str, ...], directory: Location) -> None:
        """Write this stored batch's sorted index files (once, whichever thread asks first; a
        Spark job)."""
        with self._indexing:
            if self.index is None and self.rows and self.local is None:
                self.index_paths, _ = write_index(self.frame, key, directory)
                self.index = directory

    @classmethod
    def from_pandas(cls, spark: SparkSession, layout: Layout, frame: pd.DataFrame,
                    lower: int, upper: int) -> "Batch":
        """A local batch from consolidated rows already on the driver."""
        frame = layout.normalize_pandas(frame)
        return cls(lower, upper, len(frame), None, local=frame, spark=spark, layout=layout)

    @classmethod
    def from_files(cls, spark: SparkSession, layout: Layout, directory: Location, names: list[str], rows: int,
                   lower: int, upper: int, cache_bytes: int) -> "Batch":
        """A stored batch kept in its index files ``names`` of ``directory`` (written with the
        layout's columns, see :func:`~factflow.arrangement.index.write_index`), read by a
        plan that scans them; releasing it removes them."""
        frame = read_index(spark, directory, names, layout.spark_schema(), cache_bytes)
        batch = cls(lower, upper, rows, frame, spark=spark, layout=layout)
        batch.index, batch.index_paths = directory, list(names)
        return batch

    @property
    def owns_stored(self) -> bool:
        """Whether releasing this batch frees a checkpoint (one it was made from by
        :meth:`from_checkpoint`); other checkpoints its rows came from stay their maker's."""
        return self._stored is not None

    @classmethod
    def from_checkpoint(cls, frame: DataFrame, rows: int, lower: int, upper: int,
                        stored: DataFrame | None = None, index: tuple[Location, list[str]] | None = None) -> "Batch":
        """A batch over ``frame``, read from ``stored`` (made by :func:`checkpoint`; default
        ``frame``); ``index``: the directory and names of its index files, if written already."""
        batch = cls(lower, upper, rows, frame, stored=frame if stored is None else stored)
        if index is not None:
            batch.index, batch.index_paths = index
        return batch

    def pin(self) -> None:
        """Keep the batch's rows readable (``local``, ``frame``) until :meth:`unpin`, even if
        the trace releases it meanwhile (any thread)."""
        with _PINS:
            self._pins += 1

    def unpin(self) -> None:
        """Give up a pin; a release requested meanwhile happens now (any thread)."""
        with _PINS:
            self._pins -= 1
            due = self._pins == 0 and self._released
        if due:
            self._free()

    def release(self) -> None:
        """Drop the batch's view and free its stored blocks (once the last pin is given up)."""
        with _PINS:
            self._released = True
            if self._pins:
                return
        self._free()

    def _free(self) -> None:
        if self.view is not None:
            drop_view(self._spark or self.frame.sparkSession, self.view)
            self.view = None
        if self._stored is not None:
            release_checkpoint(self._stored)
            self._stored = None
        if self.index is not None:
            remove_index(self.index)
            self.index, self.index_paths = None, []

    def __repr__(self) -> str:
        form = "local" if self.is_local else "cached"
        return f"Batch([{self.lower}, {self.upper}), rows={self.rows}, {form}, {self.view})"
