"""Rows held in Spark as files for a short while: sets too large for the driver.

Two kinds of relations outgrow what a fetch may bring to the driver
(``EngineConfig.fetch_limit``) without being state that a trace keeps: the sets a
recursive component accumulates while it iterates (:mod:`factflow.dataflow.recursion`,
held by the engine's evaluation) and a query's changes in an epoch, waiting to be
delivered in chunks and written by sinks (:mod:`factflow.engine.delivery`). Both are
written once as index files (:func:`~factflow.arrangement.index.write_index`: one Spark
job, each task writing its partition's rows through the storage layer, so a cluster's
executors and the driver see them alike) into a directory of their own, and read back
with :func:`~factflow.arrangement.index.read_index`, whose plan is a range and a Python
function however many iterations or epochs wrote the files. So a statement over them
carries no lineage, and several of them in one statement share no plan: unions of
several local checkpoints of plans over the same views trip Spark 4.1's optimizer
(attribute lookups in PruneFilters), which is why fixpoint iterations used to be
collected to the driver. Concatenating such relations is free: the union of their
files, read by one range.

**Spark's size estimate.** Spark estimates the read of a range and a Python function
from the range: a few bytes per file, whatever the files hold. It would then broadcast
a set of millions of rows to every task of a join (a 10-million-row set ran the 2 GiB
driver out of heap that way). :meth:`FiledRows.frame` therefore reads the files through
a plan whose size Spark does not know (the rows of the read's RDD, a ``LogicalRDD``
without statistics, which Spark takes as larger than any threshold): such a set is never
broadcast, and the other side of a join still is when it is small.

**Chunks.** Rows written with ``chunk=N`` are spread round-robin over enough partitions
that no file holds more than N rows; :meth:`FiledRows.chunks` then reads them on the
driver one file at a time through the storage layer (no Spark job, at most N rows in
memory), which is how a large change set reaches subscribers.

Files are removed by their holder (:meth:`FiledRows.remove`, or the directory as a
whole); rows that several readers take in turn (a delivery, then the sinks it feeds, on
their own threads) are held by a :class:`HeldRows`, which removes them when the last
reader is done.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Iterator, Sequence

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from factflow.arrangement.index import read_index, write_index
from factflow.storage.location import Location

__all__ = ["FiledRows", "HeldRows"]


@dataclass(frozen=True)
class FiledRows:
    """Rows kept as index files: ``names`` (paths relative to ``root``) holding ``rows``
    rows with ``schema``'s columns."""

    root: Location
    names: tuple[str, ...]
    rows: int
    schema: T.StructType

    @classmethod
    def write(cls, frame: DataFrame, root: Location, part: str, chunk: int | None = None,
              expected: int | None = None) -> "FiledRows":
        """Write ``frame``'s rows into the directory ``part`` of ``root`` (one Spark job).

        With ``chunk``, no file holds more than ``chunk`` rows, given that ``frame`` has at
        most ``expected`` rows: they are spread round-robin over enough partitions (each
        partition of ``frame`` deals its rows out in turn, so a file gets at most one more
        row from each than an even share)."""
        if chunk is not None and expected:
            inputs = frame._jdf.queryExecution().executedPlan().outputPartitioning().numPartitions()
            if chunk <= inputs:  # one input partition: each file gets at most an even share, rounded up
                frame, share = frame.coalesce(1), chunk
            else:
                share = chunk - inputs
            frame = frame.repartition(max(1, math.ceil(expected / share)))
        names, rows = write_index(frame, frame.columns, root.child(part))
        return cls(root, tuple(f"{part}/{name}" for name in names), rows, frame.schema)

    @staticmethod
    def concat(parts: Sequence["FiledRows"]) -> "FiledRows":
        """The rows of ``parts`` (files under one root, with one schema) together: no job."""
        first = parts[0]
        return FiledRows(first.root, tuple(n for p in parts for n in p.names), sum(p.rows for p in parts),
                         first.schema)

    def frame(self, spark: SparkSession) -> DataFrame:
        """The rows as a Spark DataFrame of unknown size (see the module docs)."""
        read = read_index(spark, self.root, self.names, self.schema)
        unsized = spark._jsparkSession.internalCreateDataFrame(read._jdf.queryExecution().toRdd(),
                                                              read._jdf.schema(), False)
        return DataFrame(unsized, spark)

    def chunks(self) -> Iterator[pd.DataFrame]:
        """The rows as pandas frames, one file at a time, read on the driver."""
        for name in self.names:
            table = pa.ipc.open_file(pa.BufferReader(self.root.read(name))).read_all()
            yield table.select(self.schema.fieldNames()).to_pandas()

    def remove(self) -> None:
        """Delete the files and the directories :meth:`write` made for them."""
        for part in dict.fromkeys(name.rsplit("/", 1)[0] for name in self.names):
            self.root.remove_tree(part)


class HeldRows:
    """:class:`FiledRows` that several readers take in turn: each :meth:`hold` is matched
    by a :meth:`release` (the maker's hold included), and the last release removes their
    root directory, which holds nothing else."""

    def __init__(self, files: FiledRows):
        self.files = files
        self._holds = 1
        self._lock = threading.Lock()

    def hold(self) -> "HeldRows":
        """One more reader (before the current ones may release); returns this."""
        with self._lock:
            self._holds += 1
        return self

    def release(self) -> None:
        """A reader is done; the last one removes the files."""
        with self._lock:
            self._holds -= 1
            done = self._holds == 0
        if done:
            self.files.root.remove_tree()
