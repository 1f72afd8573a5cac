"""Recursion whose sets outgrow the driver: they stay in Spark (issue 35, item 3).

Two cases, each in a fresh process with a default engine (``factflow.Engine()``: local
mode on every core, a 2 GiB driver, ``fetch_limit`` a million rows):

``reach``: reachability from 1,000 sources over gnp10K (``src,dst`` lines, 100,185 edges,
10,000 nodes), ``[:find ?x ?y :in $ [?x ...] :where (reach ?x ?y)]`` with the right-linear
``reach`` rules; the closure holds about ten million pairs. The query is installed, then
maintained under 20 epochs of 10 edge retractions (random present edges) and 10 additions
(random absent edges). After every epoch the number of targets per source must equal a
breadth-first search from each source computed here with numpy (no factflow, no Spark),
and after the last epoch the full set of pairs must. Recorded: the install's time, each
epoch's time (median, max), the Spark jobs of each, and the peak driver memory: this
process's resident set, the JVM's resident set (its peak, from /proc) and the JVM's used
heap (sampled every 0.2 s). For scale, the same install is computed once more by the
semi-naive loop a Spark user would write with DataFrames (below), in the same session.

``grid``: the full transitive closure of grid150 (``tc`` left-linear, 45,300 edges of a
151x151 grid: 131,675,775 pairs) against that loop: ``delta = delta.join(edges).select(x,
y).distinct().subtract(total)``, the new pairs and the running total checkpointed every
iteration (a local checkpoint, then counted), until ``delta`` is empty. Each runs under a
time limit (its jobs cancelled past it). Where one finishes, its count is checked against
the grid's (131,675,775 for the whole of it, the data README's figure) and 1,000 random
pairs of its result against the grid's geometry: the file's node ids carry no position,
so each node's row and column are found here from undirected hops to two corners, every
edge checked to step right or down, and a pair (a, b) is in the closure iff b is at or
right of and at or below a, and b != a. ``--side N`` runs the same on the N x N corner
of the grid (the first N rows and columns: ``2N(N-1)`` edges, closure
``(N(N+1)/2)^2 - N^2`` pairs), to find the largest grid that finishes when the full one
does not.

    python benchmarks/large_recursion.py reach [--sources 1000] [--epochs 20] [--changes 10]
    python benchmarks/large_recursion.py grid [--side 151] [--limit 1800] [--skip-factflow] [--skip-dataframes]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import threading
import time

import numpy as np
import pandas as pd
from pyspark.sql import functions as F

from common import GRAPHS, describe_session, jobs_so_far, jvm_used_bytes, limited, machine_facts, median, report

import factflow
from factflow.io.graphs import edge_facts, read_edges

REACH = "[[(reach ?x ?y) [?x :edge ?y]] [(reach ?x ?y) [?x :edge ?z] (reach ?z ?y)]]"
REACH_QUERY = "[:find ?x ?y :in $ [?x ...] :where (reach ?x ?y)]"
TC = "[[(tc ?a ?b) [?a :edge ?b]] [(tc ?a ?b) (tc ?a ?c) [?c :edge ?b]]]"
TC_QUERY = "[:find ?a ?b :where (tc ?a ?b)]"
GRID_PAIRS = 131_675_775
GRID_SIDE = 151


# ---------------------------------------------------------------- measuring
class Memory:
    """Peak memory of the driver: this process's resident set, the JVM's resident set and
    the JVM's used heap (sampled on a thread)."""

    def __init__(self, spark, interval: float = 0.2):
        self._spark = spark
        self._pid = spark.sparkContext._gateway.proc.pid
        self.heap_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval,), daemon=True)
        self._thread.start()

    def _sample(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                used = jvm_used_bytes(self._spark)
            except Exception:  # noqa: BLE001 - the session is stopping
                return
            self.heap_peak = max(self.heap_peak, used)

    def figures(self) -> dict:
        """Peaks so far, in MiB."""
        with open(f"/proc/{self._pid}/status") as status:
            jvm_rss = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        return {"python_rss_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                "jvm_rss_peak_mib": round(jvm_rss / 1024), "jvm_heap_used_peak_mib": round(self.heap_peak / 2**20)}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- the baseline
def dataframe_closure(spark, edges, seeds) -> tuple[int, int, list]:
    """The semi-naive loop a Spark user would write with DataFrames: ``seeds`` (x, y) pairs,
    then ``delta.join(edges).select(x, y).distinct().subtract(total)`` until nothing is
    new, the new pairs and the running total checkpointed each iteration. Returns the
    pairs, the iterations and the last total (a checkpointed DataFrame of x, y)."""
    total = seeds.distinct().localCheckpoint()
    delta = total
    iterations = 0
    while True:
        iterations += 1
        new = (delta.join(edges, delta.y == edges.src).select(delta.x, edges.dst.alias("y"))
               .distinct().subtract(total).localCheckpoint())
        if new.count() == 0:
            return total.count(), iterations, total
        total = total.union(new).localCheckpoint()
        delta = new


# ---------------------------------------------------------------- reach from sources
def successors(edges: set[tuple[int, int]], nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """The edges as compressed rows: node n's successors are ``targets[offsets[n]:offsets[n + 1]]``."""
    pairs = np.array(sorted(edges), dtype=np.int64).reshape(-1, 2)
    return np.searchsorted(pairs[:, 0], np.arange(nodes + 1)), pairs[:, 1]


def bfs_reach(graph: tuple[np.ndarray, np.ndarray], sources: list[int], nodes: int) -> dict[int, np.ndarray]:
    """Per source, the nodes reachable from it by one or more edges (numpy, level by level)."""
    offsets, targets = graph
    out = {}
    for source in sources:
        seen = np.zeros(nodes, dtype=bool)
        frontier = np.array([source])
        while len(frontier):
            starts, counts = offsets[frontier], offsets[frontier + 1] - offsets[frontier]
            positions = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
            following = np.unique(targets[positions])
            frontier = following[~seen[following]]
            seen[frontier] = True
        out[source] = np.flatnonzero(seen)
    return out


def reach_case(args) -> None:
    db = factflow.Engine()
    spark = db.spark
    memory = Memory(spark)
    path = os.path.join(GRAPHS, "gnp10K.csv")
    frame = pd.read_csv(path, names=["src", "dst"])
    nodes = int(max(frame.src.max(), frame.dst.max())) + 1
    edges = set(zip(frame.src.tolist(), frame.dst.tolist()))
    rng = random.Random(args.seed)
    sources = sorted(rng.sample(sorted(set(frame.src.tolist())), args.sources))
    figures: dict = {"session": describe_session(spark), "sources": len(sources), "edges": len(edges),
                     "fetch_limit": db.config.fetch_limit}
    db.create_attribute(":edge", type="ref")
    started = time.perf_counter()
    db.transact(edge_facts(spark, path))
    figures["load_s"] = round(time.perf_counter() - started, 2)
    db.register(REACH)

    def check(q, label: str, full: bool = False) -> int:
        """Compare the query with the BFS oracle: pairs per source (and every pair)."""
        expected = bfs_reach(successors(edges, nodes), sources, nodes)
        result = q.frame()
        got = {int(r.x): int(r["count"]) for r in result.groupBy("x").count().collect()}
        wanted = {s: len(t) for s, t in expected.items() if len(t)}
        if got != wanted:
            wrong = sorted(s for s in set(got) | set(wanted) if got.get(s) != wanted.get(s))
            raise AssertionError(f"{label}: pairs per source differ for {len(wrong)} sources, e.g. {wrong[:5]}")
        if full:
            pairs = result.select((F.col("x") * nodes + F.col("y")).alias("p")).toArrow().column("p").to_numpy()
            oracle = np.concatenate([s * nodes + t for s, t in expected.items()])
            if not np.array_equal(np.sort(pairs), np.sort(oracle)):
                raise AssertionError(f"{label}: the pairs differ from the BFS oracle")
        return sum(wanted.values())

    before = jobs_so_far(spark)
    started = time.perf_counter()
    q = db.query(REACH_QUERY, inputs=[sources], name="reach")
    figures["install_s"] = round(time.perf_counter() - started, 1)
    db.wait_for_maintenance()
    figures["install_jobs"] = jobs_so_far(spark) - before
    figures["pairs"] = check(q, "install")
    figures["memory_after_install"] = memory.figures()
    print("install", figures, flush=True)
    times, jobs, changes = [], [], []
    for epoch in range(args.epochs):
        gone = rng.sample(sorted(edges), args.changes)
        added = set()
        while len(added) < args.changes:
            edge = (rng.randrange(nodes), rng.randrange(nodes))
            if edge not in edges and edge[0] != edge[1]:
                added.add(edge)
        tx = [[":db/retract", a, ":edge", b] for a, b in gone] + [[":db/add", a, ":edge", b] for a, b in added]
        before = jobs_so_far(spark)
        started = time.perf_counter()
        db.transact(tx)
        times.append(time.perf_counter() - started)
        db.wait_for_maintenance()
        jobs.append(jobs_so_far(spark) - before)
        edges.difference_update(gone)
        edges.update(added)
        changes.append(db.epoch_log[-1].changes)
        last = epoch == args.epochs - 1
        pairs = check(q, f"epoch {db.epoch}", full=last)
        print(f"epoch {db.epoch}: {times[-1]:.1f} s, {jobs[-1]} jobs, {pairs} pairs"
              f"{' (every pair checked)' if last else ''}", flush=True)
    figures.update({"epochs": len(times), "epoch_median_s": round(median(times), 1),
                    "epoch_max_s": round(max(times), 1), "epoch_min_s": round(min(times), 1),
                    "epoch_jobs_median": median(jobs), "epoch_jobs_max": max(jobs),
                    "pairs_after_last_epoch": pairs, "checked": "pairs per source after every epoch, "
                                                               "every pair after the last"})
    figures["memory_peak"] = memory.figures()
    q.close()
    if not args.skip_dataframes:
        spark.sparkContext.setJobDescription("semi-naive loop with DataFrames")
        edge_frame = read_edges(spark, path).localCheckpoint()
        seeds = (spark.createDataFrame(pd.DataFrame({"x": sources})).join(edge_frame, F.col("x") == edge_frame.src)
                 .select("x", edge_frame.dst.alias("y")))
        started = time.perf_counter()
        count, iterations, _ = dataframe_closure(spark, edge_frame, seeds)
        figures["dataframe_loop_install_s"] = round(time.perf_counter() - started, 1)
        figures["dataframe_loop"] = f"{count} pairs (from the final edges) in {iterations} iterations"
    memory.stop()
    db.close()
    report(f"large-recursion-reach-{args.sources}", machine_facts(spark), figures)


# ---------------------------------------------------------------- grid150's closure
def undirected_distances(frame: pd.DataFrame, start: int, nodes: int) -> np.ndarray:
    """Hops from ``start`` to every node, edges taken both ways (numpy, level by level)."""
    both = pd.concat([frame, frame.rename(columns={"src": "dst", "dst": "src"})]).sort_values("src")
    offsets = np.searchsorted(both.src.to_numpy(), np.arange(nodes + 1))
    targets = both.dst.to_numpy()
    distance = np.full(nodes, -1)
    distance[start] = 0
    frontier, level = np.array([start]), 0
    while len(frontier):
        level += 1
        following = np.unique(np.concatenate([targets[offsets[n]:offsets[n + 1]] for n in frontier]))
        frontier = following[distance[following] < 0]
        distance[frontier] = level
    return distance


def grid_coordinates(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of every node of grid150, whose node ids carry no position: the
    corner without predecessors is (0, 0), a corner with one edge in and one out is taken
    as (0, 150), and undirected hops from them give ``r + c`` and ``r + 150 - c``. Every
    edge must then step one to the right or one down (checked)."""
    nodes = int(max(frame.src.max(), frame.dst.max())) + 1
    ins, outs = np.bincount(frame.dst, minlength=nodes), np.bincount(frame.src, minlength=nodes)
    origin = int(np.flatnonzero((ins == 0) & (outs == 2))[0])
    corner = int(np.flatnonzero((ins == 1) & (outs == 1))[0])
    d0, d1 = undirected_distances(frame, origin, nodes), undirected_distances(frame, corner, nodes)
    rows, cols = (d0 + d1 - (GRID_SIDE - 1)) // 2, (d0 - d1 + (GRID_SIDE - 1)) // 2
    steps = set(zip(rows[frame.dst] - rows[frame.src], cols[frame.dst] - cols[frame.src]))
    if steps != {(0, 1), (1, 0)} or rows.min() < 0 or rows.max() != GRID_SIDE - 1:
        raise AssertionError(f"grid150 is not the grid its README describes (steps {steps})")
    return rows, cols


def grid_case(args) -> None:
    db = factflow.Engine()
    spark = db.spark
    memory = Memory(spark)
    side = args.side
    frame = pd.read_csv(os.path.join(GRAPHS, "grid150.csv"), names=["src", "dst"])
    rows, cols = grid_coordinates(frame)
    inside = (rows < side) & (cols < side)
    frame = frame[inside[frame.src] & inside[frame.dst]]
    expected_pairs = (side * (side + 1) // 2) ** 2 - side * side
    figures: dict = {"session": describe_session(spark), "side": side, "edges": len(frame),
                     "expected_pairs": expected_pairs, "limit_s": args.limit}
    if len(frame) != 2 * side * (side - 1):
        raise AssertionError(f"{len(frame)} edges in the {side}x{side} corner, expected {2 * side * (side - 1)}")
    if side == GRID_SIDE and expected_pairs != GRID_PAIRS:
        raise AssertionError("the grid's closure formula disagrees with the data README")
    edges = spark.createDataFrame(frame.astype("int64")).localCheckpoint()

    def sampled(result) -> str:
        """1,000 random pairs of the result, each checked against the grid's geometry."""
        picked = result.sample(fraction=min(1.0, 3000 / expected_pairs), seed=args.seed).limit(1000).collect()
        for a, b in ((int(r[0]), int(r[1])) for r in picked):
            if not (rows[b] >= rows[a] and cols[b] >= cols[a] and a != b and inside[a] and inside[b]):
                raise AssertionError(f"({a}, {b}) is not in the closure of the {side}x{side} grid")
        return f"{len(picked)} random pairs checked"

    if not args.skip_factflow:
        db.create_attribute(":edge", type="ref")
        db.transact(edges.select(F.col("src").alias("e"), F.lit(":edge").alias("a"), F.col("dst").alias("v")))
        db.register(TC)
        before = jobs_so_far(spark)
        seconds, q = limited(spark, lambda: db.query(TC_QUERY, name="tc"), args.limit)
        entry = {"jobs": jobs_so_far(spark) - before}
        if seconds is None:
            entry["outcome"] = q
        else:
            result = q.frame()
            pairs = result.count()
            entry.update({"seconds": round(seconds, 1), "pairs": pairs, "count_ok": pairs == expected_pairs,
                          "sample": sampled(result)})
            q.close()
        entry["memory_peak"] = memory.figures()
        figures["factflow"] = entry
        print("factflow", entry, flush=True)
    if not args.skip_dataframes:
        spark.sparkContext.setJobDescription("semi-naive loop with DataFrames")
        seeds = edges.select(F.col("src").alias("x"), F.col("dst").alias("y"))
        before = jobs_so_far(spark)
        seconds, outcome = limited(spark, lambda: dataframe_closure(spark, edges, seeds), args.limit)
        entry = {"jobs": jobs_so_far(spark) - before}
        if seconds is None:
            entry["outcome"] = outcome
        else:
            pairs, iterations, total = outcome
            entry.update({"seconds": round(seconds, 1), "pairs": pairs, "iterations": iterations,
                          "count_ok": pairs == expected_pairs, "sample": sampled(total)})
        entry["memory_peak"] = memory.figures()
        figures["dataframe_loop"] = entry
        print("dataframes", entry, flush=True)
    memory.stop()
    db.close()
    report(f"large-recursion-grid{side}", machine_facts(spark), figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=["reach", "grid"])
    parser.add_argument("--sources", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--changes", type=int, default=10, help="edges retracted and added per epoch")
    parser.add_argument("--side", type=int, default=GRID_SIDE, help="grid: the corner's side (151: all of it)")
    parser.add_argument("--limit", type=float, default=1800.0, help="grid: seconds each evaluation may take")
    parser.add_argument("--skip-factflow", action="store_true")
    parser.add_argument("--skip-dataframes", action="store_true")
    parser.add_argument("--seed", type=int, default=35)
    args = parser.parse_args()
    (reach_case if args.case == "reach" else grid_case)(args)


if __name__ == "__main__":
    main()
