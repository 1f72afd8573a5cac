"""Incremental versus recompute: the two-hop query over the Facebook graph.

Loads ../shared/data/graphs/facebook_combined.txt as ``:edge`` facts, installs
``[:find ?a ?c :where [?a :edge ?b] [?b :edge ?c]]`` (its result stays in Spark; the
subscription only sees changes), then applies epochs of random edge changes (half new
edges, half retractions of existing ones). Each epoch is also answered the way a Spark
user would without factflow: apply the changes to a cached edge DataFrame and recompute
the distinct two-hop pairs from scratch (counted, so the baseline does not even pay for
writing its result). Reports medians, their ratio, the Spark jobs per epoch and what
they read, and the install-on-loaded-data versus load-and-install figures.

    python benchmarks/twohop.py [--epochs 20] [--changes 100]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections import Counter

from common import GRAPHS, machine_facts, median, report, session, timed, trivial_job_seconds
from pyspark.sql import functions as F

from factflow import Engine
from factflow.io.graphs import edge_facts, read_edges

TWO_HOP = "[:find ?a ?c :where [?a :edge ?b] [?b :edge ?c]]"


def load(spark, path: str) -> Engine:
    db = Engine(spark=spark)
    db.create_attribute(":edge", type="ref")
    db.transact(edge_facts(spark, path))
    return db


def recompute(spark, edges) -> int:
    """The two-hop query in plain PySpark: a self-join and a distinct, counted."""
    a, b = edges.alias("a"), edges.alias("b")
    pairs = a.join(b, F.col("a.dst") == F.col("b.src")).select(F.col("a.src"), F.col("b.dst"))
    return pairs.distinct().count()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--graph", default=os.path.join(GRAPHS, "facebook_combined.txt"))
    args = parser.parse_args()
    spark = session()
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    figures: dict = {"graph": os.path.basename(args.graph)}

    load_s, db = timed(lambda: load(spark, args.graph))
    install_s, q = timed(lambda: db.query(TWO_HOP, name="twohop"))
    size = q.frame().count()
    delivered = Counter()
    q.subscribe(lambda epoch, changes: delivered.update(dict(changes)))
    figures.update(load_s=round(load_s, 2), install_s=round(install_s, 2), result_rows=size)

    # The baseline keeps the same edges in a cached DataFrame and applies the same changes.
    base = read_edges(spark, args.graph).repartition(partitions).cache()
    edges = {tuple(r) for r in base.collect()}
    nodes = sorted({n for e in edges for n in e})
    rng = random.Random(11)
    inc, rec, jobs, reads, phases = [], [], [], [], []
    current = base
    for _ in range(args.epochs):
        removed = rng.sample(sorted(edges), args.changes // 2)
        added = set()
        while len(added) < args.changes - len(removed):
            e = (rng.choice(nodes), rng.choice(nodes))
            if e not in edges:
                added.add(e)
        tx = [[":db/retract", s, ":edge", d] for s, d in removed] + [[":db/add", s, ":edge", d] for s, d in added]
        edges.difference_update(removed)
        edges.update(added)
        seconds, _ = timed(lambda: db.transact(tx))
        r = db.epoch_log[-1]
        inc.append(seconds)
        jobs.append(len(r.jobs))
        reads.append(sum(j.rows_read for j in r.jobs))
        phases.append(r.phases)

        gone = spark.createDataFrame(removed, "src long, dst long")
        new = spark.createDataFrame(sorted(added), "src long, dst long")
        nxt = current.subtract(gone).unionByName(new).repartition(partitions).cache()
        seconds, count = timed(lambda: recompute(spark, nxt))
        current.unpersist()
        current = nxt
        rec.append(seconds)

    assert count == q.frame().count(), "incremental and recomputed results differ in size"
    warm = slice(2, None)
    figures.update(
        epochs=args.epochs, changes_per_epoch=args.changes,
        incremental_median_s=round(median(inc[warm]), 3), incremental_max_s=round(max(inc[warm]), 3),
        recompute_median_s=round(median(rec[warm]), 3),
        speedup_median=round(median(rec[warm]) / median(inc[warm]), 1),
        spark_jobs_per_epoch_median=median(jobs[warm]),
        rows_read_per_epoch_median=median(reads[warm]),
        phases_median_s={k: round(median([p[k] for p in phases[warm]]), 3) for k in phases[-1]},
        result_rows_after=count, changes_delivered=sum(abs(d) for d in delivered.values()),
        trivial_spark_job_s=round(trivial_job_seconds(spark), 4),
    )
    print(db.epoch_log[-1].describe())
    stats = db.stats()
    figures["shared_tuples"], figures["query_tuples"] = stats["shared_tuples"], stats["query_tuples"]

    # The shared-arrangement win: a second query on loaded data versus a fresh load + install.
    second = "[:find ?a ?c :where [?a :edge ?b] [?b :edge ?c] [(< ?a ?c)]]"
    figures["install_on_loaded_s"] = round(timed(lambda: db.query(second, name="twohop-lt"))[0], 2)
    db.close()
    base.unpersist()
    current.unpersist()
    started = time.perf_counter()
    fresh = load(spark, args.graph)
    fresh.query(second, name="twohop-lt")
    figures["load_and_install_fresh_s"] = round(time.perf_counter() - started, 2)
    figures["install_ratio"] = round(figures["load_and_install_fresh_s"] / figures["install_on_loaded_s"], 1)
    fresh.close()
    report("twohop", machine_facts(spark), figures)


if __name__ == "__main__":
    main()
