"""Skew and join order (thesis figures 6-7, seeds 004): triangles over oregon1 streamed in node order.

The directed triangle pattern ``[?a :edge ?b] [?b :edge ?c] [?a :edge ?c]`` is installed
on an empty engine, then the graph arrives in node order: each epoch adds all out-edges
of the next ``--batch`` nodes (each epoch's transaction is a Spark DataFrame filtered from
the cached edge list). Variants: binary joins in the three clause orders, delta and wco.
For each: per-epoch completion times (p50, p99, max), the total time, the private state
the query ended with, and the final number of matches, which must equal the known count
(102,864 directed matches = 6 x 17,144 triangles) when the whole graph was streamed. A
variant that exceeds ``--limit`` seconds is stopped and reported as not finished.

Per-node epochs over the whole graph would be 10,670 epochs per variant (hours at Spark's
fixed cost per epoch on 2 cores), so the default run streams the whole graph in batches
of 100 nodes and, with ``--window N``, also the first N nodes one per epoch (its count is
checked against a plain Spark count of the same subgraph). Writes a CCDF plot (PNG).

    python benchmarks/triangles.py [--batch 100] [--window 200] [--limit 900] [--plot docs/triangles_ccdf.png]
"""

from __future__ import annotations

import argparse
import os
import time

from common import GRAPHS, ROOT, machine_facts, median, percentile, report, session

from pyspark.sql import Window
from pyspark.sql import functions as F

from factflow import Engine
from factflow.io.graphs import read_edges

KNOWN_MATCHES = 102_864
VARIANTS = {
    "binary ab-bc-ac": ("[?a :edge ?b] [?b :edge ?c] [?a :edge ?c]", "binary"),
    "binary ab-ac-bc": ("[?a :edge ?b] [?a :edge ?c] [?b :edge ?c]", "binary"),
    "binary bc-ac-ab": ("[?b :edge ?c] [?a :edge ?c] [?a :edge ?b]", "binary"),
    "delta": ("[?a :edge ?b] [?b :edge ?c] [?a :edge ?c]", "delta"),
    "wco": ("[?a :edge ?b] [?b :edge ?c] [?a :edge ?c]", "wco"),
}


def batched(edges, batch: int):
    """Edges with the number of the epoch (a batch of ``batch`` nodes in node order) they arrive in."""
    rank = F.dense_rank().over(Window.orderBy("src"))
    return edges.withColumn("epoch", ((rank - 1) / batch).cast("int")).cache()


def matches(edges) -> int:
    """Directed triangle matches a->b, b->c, a->c counted in plain Spark."""
    ab, bc, ac = edges.alias("ab"), edges.alias("bc"), edges.alias("ac")
    return (ab.join(bc, F.col("ab.dst") == F.col("bc.src"))
            .join(ac, (F.col("ac.src") == F.col("ab.src")) & (F.col("ac.dst") == F.col("bc.dst"))).count())


def stream(spark, edges, epochs: int, clauses: str, join: str, limit: float) -> dict:
    db = Engine(spark=spark)
    db.create_attribute(":edge", type="ref")
    q = db.query(f"[:find ?a ?b ?c :where {clauses}]", name="triangles", join=join)
    times, started = [], time.perf_counter()
    for k in range(epochs):
        facts = edges.where(F.col("epoch") == k).select(F.col("src").alias("e"), F.lit(":edge").alias("a"),
                                                         F.col("dst").alias("v"))
        t0 = time.perf_counter()
        db.transact(facts)
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - started > limit and k + 1 < epochs:
            break
    stats = db.stats()
    out = {"epochs_done": len(times), "epochs": epochs, "finished": len(times) == epochs,
           "total_s": round(sum(times), 1), "p50_s": round(median(times), 3),
           "p99_s": round(percentile(times, 99), 3), "max_s": round(max(times), 3),
           "matches": q.frame().count(), "private_tuples": stats["query_tuples"]["triangles"],
           "shared_tuples": stats["shared_tuples"], "times": [round(t, 4) for t in times]}
    db.close()
    return out


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in results if results[k]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for name, r in results[panel].items():
            xs = sorted(r["times"])
            ys = [1 - i / len(xs) for i in range(len(xs))]
            label = name + ("" if r["finished"] else f" (stopped after {r['epochs_done']} epochs)")
            ax.step(xs, ys, where="post", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("epoch completion time (s)")
        ax.set_ylabel("fraction of epochs taking at least x")
        ax.set_title(f"oregon1 triangles, {panel}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default=os.path.join(GRAPHS, "oregon1_010331.txt"))
    parser.add_argument("--batch", type=int, default=100, help="nodes per epoch over the whole graph")
    parser.add_argument("--window", type=int, default=0, help="also stream the first N nodes one per epoch")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds per variant before it is stopped")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "triangles_ccdf.png"))
    args = parser.parse_args()
    spark = session()
    edges = read_edges(spark, args.graph).cache()
    chosen = [v.strip() for v in args.variants.split(",")]
    results: dict = {f"batches of {args.batch} nodes": {}, "one node per epoch": {}}
    runs = [(f"batches of {args.batch} nodes", batched(edges, args.batch), None)]
    if args.window:
        single = batched(edges, 1)
        runs.append(("one node per epoch", single.where(F.col("epoch") < args.window).cache(), args.window))
    for panel, frame, window in runs:
        epochs = frame.agg(F.max("epoch")).first()[0] + 1
        expected = KNOWN_MATCHES if window is None else matches(frame)
        for name in chosen:
            clauses, join = VARIANTS[name]
            r = stream(spark, frame, epochs, clauses, join, args.limit)
            r["expected_matches"] = expected
            r["correct"] = (r["matches"] == expected) if r["finished"] else None
            results[panel][name] = r
            print(f"{panel:>22} | {name:<20} epochs {r['epochs_done']}/{epochs} total {r['total_s']}s "
                  f"p50 {r['p50_s']}s p99 {r['p99_s']}s max {r['max_s']}s matches {r['matches']} "
                  f"(expected {expected}) private {r['private_tuples']}", flush=True)
    plot(results, args.plot)
    summary = {panel: {name: {k: v for k, v in r.items() if k != "times"} for name, r in rs.items()}
               for panel, rs in results.items()}
    report("triangles", machine_facts(spark), {"batch": args.batch, "window": args.window, "limit_s": args.limit,
                                              "plot": args.plot, "results": summary})


if __name__ == "__main__":
    main()
