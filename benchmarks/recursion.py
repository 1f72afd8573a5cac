"""Recursion and goal-directed evaluation: the shape of Table 3 of the Shared Arrangements paper.

For each graph (tree11, grid150, gnp10K, loaded as ``:edge`` facts) and each query

- ``tc(x,?)``: ``(tc x ?y)``, transitive closure from one source,
- ``tc(?,x)``: ``(tc ?y x)``, transitive closure to one target (the same rule),
- ``sg(x,?)``: ``(sg x ?y)``, same generation,

installs the goal-directed query for random arguments (seeded; sources with outgoing
edges, targets and sg arguments with incoming ones), one query at a time, and measures
the install time and the time of one update epoch (add one random edge, retract one
random edge) with the query installed; medians and maxima over the arguments. Next to
them, the full bottom-up evaluation of the same rule (``[:find ?a ?b :where (tc ?a
?b)]``, once for both tc queries) within a time limit (cancelled and reported as "did not finish in N s" past it).
An install that does not finish within its own limit is cancelled, reported, and
counted as slower than the limit in the median; if a query's first install does not
finish, its remaining arguments are skipped. Where the full evaluation finishes, a second query
reading the same rule is installed beside it: the rule is shared, so that install reads
the maintained closure instead of deriving it again.
For the transitive-closure queries, each argument is also answered the way a Spark user
would without factflow: a breadth-first search over a cached edge DataFrame, one Spark
job per level (``spark_bfs``); that is
also what such a user pays again after every change, so it is the baseline for both the
install and the update. Each update is undone (untimed) after it, so the graph stays the
file's graph and the baseline's node count must equal the query's result size.
Finally, on tree11, the time to retract 100 random edges one epoch at a time from a
maintained ``tc(x,?)`` whose closure holds a few thousand nodes (median and total).

``tc`` is written left-linear, which suits a bound source; for a bound target the
planner turns it around into the right-linear form (factflow/planner/linear.py), so
both directions keep their demand at the argument.

    python benchmarks/recursion.py [--quick] [--graphs tree11,grid150,gnp10K] [--sources N]
                                   [--limit SECONDS] [--install-limit SECONDS]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from typing import Callable

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from common import GRAPHS, limited, machine_facts, median, report, session, timed, trivial_job_seconds

from factflow import Engine
from factflow.io.graphs import edge_facts

RULES = """[
 [(tc ?a ?b) [?a :edge ?b]] [(tc ?a ?b) (tc ?a ?c) [?c :edge ?b]]
 [(sg ?x ?y) [?p :edge ?x] [?p :edge ?y] [(!= ?x ?y)]]
 [(sg ?x ?y) [?a :edge ?x] (sg ?a ?b) [?b :edge ?y]]
]"""
# query: (text, column its arguments come from, full evaluation, edge orientation of the BFS baseline)
QUERIES = {
    "tc(x,?)": ("[:find ?y :where (tc {x} ?y)]", "src", "[:find ?a ?b :where (tc ?a ?b)]", ("src", "dst")),
    "tc(?,x)": ("[:find ?y :where (tc ?y {x})]", "dst", None, ("dst", "src")),  # the same full evaluation
    "sg(x,?)": ("[:find ?y :where (sg {x} ?y)]", "dst", "[:find ?x ?y :where (sg ?x ?y)]", None),
}
GRAPH_NAMES = ("tree11", "grid150", "gnp10K")
SOURCES, QUICK_SOURCES = 20, 2  # arguments per graph and query (Table 3 has 100)


def load(spark, name: str) -> tuple[Engine, pd.DataFrame]:
    """An engine holding the graph's edges, and the edges as a (small) pandas frame for sampling."""
    path = os.path.join(GRAPHS, f"{name}.csv")
    db = Engine(spark=spark)
    db.create_attribute(":edge", type="ref")
    db.transact(edge_facts(spark, path))
    db.register(RULES)
    return db, pd.read_csv(path, names=["src", "dst"])


def full_evaluation(db: Engine, text: str, limit: float) -> dict:
    """Install the bottom-up query: its time, or why it has none; when it finishes, also the
    install time of a second query reading the same rule (shared: its maintained state is read)."""
    seconds, first = limited(db.spark, lambda: db.query(text, name="full"), limit)
    if seconds is None:
        return {"full_evaluation": first}
    again, second = timed(lambda: db.query(text, name="full-again"))
    out = {"full_evaluation": f"{seconds:.2f} s", "second_reader_install_s": round(again, 2),
           "pairs": db.stats()["result_tuples"]["full"]}
    second.close()
    first.close()
    return out


def update(db: Engine, edges: pd.DataFrame, rng: random.Random) -> tuple[float, int, Callable[[], object]]:
    """One epoch adding a random new edge and retracting a random existing one:
    (seconds, Spark jobs, a function that undoes it)."""
    nodes = edges["src"].to_numpy()
    present = set(zip(edges["src"].tolist(), edges["dst"].tolist()))
    added = (int(rng.choice(nodes)), int(rng.choice(nodes)))
    while added in present:
        added = (int(rng.choice(nodes)), int(rng.choice(nodes)))
    gone = edges.iloc[rng.randrange(len(edges))]
    gone = (int(gone.src), int(gone.dst))
    seconds, _ = timed(lambda: db.transact([[":db/add", added[0], ":edge", added[1]],
                                            [":db/retract", gone[0], ":edge", gone[1]]]))
    jobs = len(db.epoch_log[-1].jobs)
    return seconds, jobs, lambda: db.transact([[":db/retract", added[0], ":edge", added[1]],
                                               [":db/add", gone[0], ":edge", gone[1]]])


def spark_bfs(forward: DataFrame, x: int) -> int:
    """How many nodes are reachable from ``x`` by one or more ``src -> dst`` edges of
    ``forward`` (a cached DataFrame), found the way a Spark user would without factflow:
    breadth-first, one Spark job per level fetching the successors of the frontier (kept
    on the driver, where it is small). The same computation written with DataFrame joins
    per level (new nodes and reached set checkpointed) was 2-5x slower on grid150."""
    reached: set[int] = set()
    frontier = {x}
    while frontier:
        rows = forward.filter(F.col("src").isin(sorted(frontier))).select("dst").distinct().collect()
        frontier = {row.dst for row in rows} - reached
        reached |= frontier
    return len(reached)


def goal_directed(db: Engine, edges: pd.DataFrame, query: str, column: str, count: int, seed: int,
                  limit: float, baseline: DataFrame | None) -> dict:
    """Install/update figures of ``query`` over ``count`` random arguments taken from ``column``,
    and with ``baseline`` (the edges as a cached DataFrame, oriented from the argument) the
    time of :func:`spark_bfs` from each argument.

    An install that does not finish within ``limit`` counts as taking longer (it enters the
    median as infinite); if the first install does not finish, the rest are skipped."""
    rng = random.Random(seed)
    candidates = sorted(set(edges[column].tolist()))
    installs, updates, jobs, sizes, searches = [], [], [], [], []
    out: dict = {"not_finished": []}
    for x in rng.sample(candidates, count):
        seconds, q = limited(db.spark, lambda: db.query(query.format(x=x), name="goal"), limit)
        if seconds is None:
            out["not_finished"].append(f"{x}: {q}")
            print(f"  argument {x}: {q}", flush=True)
            installs.append(float("inf"))
            if len(installs) == 1:
                break
            continue
        installs.append(seconds)
        sizes.append(db.stats()["query_tuples"]["goal"])
        answer = len(q.results())
        up, n, undo = update(db, edges, rng)
        updates.append(up)
        jobs.append(n)
        q.close()
        undo()
        line = f"  argument {x}: install {seconds:.2f} s, {answer} results, {sizes[-1]} tuples held; " \
               f"update {up:.2f} s, {n} jobs"
        if baseline is not None:
            search, reached = timed(lambda: spark_bfs(baseline, x))
            searches.append(search)
            line += f"; Spark BFS {search:.2f} s"
            if reached != answer:
                line += f" (MISMATCH: {reached} nodes)"
                out.setdefault("mismatches", []).append(x)
        print(line, flush=True)
    if updates:
        def shown(seconds: float) -> float | str:
            return round(seconds, 3) if seconds != float("inf") else f"> {limit:.0f}"

        out.update({
            "arguments": len(installs),
            "install_median_s": shown(median(installs)), "install_max_s": shown(max(installs)),
            "update_median_s": round(median(updates), 3), "update_max_s": round(max(updates), 3),
            "update_jobs_median": median(jobs), "private_tuples_median": median(sizes),
        })
        if searches:
            out.update({"spark_bfs_median_s": round(median(searches), 3), "spark_bfs_max_s": round(max(searches), 3),
                        "spark_bfs_over_update": round(median(searches) / median(updates), 1)})
    return out


def retractions(db: Engine, edges: pd.DataFrame, count: int, seed: int) -> dict:
    """Retract ``count`` random edges of a maintained tc(x,?) one epoch at a time.

    ``x`` is a random node four levels below the root of the tree (its closure, a subtree,
    holds a few thousand nodes), and the edges are drawn from those leaving the closure's
    nodes, so each retraction cuts off part of the maintained result."""
    rng = random.Random(seed)
    level = pd.DataFrame({"src": sorted(set(edges["src"]) - set(edges["dst"]))})
    for _ in range(4):
        level = level.merge(edges, on="src")[["dst"]].rename(columns={"dst": "src"})
    x = int(rng.choice(sorted(level["src"].tolist())))
    q = db.query(f"[:find ?y :where (tc {x} ?y)]", name="retract")
    inside = q.frame().toPandas()["y"].tolist() + [x]
    pool = edges[edges["src"].isin(inside)]
    times = []
    for i in rng.sample(range(len(pool)), min(count, len(pool))):
        e = pool.iloc[i]
        times.append(timed(lambda: db.transact([[":db/retract", int(e.src), ":edge", int(e.dst)]]))[0])
    after = q.frame().count()
    q.close()
    return {"source": x, "edges": len(times), "closure_before": len(inside) - 1, "closure_after": after,
            "median_s": round(median(times), 3), "max_s": round(max(times), 3), "total_s": round(sum(times), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer arguments, 20 retractions, shorter limits")
    parser.add_argument("--sources", type=int, default=None, help="arguments per graph and query")
    parser.add_argument("--limit", type=float, default=None, help="time limit of full evaluation (s)")
    parser.add_argument("--install-limit", type=float, default=None, help="time limit of one goal-directed install (s)")
    parser.add_argument("--graphs", default=",".join(GRAPH_NAMES))
    args = parser.parse_args()
    spark = session()
    limit = args.limit or (20.0 if args.quick else 40.0)
    install_limit = args.install_limit or (20.0 if args.quick else 60.0)
    n = args.sources or (QUICK_SOURCES if args.quick else SOURCES)
    figures: dict = {"full_evaluation_limit_s": limit, "install_limit_s": install_limit,
                     "trivial_spark_job_s": round(trivial_job_seconds(spark), 4)}
    started = time.perf_counter()
    for graph in args.graphs.split(","):
        load_s, (db, edges) = timed(lambda: load(spark, graph))
        per_graph: dict = {"load_s": round(load_s, 2), "edges": len(edges)}
        stored = spark.createDataFrame(edges).cache()
        for number, (label, (query, column, full, orientation)) in enumerate(QUERIES.items()):
            baseline = None
            if orientation is not None:
                baseline = stored.select(F.col(orientation[0]).alias("src"), F.col(orientation[1]).alias("dst")).cache()
                baseline.count()
            # a seed per query, so that its updates do not repeat (as no-ops) those of the one before
            per_graph[label] = goal_directed(db, edges, query, column, n, seed=7 + number, limit=install_limit,
                                             baseline=baseline)
            if baseline is not None:
                baseline.unpersist()
            if full is not None:
                per_graph[label].update(full_evaluation(db, full, limit))
            print(graph, label, per_graph[label], flush=True)
        if graph == "tree11":
            per_graph["retractions_from_tc(x,?)"] = retractions(db, edges, 20 if args.quick else 100, seed=3)
            print(graph, "retractions", per_graph["retractions_from_tc(x,?)"], flush=True)
        stored.unpersist()
        db.close()
        figures[graph] = per_graph
    figures["total_s"] = round(time.perf_counter() - started, 1)
    name = "recursion-quick" if args.quick else "recursion"
    if args.graphs != parser.get_default("graphs"):
        name += "-" + args.graphs.replace(",", "-")
    report(name, machine_facts(spark), figures)


if __name__ == "__main__":
    main()
