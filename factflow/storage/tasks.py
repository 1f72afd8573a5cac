"""Files of a :class:`~factflow.storage.location.Location` read by Spark tasks, as a DataFrame.

Checkpoint files and the index files of stored batches are read back into Spark the same
way: a task per file, reading it through the same :class:`Location` the driver uses, so a
file on a local disk, a shared mount or an object store needs no file system connector of
Spark's, and the plan is a range and a Python function, whatever wrote the files.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from factflow import workers
from factflow.storage.location import Location

__all__ = ["files_frame"]

#: ``read(location, name)``: a file's rows as an Arrow table (a picklable function: it runs in tasks).
Reader = Callable[[Location, str], pa.Table]


def files_frame(spark: SparkSession, location: Location, names: Sequence[str], read: Reader,
                schema: T.StructType | str) -> DataFrame:
    """The rows of the files ``names`` of ``location``, each read by a task of its own with
    ``read``, as a DataFrame with ``schema``."""
    positions = spark.range(0, len(names), 1, max(1, len(names)))
    return positions.mapInArrow(_FileReader(location, list(names), read), schema)


class _FileReader:
    """The task side of :func:`files_frame`: the files whose positions a partition holds."""

    def __init__(self, location: Location, names: list[str], read: Reader):
        self.location = location
        self.names = names
        self.read = read

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        workers.prepare()
        for batch in batches:
            for position in batch.column(0).to_pylist():
                yield from self.read(self.location, self.names[position]).to_batches(max_chunksize=1 << 16)
