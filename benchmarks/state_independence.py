"""State independence: an epoch's cost should follow its changes, not the state held.

The two-hop query ``[:find ?a ?c :where [?a :edge ?b] [?b :edge ?c]]`` over
facebook_combined.txt (176,468 directed lines: both directions of 88,234 undirected
edges, loaded as they are, as benchmarks/twohop.py does), loaded once (x1) and with
extra disjoint copies of the graph (x4: node ids of copy k offset by k * stride), then
epochs of random edge changes confined to the first copy: each retracts ``changes/2``
random existing edges and adds as many new random edges among the first copy's nodes.
The changes come from a seeded generator over the first copy only, so every number of
copies sees exactly the same transactions (and the query's changes delivered per epoch
must be equal; the script checks it). The graph is read once by Spark and cached; every
load is one DataFrame transaction (columns e, a, v) built from it.

Figures, per number of copies:

- epochs: median and max seconds (wall time of ``transact``, first two epochs excluded
  as warm-up), Spark jobs per epoch, rows read per epoch (``SparkJob.rows_read``, the
  rows scanned from stored batches, and ``rows_shuffled``, reported apart and summed),
  phase medians; ratio of each median to the first number of copies (target: x4 at most
  1.3x x1);
- installs from shared state: a selective query (a node of moderate out-degree in the
  first copy, joined to two more ``:edge`` patterns) installed on the loaded engine
  ``--installs`` times, each on a settled engine (the background round of the command
  before it waited for first, and that wait reported beside it); its result is the same at
  every number of copies (checked). The first install is reported apart, with the classes
  Spark's code generation compiled for it: it compiles the code of the query's plan, which
  the later installs find compiled (``classes compiled`` per install shows it). The median
  is over the later installs; target: x4 at most 1.3x x1;
- memory of the state after the epochs: tuples held (``Engine.stats()``), driver Python
  RSS, driver JVM heap used (after a System.gc()), Spark storage memory used
  (block managers), the memory and disk size of cached/checkpointed RDD blocks, and the
  files under the engine's ``state_dir``; each absolute, above the same figure taken
  just before the engine was created, and per tuple held.

At the largest number of copies (``--baselines``), in the same run:

- the plain-PySpark recompute a Spark user would write (benchmarks/twohop.py's
  ``recompute``: the edges in a cached 4-partition DataFrame, each epoch's changes
  applied with ``subtract`` + ``union``, the distinct self-join counted from scratch),
  replayed with the same changes after the incremental epochs; its final count must equal
  the query's result size; target: at least 10x slower than the incremental epoch;
- loading the graph into a new Engine on the same session and installing the selective
  query fresh (load + install); target: at least 10x the install on loaded state (the
  median above). The fresh engine's state (one loaded batch) has a shape of its own, so its
  install compiles its plan's code, as a first install does; its classes are reported.

Every figure is measured with default engines (``Engine(spark=s)`` on a session
configured as ``factflow.Engine()`` configures its own: ``common.engine_session()``,
2 GB driver; the script prints whether the session differs). The machine may be shared:
ratios are between figures of the same run. Before the first number of copies an untimed
warm-up engine (two copies of 5,000 edges, three epochs, one selective install) runs the
same code paths, so that the reference size does not pay the JVM's warm-up alone
(``--no-warmup`` skips it). Each number of copies gets its own engine, closed before the next.

    python benchmarks/state_independence.py                     # copies 1,4; 20 epochs of 100 changes
    python benchmarks/state_independence.py --quick             # smoke run: 20,000 lines, 5 epochs
    python benchmarks/state_independence.py [--copies 1,4] [--epochs 20] [--changes 100] [--edges N]
                                            [--installs 5] [--baselines 4|none] [--seed 11] [--no-warmup]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time

from common import (GRAPHS, describe_session, engine_session, machine_facts, median, report, timed,
                    trivial_job_seconds)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from twohop import TWO_HOP, recompute

from factflow import Engine
from factflow.io.graphs import read_edges
from factflow.storage.files import bytes_under

SELECTIVE = "[:find ?b ?c :where [{node} :edge ?a] [?a :edge ?b] [?b :edge ?c]]"
QUICK_EDGES, QUICK_EPOCHS = 20_000, 5
WARM = 2  # epochs excluded from medians (the docs' convention)


# ------------------------------------------------------------------ graph and changes
def first_copy(spark, path: str, lines: int | None) -> DataFrame:
    """The graph's edges ``(src, dst)`` (the first ``lines`` of the file with ``lines``), cached."""
    edges = read_edges(spark, path)
    if lines:
        edges = edges.limit(lines)
    return edges.cache()


def stride_of(edges: DataFrame) -> int:
    """The node-id offset between copies: the power of ten above the largest node id."""
    top = edges.agg(F.greatest(F.max("src"), F.max("dst"))).first()[0]
    return 10 ** len(str(int(top)))


def copies_of(edges: DataFrame, copies: int, stride: int) -> DataFrame:
    """``copies`` disjoint copies of ``edges`` (copy k's node ids offset by k * stride)."""
    k = edges.sparkSession.range(copies).withColumnRenamed("id", "k")
    return edges.crossJoin(k).select((F.col("src") + F.col("k") * stride).alias("src"),
                                     (F.col("dst") + F.col("k") * stride).alias("dst"))


def as_facts(edges: DataFrame) -> DataFrame:
    """Edges as a transaction DataFrame ``(e, a, v)``."""
    return edges.select(F.col("src").alias("e"), F.lit(":edge").alias("a"), F.col("dst").alias("v"))


def change_plan(edges: set[tuple[int, int]], epochs: int, changes: int, seed: int) -> list[tuple[list, list]]:
    """Per epoch, (removed, added): ``changes // 2`` random existing edges retracted, the rest
    new random edges (no self-loops) among the nodes of ``edges``; applied in order, each
    epoch's edges are drawn from the graph as the previous epochs left it."""
    rng = random.Random(seed)
    present = set(edges)
    nodes = sorted({n for e in present for n in e})
    plan = []
    for _ in range(epochs):
        removed = rng.sample(sorted(present), changes // 2)
        added: set[tuple[int, int]] = set()
        while len(added) < changes - len(removed):
            e = (rng.choice(nodes), rng.choice(nodes))
            if e[0] != e[1] and e not in present:
                added.add(e)
        present.difference_update(removed)
        present.update(added)
        plan.append((removed, sorted(added)))
    return plan


def transaction(removed: list, added: list) -> list:
    return [[":db/retract", s, ":edge", d] for s, d in removed] + [[":db/add", s, ":edge", d] for s, d in added]


def moderate_node(edges: set[tuple[int, int]]) -> tuple[int, int]:
    """A node of the first copy with the median out-degree (the smallest such id) and its degree."""
    degree: dict[int, int] = {}
    for s, _ in edges:
        degree[s] = degree.get(s, 0) + 1
    target = median(sorted(degree.values()))
    node = min((abs(d - target), n) for n, d in degree.items())[1]
    return node, degree[node]


# ------------------------------------------------------------------ measurements
def load(spark, graph: DataFrame) -> Engine:
    """A default engine holding ``graph``'s edges as ``:edge`` facts (one DataFrame transaction)."""
    db = Engine(spark=spark)
    db.create_attribute(":edge", type="ref")
    db.transact(as_facts(graph))
    return db


def run_epochs(db: Engine, plan: list, label: str, delivered: list[int]) -> list[dict]:
    """Apply the planned transactions, one epoch each; a line per epoch as it goes."""
    out = []
    for i, (removed, added) in enumerate(plan, 1):
        before = len(delivered)
        seconds, _ = timed(lambda: db.transact(transaction(removed, added)))
        r = db.epoch_log[-1]
        e = {"seconds": seconds, "to_results_s": r.seconds, "maintenance_jobs": len(r.maintenance_jobs),
             "jobs": len(r.jobs), "rows_read": sum(j.rows_read for j in r.jobs),
             "rows_shuffled": sum(j.rows_shuffled for j in r.jobs), "phases": dict(r.phases),
             "changes": r.changes, "delivered": sum(delivered[before:])}
        out.append(e)
        print(f"  {label} epoch {i}/{len(plan)}: {seconds:.3f} s ({r.seconds:.3f} s to results), {e['jobs']} jobs "
              f"(+{e['maintenance_jobs']} after delivery), read {e['rows_read']:,} rows, "
              f"shuffled {e['rows_shuffled']:,}, {e['changes']} fact changes, {e['delivered']:,} result changes; "
              + " ".join(f"{k} {v:.3f}" for k, v in r.phases.items()), flush=True)
    return out


def summarize_epochs(epochs: list[dict]) -> dict:
    steady = epochs[WARM:] if len(epochs) > WARM else epochs
    return {
        "epochs": len(epochs), "epochs_in_medians": len(steady),
        "median_s": round(median([e["seconds"] for e in steady]), 3),
        "max_s": round(max(e["seconds"] for e in steady), 3),
        "to_results_median_s": round(median([e["to_results_s"] for e in steady]), 3),
        "jobs_median": median([e["jobs"] for e in steady]),
        "maintenance_jobs_median": median([e["maintenance_jobs"] for e in steady]),
        "rows_read_median": median([e["rows_read"] for e in steady]),
        "rows_shuffled_median": median([e["rows_shuffled"] for e in steady]),
        "rows_read_plus_shuffled_median": median([e["rows_read"] + e["rows_shuffled"] for e in steady]),
        "phases_median_s": {k: round(median([e["phases"].get(k, 0.0) for e in steady]), 3)
                            for k in steady[-1]["phases"]},
        "result_changes_delivered": sum(e["delivered"] for e in epochs),
    }


def code_generated(spark) -> int:
    """How many classes Spark's code generation has compiled in this JVM so far (driver and
    executors of a local session; Spark's ``CodegenMetrics``)."""
    return int(spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
               .METRIC_COMPILATION_TIME().getCount())


def installs(db: Engine, text: str, repeats: int) -> dict:
    """Install ``text`` on the loaded engine ``repeats`` times (closed after each): seconds,
    classes compiled by Spark's code generation, and result size.

    The first install of a query at a given shape of state is reported apart: it pays for
    Spark generating and compiling the code of its plan (about ten classes, each compiled
    twice in a local session: by the driver and by the executor), which later installs of
    the same plan find compiled. The median is over the installs after it (the epochs'
    medians skip their warm-up epochs likewise). Each install is timed on a settled engine:
    the background round of the command before it (the last epoch's merges, the previous
    install's index files) is waited for first, and that wait is reported beside the
    install (a caller installing right after another command waits for it inside ``query``)."""
    times, waits, compiled, size = [], [], [], None
    spark = db.spark
    for i in range(repeats):
        waited, _ = timed(db.wait_for_maintenance)
        before = code_generated(spark)
        seconds, q = timed(lambda: db.query(text, name=f"selective-{i}"))
        compiled.append(code_generated(spark) - before)
        times.append(seconds)
        waits.append(waited)
        size = len(q.rows())
        q.close()
        print(f"    install {i + 1}/{repeats}: {seconds:.3f} s ({size:,} rows), {compiled[-1]} classes compiled, "
              f"after waiting {waited:.3f} s for the previous command's background round", flush=True)
    steady = times[1:] or times
    return {"install_median_s": round(median(steady), 3), "install_max_s": round(max(steady), 3),
            "first_install_s": round(times[0], 3), "installs": [round(t, 3) for t in times],
            "classes_compiled": compiled, "waits_before_s": [round(w, 3) for w in waits], "result_rows": size}


def recompute_baseline(spark, graph: DataFrame, plan: list, partitions: int) -> dict:
    """The same epochs answered as a Spark user would without factflow (benchmarks/twohop.py):
    the changes applied to a cached edge DataFrame, the two-hop pairs recomputed and counted."""
    current = graph.repartition(partitions).cache()
    current.count()
    times, count = [], None
    for i, (removed, added) in enumerate(plan, 1):
        gone = spark.createDataFrame(removed, "src long, dst long")
        new = spark.createDataFrame(added, "src long, dst long")
        nxt = current.subtract(gone).unionByName(new).repartition(partitions).cache()
        seconds, count = timed(lambda: recompute(spark, nxt))
        current.unpersist()
        current = nxt
        times.append(seconds)
        print(f"  recompute epoch {i}/{len(plan)}: {seconds:.3f} s ({count:,} pairs)", flush=True)
    current.unpersist()
    steady = times[WARM:] if len(times) > WARM else times
    return {"median_s": round(median(steady), 3), "max_s": round(max(steady), 3), "final_pairs": count}


def _rss_bytes(pid: int | str = "self") -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_snapshot(spark, state_dir: str | None = None) -> dict:
    """Driver and executor memory now (bytes), after a Python and a JVM garbage collection."""
    gc.collect()
    sc = spark.sparkContext
    jvm = sc._jvm
    jvm.java.lang.System.gc()
    time.sleep(0.5)
    runtime = jvm.java.lang.Runtime.getRuntime()
    status = jvm.scala.jdk.javaapi.CollectionConverters.asJava(sc._jsc.sc().getExecutorMemoryStatus())
    storage_max = storage_used = 0
    for executor in status.keySet().toArray():
        limits = status.get(executor)
        storage_max += limits._1()
        storage_used += limits._1() - limits._2()
    rdd_memory = rdd_disk = rdd_count = 0
    for info in sc._jsc.sc().getRDDStorageInfo():
        rdd_memory += info.memSize()
        rdd_disk += info.diskSize()
        rdd_count += 1
    return {
        "driver_python_rss": _rss_bytes(),
        "driver_jvm_rss": _rss_bytes(jvm.java.lang.ProcessHandle.current().pid()),
        "driver_jvm_heap_used": runtime.totalMemory() - runtime.freeMemory(),
        "executor_storage_memory_used": storage_used,
        "cached_rdd_blocks_memory": rdd_memory,
        "cached_rdd_blocks_disk": rdd_disk,
        "state_dir_files": bytes_under(state_dir) if state_dir else 0,
        # context, not divided per tuple
        "_driver_jvm_heap_max": runtime.maxMemory(),
        "_executor_storage_memory_max": storage_max,
        "_cached_rdds": rdd_count,
    }


def tuples_held(db: Engine) -> dict:
    stats = db.stats()
    held = {"shared": stats["shared_tuples"], "query_private": sum(stats["query_tuples"].values()),
            "query_results": sum(stats["result_tuples"].values()),
            "shared_rules": sum(e["tuples"] for e in stats["shared_rules"].values())}
    held["total"] = sum(held.values())
    return held


def memory_figures(before: dict, after: dict, tuples: int) -> dict:
    out = {}
    for key, value in after.items():
        if key.startswith("_"):
            out[key[1:]] = value
            continue
        above = value - before.get(key, 0)
        out[key] = {"bytes": value, "above_before_load": above,
                    "bytes_per_tuple": round(value / tuples, 1) if tuples else None,
                    "above_before_load_per_tuple": round(above / tuples, 1) if tuples else None}
    return out


def one_size(spark, graph1: DataFrame, copies: int, stride: int, plan: list, node: int, args,
             baselines: bool) -> tuple[dict, list[int]]:
    """Every measurement at one number of copies; returns the figures and the per-epoch result changes."""
    label = f"x{copies}"
    graph = copies_of(graph1, copies, stride)
    memory_before = memory_snapshot(spark)
    load_s, db = timed(lambda: load(spark, graph))
    install_s, q = timed(lambda: db.query(TWO_HOP, name="twohop"))
    delivered: list[int] = []
    q.subscribe(lambda epoch, changes: delivered.append(sum(abs(d) for _, d in changes)))
    print(f"{label}: loaded in {load_s:.2f} s ({db.epoch_log[-1].changes:,} edges), two-hop installed in "
          f"{install_s:.2f} s", flush=True)
    figures: dict = {"copies": copies, "load_s": round(load_s, 2), "twohop_install_s": round(install_s, 2)}
    epochs = run_epochs(db, plan, label, delivered)
    figures["epochs"] = summarize_epochs(epochs)
    figures["twohop_result_rows"] = q.frame().count()

    held = tuples_held(db)
    figures["tuples_held"] = held
    figures["memory"] = memory_figures(memory_before, memory_snapshot(spark, db.state_dir), held["total"])
    figures["state_dir"] = db.state_dir

    print(f"  {label}: installing {SELECTIVE.format(node=node)} on the loaded engine", flush=True)
    figures["selective_install"] = installs(db, SELECTIVE.format(node=node), args.installs)

    if baselines:
        print(f"  {label}: plain-PySpark recompute with the same changes", flush=True)
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
        figures["recompute"] = recompute_baseline(spark, graph, plan, partitions)
        figures["recompute"]["agrees_with_query"] = figures["recompute"]["final_pairs"] == figures["twohop_result_rows"]
    db.close()

    if baselines:
        print(f"  {label}: a new engine on the same session: load + install of the selective query", flush=True)
        started = time.perf_counter()
        fresh = Engine(spark=spark)
        fresh.create_attribute(":edge", type="ref")
        fresh.transact(as_facts(graph))
        loaded = time.perf_counter() - started
        before = code_generated(spark)
        fq = fresh.query(SELECTIVE.format(node=node), name="selective")
        total = time.perf_counter() - started
        figures["fresh_load_and_install"] = {"total_s": round(total, 3), "load_s": round(loaded, 3),
                                             "install_s": round(total - loaded, 3), "result_rows": len(fq.rows()),
                                             "install_classes_compiled": code_generated(spark) - before}
        fresh.close()
        print(f"    load {loaded:.2f} s + install {total - loaded:.2f} s = {total:.2f} s", flush=True)
    return figures, [e["delivered"] for e in epochs]


def warm_up(spark, graph1: DataFrame, stride: int, node: int) -> None:
    """Untimed: a small engine through the same code paths, so that the first measured number of
    copies does not pay for the JVM's warm-up alone."""
    small = graph1.limit(5000)
    edges = {(int(r.src), int(r.dst)) for r in small.collect()}
    db = load(spark, copies_of(small, 2, stride))
    db.query(TWO_HOP, name="twohop").subscribe(lambda epoch, changes: None)
    for removed, added in change_plan(edges, 3, 20, seed=1):
        db.transact(transaction(removed, added))
    db.query(SELECTIVE.format(node=node), name="selective").close()
    db.close()


# ------------------------------------------------------------------ output
def table(results: dict, reference: int) -> list[str]:
    """The final table, one column per number of copies."""
    cols = list(results)
    ref = results[reference]
    rows: list[tuple[str, list[str]]] = []

    def row(name: str, fn) -> None:
        values = []
        for c in cols:
            try:
                values.append(fn(results[c]))
            except (KeyError, TypeError, ZeroDivisionError):
                values.append("-")
        rows.append((name, values))

    row("load (s)", lambda r: f"{r['load_s']:.2f}")
    row("two-hop install (s)", lambda r: f"{r['twohop_install_s']:.2f}")
    row("two-hop result rows", lambda r: f"{r['twohop_result_rows']:,}")
    row("epoch median (s)", lambda r: f"{r['epochs']['median_s']:.3f}")
    row("epoch max (s)", lambda r: f"{r['epochs']['max_s']:.3f}")
    row("epoch median to results (s)", lambda r: f"{r['epochs']['to_results_median_s']:.3f}")
    row(f"epoch median / x{reference} (target <= 1.3)",
        lambda r: f"{r['epochs']['median_s'] / ref['epochs']['median_s']:.2f}x")
    row("Spark jobs per epoch (median)", lambda r: f"{r['epochs']['jobs_median']:g}")
    row("  + jobs after delivery (median)", lambda r: f"{r['epochs']['maintenance_jobs_median']:g}")
    row("rows read per epoch (median)", lambda r: f"{r['epochs']['rows_read_median']:,.0f}")
    row("rows shuffled per epoch (median)", lambda r: f"{r['epochs']['rows_shuffled_median']:,.0f}")
    row("read + shuffled per epoch (median)", lambda r: f"{r['epochs']['rows_read_plus_shuffled_median']:,.0f}")
    for phase in ref["epochs"]["phases_median_s"]:
        row(f"phase {phase} (median s)", lambda r, p=phase: f"{r['epochs']['phases_median_s'][p]:.3f}")
    row("result changes delivered", lambda r: f"{r['epochs']['result_changes_delivered']:,}")
    row("recompute median (s)", lambda r: f"{r['recompute']['median_s']:.3f}")
    row("recompute / incremental (target >= 10)",
        lambda r: f"{r['recompute']['median_s'] / r['epochs']['median_s']:.1f}x")
    row("recompute agrees with query", lambda r: "yes" if r["recompute"]["agrees_with_query"] else "NO (MISMATCH)")
    row("selective install on loaded: first (s)", lambda r: f"{r['selective_install']['first_install_s']:.3f}")
    row("  classes compiled, first / later installs",
        lambda r: f"{r['selective_install']['classes_compiled'][0]} / "
                  f"{','.join(map(str, r['selective_install']['classes_compiled'][1:]))}")
    row("selective install on loaded, after the first (median s)",
        lambda r: f"{r['selective_install']['install_median_s']:.3f}")
    row(f"selective install / x{reference} (target <= 1.3)",
        lambda r: f"{r['selective_install']['install_median_s'] / ref['selective_install']['install_median_s']:.2f}x")
    row(f"first selective install / x{reference} first (not a target)",
        lambda r: f"{r['selective_install']['first_install_s'] / ref['selective_install']['first_install_s']:.2f}x")
    row("selective result rows", lambda r: f"{r['selective_install']['result_rows']:,}")
    row("fresh engine: load + install (s)", lambda r: f"{r['fresh_load_and_install']['total_s']:.2f}")
    row("  of which install (s)", lambda r: f"{r['fresh_load_and_install']['install_s']:.2f}")
    row("  classes compiled by that install", lambda r: f"{r['fresh_load_and_install']['install_classes_compiled']}")
    row("fresh / install on loaded (target >= 10)",
        lambda r: f"{r['fresh_load_and_install']['total_s'] / r['selective_install']['install_median_s']:.1f}x")
    row("tuples held (total)", lambda r: f"{r['tuples_held']['total']:,}")
    row("  shared / private / results",
        lambda r: f"{r['tuples_held']['shared']:,} / {r['tuples_held']['query_private']:,} / "
                  f"{r['tuples_held']['query_results']:,}")
    for key, name in (("driver_python_rss", "driver Python RSS"), ("driver_jvm_rss", "driver JVM RSS"),
                      ("driver_jvm_heap_used", "driver JVM heap used"),
                      ("executor_storage_memory_used", "executor storage memory used"),
                      ("cached_rdd_blocks_memory", "cached RDD blocks, memory"),
                      ("cached_rdd_blocks_disk", "cached RDD blocks, disk"),
                      ("state_dir_files", "files under state_dir")):
        row(f"{name}: MiB (above before load)",
            lambda r, k=key: f"{r['memory'][k]['bytes'] / 2**20:,.1f} ({r['memory'][k]['above_before_load'] / 2**20:+,.1f})")
        row("  bytes per tuple (above before load)",
            lambda r, k=key: f"{r['memory'][k]['bytes_per_tuple']:,.1f} ({r['memory'][k]['above_before_load_per_tuple']:+,.1f})")
    width = max(len(name) for name, _ in rows)
    widths = [max(len(f"x{c}"), *(len(v[i]) for _, v in rows)) for i, c in enumerate(cols)]
    lines = [" " * width + "  " + "  ".join(f"x{c}".rjust(w) for c, w in zip(cols, widths))]
    for name, values in rows:
        lines.append(name.ljust(width) + "  " + "  ".join(v.rjust(w) for v, w in zip(values, widths)))
    return lines


def targets(results: dict, reference: int) -> list[str]:
    """The issue's targets, each with the figure measured in this run and whether it is met."""
    out = []

    def check(text: str, value: float, ok: bool) -> None:
        out.append(f"target {text}: {value:.2f}x, {'met' if ok else 'MISSED'}")

    for c, r in results.items():
        if c != reference:
            check(f"epoch median x{c} / x{reference} <= 1.3", r["epoch_median_ratio"], r["epoch_median_ratio"] <= 1.3)
            check(f"selective install x{c} / x{reference} <= 1.3", r["selective_install_ratio"],
                  r["selective_install_ratio"] <= 1.3)
        if "recompute_over_incremental" in r:
            check(f"recompute / incremental at x{c} >= 10", r["recompute_over_incremental"],
                  r["recompute_over_incremental"] >= 10)
        if "fresh_over_install_on_loaded" in r:
            check(f"fresh load + install / install on loaded at x{c} >= 10", r["fresh_over_install_on_loaded"],
                  r["fresh_over_install_on_loaded"] >= 10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", default="1,4", help="numbers of disjoint copies to measure (the first is the reference)")
    parser.add_argument("--epochs", type=int, default=None, help=f"epochs per number of copies (default 20, quick {QUICK_EPOCHS})")
    parser.add_argument("--changes", type=int, default=100, help="edge changes per epoch (half retractions)")
    parser.add_argument("--edges", type=int, default=None, help=f"use the first N lines of the file (quick: {QUICK_EDGES:,})")
    parser.add_argument("--installs", type=int, default=None, help="installs of the selective query per number of copies: the first, then those the median is taken over (default 5, quick 2)")
    parser.add_argument("--baselines", default=None, help="numbers of copies at which to run the recompute and fresh-engine baselines "
                             "(default: the largest; 'none' for none)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--graph", default=os.path.join(GRAPHS, "facebook_combined.txt"))
    parser.add_argument("--quick", action="store_true", help="smoke run: a prefix of the file, few epochs")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up engine")
    args = parser.parse_args()
    counts = [int(c) for c in args.copies.split(",")]
    epochs = args.epochs or (QUICK_EPOCHS if args.quick else 20)
    lines = args.edges or (QUICK_EDGES if args.quick else None)
    args.installs = args.installs or (2 if args.quick else 5)
    if args.baselines == "none":
        baselines: set[int] = set()
    else:
        baselines = {int(c) for c in args.baselines.split(",")} if args.baselines else {max(counts)}

    spark = engine_session()
    print("session:", describe_session(spark), flush=True)
    graph1 = first_copy(spark, args.graph, lines)
    edges = {(int(r.src), int(r.dst)) for r in graph1.collect()}
    stride = stride_of(graph1)
    plan = change_plan(edges, epochs, args.changes, args.seed)
    node, degree = moderate_node(edges)
    print(f"graph: {os.path.basename(args.graph)}, {len(edges):,} directed edges per copy"
          f"{f' (first {lines:,} lines)' if lines else ''}, copy offset {stride:,}; {epochs} epochs of "
          f"{args.changes} changes in the first copy; selective query from node {node} (out-degree {degree})",
          flush=True)
    if not args.no_warmup:
        seconds, _ = timed(lambda: warm_up(spark, graph1, stride, node))
        print(f"warm-up engine (untimed figures): {seconds:.1f} s", flush=True)

    figures: dict = {"graph": os.path.basename(args.graph), "edges_per_copy": len(edges), "lines": lines,
                     "copy_offset": stride, "epochs": epochs, "changes_per_epoch": args.changes, "seed": args.seed,
                     "selective_query": SELECTIVE.format(node=node), "selective_node_out_degree": degree,
                     "session": describe_session(spark)}
    results: dict[int, dict] = {}
    delivered: dict[int, list[int]] = {}
    for copies in counts:
        results[copies], delivered[copies] = one_size(spark, graph1, copies, stride, plan, node, args,
                                                      copies in baselines)
    reference = counts[0]
    same = all(delivered[c] == delivered[reference] for c in counts)
    sizes = {results[c]["selective_install"]["result_rows"] for c in counts}
    figures["same_result_changes_every_epoch"] = same
    figures["same_selective_result"] = len(sizes) == 1
    for c in counts[1:]:
        r = results[c]
        r["epoch_median_ratio"] = round(r["epochs"]["median_s"] / results[reference]["epochs"]["median_s"], 2)
        r["selective_install_ratio"] = round(r["selective_install"]["install_median_s"]
                                             / results[reference]["selective_install"]["install_median_s"], 2)
    for c in counts:
        r = results[c]
        if "recompute" in r:
            r["recompute_over_incremental"] = round(r["recompute"]["median_s"] / r["epochs"]["median_s"], 1)
        if "fresh_load_and_install" in r:
            r["fresh_over_install_on_loaded"] = round(r["fresh_load_and_install"]["total_s"]
                                                      / r["selective_install"]["install_median_s"], 1)
    figures["trivial_spark_job_s"] = round(trivial_job_seconds(spark), 4)
    figures["targets"] = targets(results, reference)
    figures["results"] = {f"x{c}": r for c, r in results.items()}

    print()
    print("\n".join(table(results, reference)))
    for line in figures["targets"]:
        print(line)
    print(f"trivial Spark job: {figures['trivial_spark_job_s']} s; result changes equal at every number of copies: "
          f"{'yes' if same else 'NO (MISMATCH)'}; selective result equal: {'yes' if len(sizes) == 1 else 'NO (MISMATCH)'}")
    name = "state_independence-quick" if args.quick else "state_independence"
    report(name, machine_facts(spark), figures)


if __name__ == "__main__":
    main()
