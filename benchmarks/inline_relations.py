"""A driver-side relation read by a statement: as a DataFrame and temp view, or written inline.

Small epochs turn driver-side frames (a transaction, new local batches) into relations their
statement reads. This times one statement reading a four-column relation ``(e, v, _t,
_diff)`` of 1 to 1,024 rows in the two forms factflow has, and a trivial statement for
scale:

- DataFrame + temp view: ``createDataFrame`` from Arrow, ``createOrReplaceTempView``, the
  statement, ``dropTempView`` (what every local relation cost before);
- inline table: the rows written into the statement by ``values_sql``.

Medians of ``--repeats`` runs per form and size, after one untimed pass over every size
(the JVM warms up). ``factflow.model.frames.INLINE_ROWS`` is chosen from these figures.

    python benchmarks/inline_relations.py [--repeats 25]
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
from common import engine_session, machine_facts, median, report
from pyspark.sql import types as T

from factflow.arrangement.views import drop_view, register_view
from factflow.model.frames import INLINE_ROWS, spark_frame, values_sql

SIZES = (1, 16, 64, 256, 1024)
SCHEMA = T.StructType([T.StructField("e", T.LongType(), False), T.StructField("v", T.StringType(), False),
                       T.StructField("_t", T.LongType(), False), T.StructField("_diff", T.LongType(), False)])


def seconds(run, repeats: int) -> float:
    """Median wall time of ``run()``."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return median(times)


def forms(spark, rows: int) -> dict:
    """The ways to read a relation of ``rows`` rows, as functions running one statement each."""
    frame = pd.DataFrame({"e": range(rows), "v": [f"it's {i}" for i in range(rows)], "_t": [5] * rows,
                          "_diff": [1] * rows})

    def viewed() -> None:
        view = register_view(spark_frame(spark, frame, SCHEMA), prefix="ff_bench")
        spark.sql(f"SELECT /*+ COALESCE(1) */ * FROM {view} WHERE `_diff` > 0").toArrow()
        drop_view(spark, view)

    def inline() -> None:
        spark.sql(f"SELECT /*+ COALESCE(1) */ * FROM {values_sql(frame, SCHEMA)} WHERE `_diff` > 0").toArrow()

    def trivial() -> None:
        spark.sql("SELECT 1 AS x").toArrow()

    return {"dataframe_and_view_s": viewed, "inline_table_s": inline, "trivial_statement_s": trivial}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25)
    args = parser.parse_args()
    spark = engine_session()
    for rows in SIZES:  # warm-up pass
        for run in forms(spark, rows).values():
            seconds(run, 3)
    figures: dict = {"inline_rows_default": INLINE_ROWS}
    print(f"{'rows':>6} {'DataFrame + view':>17} {'inline table':>13} {'trivial':>8}")
    for rows in SIZES:
        measured = {name: round(seconds(run, args.repeats), 4) for name, run in forms(spark, rows).items()}
        figures[f"rows_{rows}"] = measured
        print(f"{rows:>6} {measured['dataframe_and_view_s']:>16.4f}s {measured['inline_table_s']:>12.4f}s "
              f"{measured['trivial_statement_s']:>7.4f}s", flush=True)
    report("inline_relations", machine_facts(spark), figures)


if __name__ == "__main__":
    main()
