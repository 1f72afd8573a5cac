"""Streaming ingest (``db.ingest``) and bulk load (``db.load``) against Spark alone.

Ingest: LDBC SNB tiny places are loaded (``:place/name``), one join query is installed
(``[:find ?p ?name :where [?p :person/place ?c] [?c :place/name ?name]]``) with a
subscriber, and a ``db.ingest`` stream reads a directory with Spark's CSV file source
(``e, a, v``). For micro-batches of 100, 10,000 and 1,000,000 facts (new persons, each
given a random place), a CSV file is written beforehand by Spark into a staging directory
and *moved* into the watched directory at t0; the latency is from t0 to the moment the
subscriber has received the batch's last result row (one per fact), the throughput is
facts / latency (one batch in flight at a time). The same files, moved into another
directory, feed a plain Structured Streaming query doing the same join (stream-static:
the stream's ``(e, v)`` joined to the places' ``(id, name)``) whose ``foreachBatch``
fetches the joined rows to the driver (``toArrow``) and hands them to a callback: what
Spark alone can do. What it cannot: a retraction or a cardinality-one overwrite of a
person's place, or a renamed place, would not change the rows it delivered; the factflow
query retracts and re-derives them.

Load: the four LDBC SNB tiny CSVs ``load_ldbc`` reads (persons, knows, person places,
places) loaded with ``db.load`` on a fresh engine (four epochs, one per file; schema
creation included), against reading the same CSVs with Spark alone
(``spark.read.csv(...).count()`` of each file).

    python benchmarks/ingest.py [--runs 5] [--sizes 100,10000,1000000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time

from common import describe_session, engine_session, machine_facts, median, report

from pyspark.sql import functions as F

from factflow import Engine
from factflow.io.ldbc import CSV_OPTIONS, ldbc_file, find_ldbc, load_ldbc

QUERY = "[:find ?p ?name :where [?p :person/place ?c] [?c :place/name ?name]]"
SCHEMA = "e long, a string, v long"


class Arrivals:
    """Counts result rows delivered, and when the count reaches a target."""

    def __init__(self) -> None:
        self.rows = 0
        self.target = 0
        self.reached = threading.Event()
        self.lock = threading.Lock()

    def expect(self, rows: int) -> None:
        with self.lock:
            self.rows, self.target = 0, rows
            self.reached.clear()

    def add(self, rows: int) -> None:
        with self.lock:
            self.rows += rows
            if self.rows >= self.target:
                self.reached.set()


def stage(spark, staging: str, size: int, first: int, places: int, seed: int) -> str:
    """A CSV file of ``size`` facts ``[person :person/place place]`` written by Spark; returns its path."""
    out = os.path.join(staging, f"w{first}")
    (spark.range(first, first + size, numPartitions=1)
     .select(F.col("id").alias("e"), F.lit(":person/place").alias("a"),
             (F.floor(F.rand(seed) * places)).cast("long").alias("v"))
     .write.csv(out))
    return next(os.path.join(out, f) for f in os.listdir(out) if f.startswith("part-") and f.endswith(".csv"))


def deliver(staged: str, watched: str, arrivals: Arrivals, rows: int, timeout: float = 1800) -> float:
    """Move ``staged`` into ``watched``; seconds until ``rows`` result rows have arrived."""
    arrivals.expect(rows)
    target = os.path.join(watched, os.path.basename(os.path.dirname(staged)) + ".csv")
    started = time.perf_counter()
    os.rename(staged, target)
    if not arrivals.reached.wait(timeout):
        raise SystemExit(f"no result for {target} after {timeout} s")
    return time.perf_counter() - started


def run_ingest(spark, sizes, runs, work) -> dict:
    """Latency and throughput per batch size, factflow ingest and plain Structured Streaming."""
    root = find_ldbc()
    places_path = ldbc_file(root, "place_0_0.csv")
    places = spark.read.options(**CSV_OPTIONS).csv(places_path).select(F.col("id").cast("long").alias("id"), "name").cache()
    n_places = places.count()
    db = Engine(spark=spark)
    db.create_attribute(":person/place", type="ref", semantics="one")
    db.create_attribute(":place/name", type="string", semantics="one")
    db.load(places_path, entity="id", attributes={":place/name": "name"}, options=CSV_OPTIONS)
    ours, theirs = Arrivals(), Arrivals()
    query = db.query(QUERY)
    query.subscribe(lambda epoch, changes: ours.add(len(changes)))  # new persons: every change is an addition
    dirs = {k: os.path.join(work, k) for k in ("staging", "factflow", "spark", "ck-factflow", "ck-spark")}
    for d in ("staging", "factflow", "spark"):
        os.makedirs(dirs[d])
    stream = db.ingest(spark.readStream.schema(SCHEMA).csv(dirs["factflow"]), source="bench",
                       checkpoint=dirs["ck-factflow"])

    def plain_batch(batch, batch_id):
        theirs.add(batch.toArrow().num_rows)

    joined = (spark.readStream.schema(SCHEMA).csv(dirs["spark"])
              .join(places, F.col("v") == F.col("id")).select(F.col("e").alias("p"), "name"))
    plain = joined.writeStream.foreachBatch(plain_batch).option("checkpointLocation", dirs["ck-spark"]).start()
    figures = {}
    first = 10**12
    try:
        for size in sizes:
            times = {"factflow": [], "spark": []}
            count = runs if size <= 10_000 else 1
            for i in range(count + (2 if size <= 10_000 else 0)):  # two warm-up batches for the small sizes
                staged = {k: stage(spark, dirs["staging"], size, first + j * size, n_places, seed=i)
                          for j, k in enumerate(("f", "s"))}
                first += 2 * size
                # alternate which goes first; the same facts (entity ids aside) for both
                order = [("factflow", staged["f"], dirs["factflow"], ours), ("spark", staged["s"], dirs["spark"], theirs)]
                for name, path, watched, arrivals in (order if i % 2 == 0 else order[::-1]):
                    seconds = deliver(path, watched, arrivals, size)
                    if size > 10_000 or i >= 2:
                        times[name].append(seconds)
            last = db.epoch_log[-1]
            phases = {k: round(v, 2) for k, v in last.phases.items()}
            f, s = median(times["factflow"]), median(times["spark"])
            figures[f"ingest {size} facts"] = {
                "factflow latency s (median)": round(f, 3), "spark latency s (median)": round(s, 3),
                "factflow facts/s": round(size / f), "spark facts/s": round(size / s),
                "ratio factflow/spark": round(f / s, 2), "batches": len(times["factflow"]),
                "last epoch s": round(last.seconds, 2), "last epoch phases s": phases,
                "last epoch jobs": len(last.jobs)}
            print(f"  {size:>9} facts: factflow {f:.3f} s ({size / f:,.0f} facts/s), "
                  f"spark {s:.3f} s ({size / s:,.0f} facts/s), ratio {f / s:.2f}; last epoch "
                  f"{last.seconds:.2f} s {phases}, {len(last.jobs)} jobs", flush=True)
    finally:
        stream.stop()
        plain.stop()
        db.close()
        places.unpersist()
    return figures


def run_load(spark, runs) -> dict:
    """load_ldbc with db.load against counting the same CSVs with Spark alone."""
    root = find_ldbc()
    files = [ldbc_file(root, n) for n in ("person_0_0.csv", "person_knows_person_0_0.csv",
                                      "person_isLocatedIn_place_0_0.csv", "place_0_0.csv")]
    ours, theirs, facts = [], [], 0
    for i in range(runs):
        started = time.perf_counter()
        with Engine(spark=spark) as db:
            load_ldbc(db)
            ours.append(time.perf_counter() - started)
            facts = db.stats()["shared_tuples"]
        started = time.perf_counter()
        rows = sum(spark.read.options(**CSV_OPTIONS).csv(path).count() for path in files)
        theirs.append(time.perf_counter() - started)
    f, s = median(ours), median(theirs)
    print(f"  load LDBC tiny: db.load {f:.2f} s, Spark count {s:.2f} s, ratio {f / s:.1f} ({rows} rows, {facts} facts)")
    return {"load LDBC tiny": {"db.load s (median)": round(f, 2), "spark count s (median)": round(s, 2),
                               "ratio": round(f / s, 1), "rows": rows, "facts arranged": facts, "runs": runs}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="measured batches per small size, and loads")
    parser.add_argument("--sizes", default="100,10000,1000000", help="facts per micro-batch")
    parser.add_argument("--no-load", action="store_true", help="skip the load part")
    args = parser.parse_args()
    spark = engine_session()
    print(f"session: {describe_session(spark)}; load average {os.getloadavg()}")
    work = tempfile.mkdtemp(prefix="factflow-bench-ingest-")
    try:
        figures = {} if args.no_load else run_load(spark, args.runs)
        figures.update(run_ingest(spark, [int(s) for s in args.sizes.split(",")], args.runs, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures["load average after"] = os.getloadavg()
    report("ingest", machine_facts(spark), figures)
    spark.stop()


if __name__ == "__main__":
    main()
