"""TPC-H queries maintained under small updates: an order with its line items, one epoch at a time.

The paper's figure 3 (seed 001, section 7.1.1) loads TPC-H one record at a time; the
update a live analytic view sees most is a small one. This benchmark loads the eight
tables whole (SF 0.01 by default) into a default engine, then, per query alone on it:
installs the query, and runs ``--epochs`` epochs, each retracting or adding back one
random order with its line items (``load_tables`` of both tables' rows of that order as
pandas frames, as an application hands them to the driver, one epoch); after each, the
query's SQL re-run by Spark SQL over the same tables (cached DataFrames; the retracted
order left out) is the alternative a Spark user would write. The first two epochs of
each query are left out of the medians (they plan new shapes). The same epochs with no
query installed give the cost of the epoch itself (the load's check, the transaction's
effective changes and the indexes), also with the order's rows given as filters of the
cached tables (Spark DataFrames: a job fetches them). Results are compared with DuckDB's
answer at the end of each query's pass.

    python benchmarks/tpch_updates.py [--queries 1,3,6] [--epochs 8] [--scale 0.01]
"""

from __future__ import annotations

import argparse
import os
import random
import time

from common import describe_session, engine_session, machine_facts, median, report
from benchmarks.tpch.data import STREAM_KEYS, TABLE_NAMES, answer, connect, generate
from benchmarks.tpch.queries import QUERIES, difference
from benchmarks.tpch.schema import TABLES

from factflow import Engine
from factflow.io.tables import create_table, load_table, load_tables

DATA = os.environ.get("FACTFLOW_TPCH", "/tmp/factflow-tpch")
ORDER_TABLES = ("lineitem", "orders")
WARM = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", default=None, help="comma-separated query numbers (default all 22)")
    parser.add_argument("--epochs", type=int, default=8, help="epochs per query (default 8)")
    parser.add_argument("--scale", type=float, default=0.01, help="TPC-H scale factor (default 0.01)")
    parser.add_argument("--seed", type=int, default=37)
    args = parser.parse_args()
    numbers = [int(n) for n in args.queries.split(",")] if args.queries else sorted(QUERIES)
    paths = generate(args.scale, os.path.join(DATA, f"sf{args.scale:g}"))
    spark = engine_session()
    print(f"TPC-H SF {args.scale:g}, queries {numbers}, {args.epochs} epochs each; session {describe_session(spark)}",
          flush=True)
    frames = {t: spark.read.parquet(paths[t]).cache() for t in TABLE_NAMES}
    for frame in frames.values():
        frame.count()
    db = Engine(spark=spark)
    for t in TABLE_NAMES:
        create_table(db, TABLES[t], frames[t].schema)
    for n in numbers:
        if QUERIES[n].rules:
            db.register(QUERIES[n].rules)
    started = time.perf_counter()
    for t in TABLE_NAMES:
        load_table(db, frames[t], TABLES[t])
    loaded = time.perf_counter() - started
    print(f"loaded in {loaded:.1f} s", flush=True)
    orders = sorted(r[0] for r in frames["orders"].select("o_orderkey").collect())
    rng = random.Random(args.seed)

    order_rows: dict[int, list] = {}

    def epoch(key: int, added: bool, spark_frames: bool = False) -> float:
        """Retract (or add back) order ``key`` with its line items; the epoch's seconds. The
        rows arrive as pandas frames, as an application hands the driver an order (fetched
        before the clock starts), or with ``spark_frames`` as filters of the cached tables."""
        if spark_frames:
            sources = [(frames[t].where(f"{STREAM_KEYS[t]} = {key}"), TABLES[t]) for t in ORDER_TABLES]
        else:
            if key not in order_rows:
                order_rows[key] = [(frames[t].where(f"{STREAM_KEYS[t]} = {key}").toPandas(), TABLES[t])
                                   for t in ORDER_TABLES]
            sources = order_rows[key]
        began = time.perf_counter()
        load_tables(db, sources, added=added)
        return time.perf_counter() - began

    def views(gone: int | None) -> None:
        for t in TABLE_NAMES:
            frame = frames[t] if gone is None or t not in ORDER_TABLES else frames[t].where(f"{STREAM_KEYS[t]} <> {gone}")
            frame.createOrReplaceTempView(t)

    def keys() -> list[tuple[int, bool]]:
        """The epochs of a pass: an order retracted, then added back, ``args.epochs`` in all."""
        chosen = [rng.choice(orders) for _ in range((args.epochs + 1) // 2)]
        return [(k, added) for k in chosen for added in (False, True)][:args.epochs]

    db.wait_for_maintenance()
    alone_spark = [epoch(k, added, spark_frames=True) for k, added in keys()]
    db.wait_for_maintenance()
    alone = [epoch(k, added) for k, added in keys()]
    print(f"no query: median {median(alone[WARM:]):.3f} s ({median(alone_spark[WARM:]):.3f} s with the rows "
          "as Spark DataFrames)", flush=True)
    per_query = {}
    for n in numbers:
        q = QUERIES[n]
        db.wait_for_maintenance()
        began = time.perf_counter()
        handle = db.query(q.query, name=q.name)
        install = time.perf_counter() - began
        incremental, rerun, jobs = [], [], []
        for key, added in keys():
            incremental.append(epoch(key, added))
            jobs.append(len(db.epoch_log[-1].jobs))
            views(None if added else key)
            began = time.perf_counter()
            spark.sql(q.sql.rstrip().rstrip(";")).collect()
            rerun.append(time.perf_counter() - began)
        views(None)
        con = connect(paths)
        matches = difference(handle.rows(), answer(con, q.sql)) is None
        handle.close()
        inc, sql = median(incremental[WARM:]), median(rerun[WARM:])
        per_query[q.name] = {"install_s": round(install, 3), "update_median_s": round(inc, 3),
                             "update_max_s": round(max(incremental[WARM:]), 3), "jobs_median": median(jobs[WARM:]),
                             "spark_sql_median_s": round(sql, 3), "ratio": round(sql / inc, 3),
                             "matches_duckdb": matches}
        print(f"  {q.name}: install {install:.2f} s, update median {inc:.3f} s, Spark SQL {sql:.3f} s, "
              f"ratio {sql / inc:.3f}, matches DuckDB: {matches}", flush=True)
    db.close()
    report(f"tpch_updates-sf{args.scale:g}", machine_facts(spark),
           {"scale": args.scale, "session": describe_session(spark), "load_s": round(loaded, 1),
            "epochs_per_query": args.epochs, "no_query_update_median_s": round(median(alone[WARM:]), 3),
            "no_query_update_median_spark_frames_s": round(median(alone_spark[WARM:]), 3),
            "queries": per_query})


if __name__ == "__main__":
    main()
