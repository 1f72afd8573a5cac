"""What reusing a Spark plan across epochs could save a small epoch, measured without factflow's dataflow.

A small epoch's cost is Spark's fixed cost per statement: each epoch's statement is new
SQL over new local relations (the epoch's changes and the driver-held batches are part of
the plan), so Spark parses, analyses, optimizes and plans it, and its first execution
generates code, every epoch. Keeping each statement's plan across epochs needs leaves
whose rows are read when the plan executes, not when it is planned. PySpark offers one
such leaf without JVM code: a Python data source (``pyspark.sql.datasource``), whose
reader runs in a Python worker inside the task. This script measures, for statements
reading ``N`` leaves of 100-200 rows (a union, each leaf in one partition, planned with
factflow's settings for small statements, ``EngineConfig.small_conf``):

- ``fresh``: new local relations and a new statement every run (what factflow does);
- ``reuse, fixed``: one DataFrame over local relations executed again (the floor of plan
  reuse; its rows cannot change);
- ``reuse, python leaves``: one DataFrame over Python data source leaves executed again,
  the leaves' Arrow files rewritten before each run (the result is checked to follow them).

The statements are unions, not joins, because a reused plan must not contain an exchange:
executed again, Spark reuses the exchange's output of the first run (the stage is
skipped), so the leaves below it are not read again and the result is stale. Joins of
factflow's local relations plan no exchange in one partition because Spark knows their
sizes (``spark.sql.maxSinglePartitionBytes``); a Python data source reports none, so
Spark plans an exchange above every join of such leaves that feeds another join.

Prints the medians (first two runs excluded) and their ratio to a trivial Spark job on the
same session.

    python benchmarks/plan_reuse.py [--leaves 1,10,30] [--runs 9]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather
from common import engine_session, machine_facts, median, report, timed, trivial_job_seconds
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceReader

from factflow.arrangement.views import drop_view, one_partition, register_view
from factflow.model.frames import spark_frame
from factflow.engine.apply import small_statements
from factflow.engine.config import EngineConfig

SCHEMA = "e BIGINT, v BIGINT, _diff BIGINT"
LOCAL_SCHEMA = T.StructType([T.StructField(n, T.LongType(), True) for n in ("e", "v", "_diff")])


class LeafReader(DataSourceReader):
    """Reads the leaf's Arrow file when the plan executes (inside a Spark task)."""

    def __init__(self, path: str):
        self.path = path

    def read(self, partition):
        yield from feather.read_table(self.path).to_batches()


class Leaf(DataSource):
    """A relation whose rows are the Arrow file at option ``path`` when a plan reading it runs."""

    @classmethod
    def name(cls) -> str:
        return "factflow_bench_leaf"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> LeafReader:
        return LeafReader(self.options["path"])


def rows(n: int) -> pd.DataFrame:
    """``n`` rows keyed 0..n-1."""
    keys = np.arange(n, dtype="int64")
    return pd.DataFrame({"e": keys, "v": keys % 7, "_diff": np.ones(n, dtype="int64")})


def statement(views: list[str]) -> str:
    """The rows of every view, a union (each input in one partition, as factflow's small
    statements read local relations)."""
    return "SELECT /*+ COALESCE(1) */ e, v FROM (" + " UNION ALL ".join(
        f"SELECT * FROM {one_partition(v)}" for v in views) + ")"


def without_exchange(frame):
    """``frame``, checked to plan no exchange: executed again, a plan with one would reuse
    its first run's shuffle output instead of reading its leaves anew."""
    plan = frame._jdf.queryExecution().executedPlan().toString()
    if "Exchange" in plan:
        raise SystemExit(f"the statement plans an exchange:\n{plan}")
    return frame


def measure(spark, leaves: int, runs: int, directory: str) -> dict:
    """Median seconds of the three forms for ``leaves`` leaves; the first leaf has
    ``100 + k`` rows in run ``k``, the others 200."""
    def local_views(k: int) -> list[str]:  # as factflow registers the local relations of a statement
        return [register_view(spark_frame(spark, rows(100 + k if i == 0 else 200), LOCAL_SCHEMA), prefix="ff_bench")
                for i in range(leaves)]

    def expected(k: int) -> int:
        return 100 + k + 200 * (leaves - 1)

    def fresh(k: int) -> int:
        views = local_views(k)
        try:
            return spark.sql(statement(views)).toArrow().num_rows
        finally:
            for view in views:
                drop_view(spark, view)

    fixed = without_exchange(spark.sql(statement(local_views(0))))

    paths = [os.path.join(directory, f"leaf-{leaves}-{i}.arrow") for i in range(leaves)]
    for i, path in enumerate(paths):
        feather.write_feather(pa.Table.from_pandas(rows(200)), path, compression="uncompressed")
        spark.read.format(Leaf.name()).option("path", path).load().createOrReplaceTempView(f"leaf_{i}")
    python_leaves = without_exchange(spark.sql(statement([f"leaf_{i}" for i in range(leaves)])))

    def reuse_python(k: int) -> int:
        feather.write_feather(pa.Table.from_pandas(rows(100 + k)), paths[0], compression="uncompressed")
        return python_leaves.toArrow().num_rows

    times: dict[str, list[float]] = {"fresh": [], "reuse, fixed": [], "reuse, python leaves": []}
    for k in range(runs):
        seconds, n = timed(lambda: fresh(k))
        assert n == expected(k), (n, k)
        times["fresh"].append(seconds)
        seconds, n = timed(lambda: fixed.toArrow().num_rows)
        assert n == expected(0)
        times["reuse, fixed"].append(seconds)
        seconds, n = timed(lambda: reuse_python(k))
        assert n == expected(k), (n, k)  # the reused plan read the rewritten file
        times["reuse, python leaves"].append(seconds)
    return {form: round(median(t[2:]), 4) for form, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", default="1,10,30", help="numbers of leaves per statement")
    parser.add_argument("--runs", type=int, default=9, help="runs per form (the first two are excluded)")
    args = parser.parse_args()
    spark = engine_session()
    spark.dataSource.register(Leaf)
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="factflow-plan-reuse-") as directory, \
            small_statements(spark, EngineConfig().small_conf):
        trivial = trivial_job_seconds(spark)
        for leaves in (int(n) for n in args.leaves.split(",")):
            figures[f"leaves_{leaves}"] = measure(spark, leaves, args.runs, directory)
            print(f"  {leaves} leaves: {figures[f'leaves_{leaves}']}", flush=True)
    figures["trivial_spark_job_s"] = round(trivial, 4)
    print(f"\n{'leaves':>6} {'form':<22} {'median':>8} {'x trivial':>9}")
    for key, forms in figures.items():
        if key.startswith("leaves_"):
            for form, seconds in forms.items():
                print(f"{key[7:]:>6} {form:<22} {seconds:>7.3f}s {seconds / trivial:>8.1f}x")
    report("plan_reuse", machine_facts(spark), figures)


if __name__ == "__main__":
    main()
