"""Skew and join order (thesis figures 6-7, seeds 004): triangles over oregon1 streamed in node order.

The directed triangle pattern ``[?a :edge ?b] [?b :edge ?c] [?a :edge ?c]`` is installed
on an empty engine, then the graph arrives in node order: each epoch adds all out-edges
of the next ``--batch`` nodes (each epoch's transaction is a Spark DataFrame filtered from
the cached edge list). Variants: binary joins in the three clause orders, delta and wco.
For each: per-epoch completion times (p50, p99, max), the total time, the private state
the query ended with, and the final number of matches, which must equal the known count
(102,864 directed matches = 6 x 17,144 triangles) when the whole graph was streamed. Each
variant runs in its own process; one that exceeds ``--limit`` seconds is stopped and
reported with the epochs it completed.

Per-node epochs over the whole graph would be 10,670 epochs per variant (hours at Spark's
fixed cost per epoch on 2 cores), so the default run streams the whole graph in batches
of 100 nodes and, with ``--window N``, also the first N nodes one per epoch (its count is
checked against a plain Spark count of the same subgraph). Writes a CCDF plot (PNG), and
every epoch's time to ``benchmarks/results/triangles-epochs.json`` (compare two runs over
the epochs both completed with ``benchmarks/compare_epochs.py``).

    python benchmarks/triangles.py [--batch 100] [--window 200] [--limit 900] [--plot docs/triangles_ccdf.png]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import GRAPHS, RESULTS, ROOT, machine_facts, median, percentile, report, session

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


def stream(spark, edges, epochs: int, clauses: str, join: str, progress: str) -> None:
    """Stream the graph into a fresh engine, writing the figures to ``progress`` after every epoch."""
    db = Engine(spark=spark)
    db.create_attribute(":edge", type="ref")
    q = db.query(f"[:find ?a ?b ?c :where {clauses}]", name="triangles", join=join)
    out = {"epochs": epochs, "times": [], "jobs": [], "finished": False, "explain": q.explain()}
    for k in range(epochs):
        facts = edges.where(F.col("epoch") == k).select(F.col("src").alias("e"), F.lit(":edge").alias("a"),
                                                         F.col("dst").alias("v"))
        t0 = time.perf_counter()
        db.transact(facts)
        out["times"].append(round(time.perf_counter() - t0, 4))
        out["jobs"].append(len(db.epoch_log[-1].jobs))
        out["private_tuples"] = db.stats()["query_tuples"]["triangles"]
        _write(progress, out)
    stats = db.stats()
    out.update(finished=True, matches=q.frame().count(), shared_tuples=stats["shared_tuples"],
               facts=machine_facts(spark))
    _write(progress, out)
    db.close()


def _write(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle)
    os.replace(path + ".tmp", path)


def summarize(r: dict) -> dict:
    times = r["times"] or [0.0]
    return {"epochs_done": len(r["times"]), "epochs": r["epochs"], "finished": r["finished"],
            "total_s": round(sum(times), 1), "p50_s": round(median(times), 3),
            "p99_s": round(percentile(times, 99), 3), "max_s": round(max(times), 3),
            "median_jobs": median(r["jobs"] or [0]), "matches": r.get("matches"),
            "private_tuples_at_end": r.get("private_tuples")}


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in results if results[k]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for name, r in results[panel].items():
            xs = sorted(r["times"])
            if not xs:
                continue
            ys = [1 - i / len(xs) for i in range(len(xs))]
            label = name + ("" if r["finished"] else f" (stopped at the limit after {len(xs)} epochs)")
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


def child(args) -> None:
    """Run one variant on one panel (in its own process, so that the parent can stop it)."""
    spark = session()
    edges = batched(read_edges(spark, args.graph), args.batch if args.panel == "batch" else 1)
    if args.panel == "window":
        edges = edges.where(F.col("epoch") < args.window).cache()
    epochs = edges.agg(F.max("epoch")).first()[0] + 1
    clauses, join = VARIANTS[args.child]
    stream(spark, edges, epochs, clauses, join, args.out)


def expected_window_matches(args) -> int:
    spark = session()
    edges = batched(read_edges(spark, args.graph), 1).where(F.col("epoch") < args.window)
    count = matches(edges)
    spark.stop()
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default=os.path.join(GRAPHS, "oregon1_010331.txt"))
    parser.add_argument("--batch", type=int, default=100, help="nodes per epoch over the whole graph")
    parser.add_argument("--window", type=int, default=0, help="also stream the first N nodes one per epoch")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds per variant before it is stopped")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "triangles_ccdf.png"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--panel", default="batch", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    chosen = [v.strip() for v in args.variants.split(",")]
    panels = [("batch", f"batches of {args.batch} nodes", KNOWN_MATCHES)]
    if args.window:
        panels.append(("window", f"first {args.window} nodes, one per epoch", expected_window_matches(args)))
    results: dict = {title: {} for _, title, _ in panels}
    facts: dict = {}
    work = tempfile.mkdtemp(prefix="factflow-triangles-")
    for panel, title, expected in panels:
        for name in chosen:
            out = os.path.join(work, f"{panel}-{len(results[title])}.json")
            command = [sys.executable, "-u", os.path.abspath(__file__), "--child", name, "--panel", panel,
                       "--out", out, "--graph", args.graph, "--batch", str(args.batch), "--window", str(args.window)]
            try:
                subprocess.run(command, timeout=args.limit, check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                pass  # the child is killed; its progress file says how far it got
            r = json.load(open(out)) if os.path.exists(out) else {"epochs": None, "times": [], "jobs": [],
                                                                 "finished": False}
            facts = r.get("facts", facts)
            r["expected_matches"] = expected
            results[title][name] = r
            s = summarize(r)
            correct = "" if not s["finished"] else ("  correct" if s["matches"] == expected else "  WRONG COUNT")
            print(f"{title} | {name:<16} epochs {s['epochs_done']}/{s['epochs']} total {s['total_s']}s "
                  f"p50 {s['p50_s']}s p99 {s['p99_s']}s max {s['max_s']}s jobs/epoch {s['median_jobs']} "
                  f"matches {s['matches']} (expected {expected}){correct} private {s['private_tuples_at_end']}",
                  flush=True)
    plot(results, args.plot)
    summary = {title: {name: {**summarize(r), "expected_matches": r["expected_matches"]} for name, r in rs.items()}
               for title, rs in results.items()}
    report("triangles", facts, {"batch": args.batch, "window": args.window, "limit_s": args.limit,
                                "plot": args.plot, "results": summary})
    with open(os.path.join(RESULTS, "triangles-epochs.json"), "w") as handle:  # for compare_epochs.py
        json.dump({title: {name: r["times"] for name, r in rs.items()} for title, rs in results.items()}, handle)


if __name__ == "__main__":
    main()
