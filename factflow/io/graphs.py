"""Reading graph edge lists (SNAP and Datalog benchmark files) with Spark's readers.

Two layouts are understood: ``src,dst`` lines (the Datalog benchmark graphs tree11,
grid150, gnp10K) and the SNAP triangle-counting layout (a node-count line, then
``u v w`` lines, then ``-1``) of facebook_combined and oregon1.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

__all__ = ["read_edges", "edge_facts"]


def _is_csv(path: str) -> bool:
    with open(path, encoding="utf-8") as handle:
        return "," in handle.readline()


def read_edges(spark: SparkSession, path: str) -> DataFrame:
    """The edges of a graph file as a DataFrame ``(src long, dst long)``, read by Spark."""
    if _is_csv(path):
        frame = spark.read.csv(path, schema="src long, dst long")
    else:
        parts = F.split(F.trim(F.col("value")), r"\s+")
        frame = spark.read.text(path).select(F.get(parts, 0).cast("long").alias("src"),
                                             F.get(parts, 1).cast("long").alias("dst"))
    return frame.where(F.col("src").isNotNull() & F.col("dst").isNotNull())


def edge_facts(spark: SparkSession, path: str, attribute: str = ":edge") -> DataFrame:
    """The edges of a graph file as facts ``(e, a, v)`` for :meth:`Engine.transact`."""
    edges = read_edges(spark, path)
    return edges.select(F.col("src").alias("e"), F.lit(attribute).alias("a"), F.col("dst").alias("v"))
