"""TPC-H queries arriving and retiring while the tables stream in, with and without shared
arrangements: the Shared Arrangements paper's figure 3 (section 7.1.1), issue 37.

The eight TPC-H tables (DuckDB's generator, ``benchmarks/tpch/data.py``, as facts by the
mapping of ``benchmarks/tpch/schema.py``) are loaded round-robin in ``--batches`` batches:
batch ``i`` of every table is ``part_of(table, batches, i)``, one epoch per table and batch
(``load_table`` of a Parquet-backed Spark DataFrame). Before each batch, queries of the 22
(``benchmarks/tpch/queries.py``) are installed and retired by a seeded schedule: every query
is installed once, in a random order spread over the batches; an installed query is retired
before a later batch with probability 1/3 and a retired one comes back with probability 1/4.
The same data and schedule run in two configurations on one SparkSession:

- **shared**: one engine; every query's rules registered, every query installed on it, so
  all read the same attribute indexes;
- **no sharing**: each installed query gets an engine of its own (a new ``Engine`` on the
  same session) that builds its own state: it loads the batches so far of the tables the
  query names, only the attributes it names, then installs the query; the install latency
  includes building that state. Each epoch is applied to every live engine whose query
  reads the table (the update latency is the sum over them), memory is the sum over live
  engines, and a retired query's engine is closed.

Measured: each install's latency, each epoch's update latency (wall time of ``load_table``),
and memory after every install and epoch: the bytes of ``Engine.holdings()`` (driver, Spark
memory and disk, index files; ``memory_bytes``) and, for reference, the JVM's used heap (one
JVM for both configurations, so it is not split between them). Plots like the paper's 3a-3c
(CCDFs of install and update latency, memory timeline) go to ``docs/tpch_stream.png`` (at a
scale factor other than 0.01, ``docs/tpch_stream-sf<scale>.png``).

After the stream the shared engine installs every query not installed at the end, and
every query's rows are compared with DuckDB's answer over the same rows (``difference``);
the no-sharing engines live at the end are compared too. Then each query alone on the
loaded shared engine: installed, then ``--updates`` lineitem epochs (the last batch
retracted, added back, the one before retracted, ...), each followed by the query's SQL
re-run by Spark SQL over temporary views of the Parquet files with the rows loaded at that
point (each query's pass starts once the merges before it are done:
``wait_for_maintenance``); the ratio is the re-run's median over the incremental epoch's
median (the "p99" of so few epochs is their maximum). The same epochs with no query
installed give the cost of maintaining the indexes alone.

Last, load throughput: each table whole through ``load_table`` on a fresh engine, from a
pandas frame, a cached Spark DataFrame and the Parquet path; facts are the values loaded
(non-null cells and reference attributes, ``LoadReport.facts``).

Goals of the issue, printed as met or not: queries reading only lineitem install (shared)
within 10x a trivial Spark job; with sharing, installs >= 10x faster (medians) and memory
>= 2x lower (peaks) than without; incremental updates >= 10x faster than the Spark SQL
re-run for every query; loading lineitem at >= 100,000 facts/s.

Scale: the default is SF 0.01 (the smallest whose partsupp keys are unique) in 4 batches,
not the issue's SF 0.1 in 10, which cannot finish in 25 minutes here: on this machine (2
cores, shared with other runs) at SF 0.01 an epoch of a third of lineitem took about a
minute with only Q1 installed, an epoch of 3 region facts 17 s with only Q5 installed, and
with Q2, Q5 and Q8 installed an epoch of 24 nation facts ran the default 2 GB driver out of
heap. The output names the scale it ran.

Every engine has the default settings, on a session configured as a default
``factflow.Engine()`` gets it (``common.engine_session()``; the output says whether it differs).

    python benchmarks/tpch_stream.py [--scale 0.01] [--batches 4] [--seed 37] [--updates 2]
    python benchmarks/tpch_stream.py --skip-unshared
    python benchmarks/tpch_stream.py --updates 0 --skip-load   # the two configurations alone
    python benchmarks/tpch_stream.py --quick          # smoke run: SF 0.01, 3 batches, 4 queries
    python benchmarks/tpch_stream.py --load-only [--scale 0.1]   # load throughput alone
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd

from common import ROOT, RESULTS, describe_session, engine_session, jvm_used_bytes, machine_facts, median, percentile, \
    report, trivial_job_seconds

from benchmarks.tpch.data import TABLE_NAMES, answer, connect, generate, part_of
from benchmarks.tpch.queries import QUERIES, TpchQuery, difference
from benchmarks.tpch.schema import STREAM, TABLES
from factflow import Engine
from factflow.io.tables import Table, create_table, load_table

DATA = os.environ.get("FACTFLOW_TPCH", "/tmp/factflow-tpch")
RETIRE, RETURN = 1 / 3, 1 / 4
QUICK_QUERIES = (1, 3, 6, 14)
_ATTRIBUTE = re.compile(r":(" + "|".join(TABLE_NAMES) + r")/([A-Za-z_]+)")


# ------------------------------------------------------------------ data and schedule

class Tables:
    """The generated tables as Spark DataFrames over their Parquet files, cut into batches."""

    def __init__(self, spark, paths: dict[str, str], batches: int):
        self.paths, self.batches = paths, batches
        self.frames = {t: spark.read.parquet(paths[t]) for t in TABLE_NAMES}

    def condition(self, table: str, parts: Sequence[int]) -> str:
        """SQL condition selecting the rows of ``table`` in batches ``parts``."""
        return " OR ".join(f"({part_of(table, self.batches, p)})" for p in parts) or "FALSE"

    def rows(self, table: str, parts: Sequence[int]):
        """The rows of ``table`` in batches ``parts``."""
        return self.frames[table].where(self.condition(table, parts))


def footprint(query: TpchQuery, tables: Tables) -> dict[str, Table]:
    """The tables ``query`` names, each restricted to the attributes it names: what the query's
    own engine loads when nothing is shared."""
    named: dict[str, set[str]] = {}
    for table, column in _ATTRIBUTE.findall((query.rules or "") + query.query):
        named.setdefault(table, set()).add(column)
    out = {}
    for table, columns in named.items():
        full = TABLES[table]
        out[table] = dataclasses.replace(
            full, columns=tuple(c for c in tables.frames[table].columns if c in columns),
            references={name: ref for name, ref in full.references.items() if name in columns})
    return out


def schedule(numbers: Sequence[int], batches: int, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """Per batch, the queries (numbers) installed and retired before it is loaded (see the
    module docstring)."""
    order = rng.sample(list(numbers), len(numbers))
    firsts = [order[len(order) * i // batches:len(order) * (i + 1) // batches] for i in range(batches)]
    live: set[int] = set()
    retired: set[int] = set()
    plan = []
    for first in firsts:
        gone = [n for n in sorted(live) if rng.random() < RETIRE]
        back = [n for n in sorted(retired) if rng.random() < RETURN]
        live -= set(gone)
        retired = (retired - set(back)) | set(gone)
        live |= set(first) | set(back)
        plan.append((first + back, gone))
    return plan


def holding_bytes(db: Engine) -> int:
    """The bytes of every trace ``db`` keeps: driver, Spark memory and disk, index files."""
    return sum(e["driver_bytes"] + e["spark_memory_bytes"] + e["spark_disk_bytes"] + e["index_bytes"]
               for e in db.holdings())


# ------------------------------------------------------------------ the two configurations

class Shared:
    """Every query on one engine."""

    name = "shared"

    def __init__(self, spark, tables: Tables, numbers: Sequence[int]):
        self.tables = tables
        self.db = Engine(spark=spark)
        for t in TABLE_NAMES:
            create_table(self.db, TABLES[t], tables.frames[t].schema)
        for n in numbers:
            if QUERIES[n].rules:
                self.db.register(QUERIES[n].rules)
        self.handles = {}

    def install(self, number: int, parts: int) -> float:
        """Install query ``number`` (over the ``parts`` batches loaded, already in the engine); its latency."""
        q = QUERIES[number]
        started = time.perf_counter()
        self.handles[number] = self.db.query(q.query, name=q.name)
        return time.perf_counter() - started

    def retire(self, number: int) -> None:
        """Close query ``number``."""
        self.handles.pop(number).close()

    def load(self, table: str, part: int) -> float:
        """Apply batch ``part`` of ``table``; the epoch's latency."""
        started = time.perf_counter()
        load_table(self.db, self.tables.rows(table, [part]), TABLES[table])
        return time.perf_counter() - started

    def memory(self) -> int:
        """The bytes the engine holds."""
        return holding_bytes(self.db)

    def rows(self) -> dict[int, list[tuple]]:
        """The rows of every installed query."""
        return {n: list(h.rows()) for n, h in self.handles.items()}

    def close(self) -> None:
        """Close the engine."""
        self.db.close()


class Unshared:
    """Each query on an engine of its own, which loads what the query reads."""

    name = "no sharing"

    def __init__(self, spark, tables: Tables, numbers: Sequence[int]):
        self.spark, self.tables = spark, tables
        self.engines: dict[int, tuple[Engine, object, dict[str, Table]]] = {}

    def install(self, number: int, parts: int) -> float:
        """A new engine loaded with the first ``parts`` batches of what query ``number``
        reads, the query installed on it; the latency of it all."""
        q = QUERIES[number]
        started = time.perf_counter()
        db = Engine(spark=self.spark)
        own = footprint(q, self.tables)
        for t, table in own.items():
            create_table(db, table, self.tables.frames[t].schema)
            if parts:
                load_table(db, self.tables.rows(t, range(parts)), table)
        if q.rules:
            db.register(q.rules)
        self.engines[number] = (db, db.query(q.query, name=q.name), own)
        return time.perf_counter() - started

    def retire(self, number: int) -> None:
        """Close query ``number`` and its engine."""
        db, handle, _ = self.engines.pop(number)
        handle.close()
        db.close()

    def load(self, table: str, part: int) -> float | None:
        """Apply batch ``part`` of ``table`` to every engine whose query reads it; the sum of
        their epochs' latencies (None when no engine reads it)."""
        took = None
        for db, _, own in self.engines.values():
            if table in own:
                started = time.perf_counter()
                load_table(db, self.tables.rows(table, [part]), own[table])
                took = (took or 0.0) + time.perf_counter() - started
        return took

    def memory(self) -> int:
        """The bytes the live engines hold."""
        return sum(holding_bytes(db) for db, _, _ in self.engines.values())

    def rows(self) -> dict[int, list[tuple]]:
        """The rows of every installed query."""
        return {n: list(handle.rows()) for n, (_, handle, _) in self.engines.items()}

    def close(self) -> None:
        """Close every engine."""
        for number in list(self.engines):
            self.retire(number)


@dataclass
class Run:
    """What one configuration measured."""

    name: str
    installs: list[dict] = field(default_factory=list)
    updates: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def stream(config: Shared | Unshared, tables: Tables, plan: list[tuple[list[int], list[int]]], spark) -> Run:
    """Load every batch of every table into ``config``, installing and retiring queries by ``plan``."""
    run = Run(config.name)
    began = time.perf_counter()

    def sample() -> None:
        run.memory.append({"at_s": round(time.perf_counter() - began, 3), "memory_bytes": config.memory(),
                           "jvm_used_bytes": jvm_used_bytes(spark)})

    for part, (installs, retires) in enumerate(plan):
        for number in retires:
            config.retire(number)
        for number in installs:
            seconds = config.install(number, part)
            run.installs.append({"query": QUERIES[number].name, "batch": part, "seconds": round(seconds, 3)})
            sample()
        for table in TABLE_NAMES:
            seconds = config.load(table, part)
            if seconds is not None:
                run.updates.append({"table": table, "batch": part, "seconds": round(seconds, 3)})
            sample()
        took = [u["seconds"] for u in run.updates if u["batch"] == part]
        installed = ", ".join(f"{i['query']} {i['seconds']:.1f} s" for i in run.installs if i["batch"] == part)
        print(f"  {config.name}: batch {part + 1}/{len(plan)}: installed [{installed}], "
              f"retired {[QUERIES[n].name for n in retires]}, epochs {sum(took):.1f} s, "
              f"memory {run.memory[-1]['memory_bytes'] / 2**20:.0f} MiB, at {time.perf_counter() - began:.0f} s",
              flush=True)
    run.seconds = time.perf_counter() - began
    return run


# ------------------------------------------------------------------ correctness, per query, loading

def matched(rows: dict[int, list[tuple]], answers: dict[int, list[tuple]]) -> dict[str, str]:
    """Per query, "yes" or what differs from DuckDB's answer."""
    out = {}
    for number, ours in sorted(rows.items()):
        problem = difference(ours, answers[number])
        out[QUERIES[number].name] = "yes" if problem is None else f"no: {problem}"
    return out


def update_plan(tables: Tables, updates: int) -> list[tuple[int, bool]]:
    """The lineitem epochs of the per-query pass: (batch, added), the last batch retracted and
    added back, then the one before, ..."""
    return [(tables.batches - 1 - (k // 2) % tables.batches, k % 2 == 1) for k in range(updates)]


def register_views(tables: Tables, retracted: int | None) -> None:
    """Spark SQL views of the eight tables over their Parquet files, lineitem without batch
    ``retracted`` (when given)."""
    for t in TABLE_NAMES:
        frame = tables.frames[t]
        if t == STREAM and retracted is not None:
            frame = frame.where(f"NOT ({part_of(t, tables.batches, retracted)})")
        frame.createOrReplaceTempView(t)


def per_query(shared: Shared, tables: Tables, numbers: Sequence[int], updates: int) -> tuple[dict, list[float]]:
    """Each query alone on the loaded shared engine: its install, its incremental lineitem
    epochs and the Spark SQL re-runs of its SQL after each; and the same epochs with no query
    installed (the indexes alone)."""
    spark, db = shared.db.spark, shared.db
    for number in list(shared.handles):
        shared.retire(number)
    epochs = update_plan(tables, updates)

    def apply(batch: int, added: bool) -> float:
        started = time.perf_counter()
        load_table(db, tables.rows(STREAM, [batch]), TABLES[STREAM], added=added)
        return time.perf_counter() - started

    db.wait_for_maintenance()
    alone = [apply(batch, added) for batch, added in epochs]
    out = {}
    for number in numbers:
        q = QUERIES[number]
        db.wait_for_maintenance()  # each pass starts without the merges of the one before
        install = shared.install(number, tables.batches)
        incremental, rerun = [], []
        for batch, added in epochs:
            incremental.append(apply(batch, added))
            register_views(tables, None if added else batch)
            started = time.perf_counter()
            spark.sql(q.sql.rstrip().rstrip(";")).collect()
            rerun.append(time.perf_counter() - started)
        rows = len(shared.handles[number].rows())
        shared.retire(number)
        out[q.name] = {"install_alone_s": round(install, 3), "update_median_s": round(median(incremental), 3),
                       "update_p99_s": round(percentile(incremental, 99), 3), "rows": rows,
                       "sql_rerun_median_s": round(median(rerun), 3),
                       "ratio": round(median(rerun) / median(incremental), 2)}
        print(f"  {q.name}: install {install:.2f} s, update median {median(incremental):.2f} s, "
              f"Spark SQL {median(rerun):.2f} s, ratio {out[q.name]['ratio']}", flush=True)
    for t in TABLE_NAMES:
        spark.catalog.dropTempView(t)
    return out, alone


def load_throughput(spark, tables: Tables) -> dict:
    """Facts per second of loading each table whole through ``load_table`` on a fresh engine,
    from a pandas frame, a cached Spark DataFrame and the Parquet path."""
    out: dict[str, dict] = {}
    for method in ("pandas", "spark", "parquet"):
        db = Engine(spark=spark)
        try:
            for t in TABLE_NAMES:
                if method == "pandas":
                    source = pd.read_parquet(tables.paths[t])
                elif method == "spark":
                    source = tables.frames[t].cache()
                    source.count()
                else:
                    source = tables.paths[t]
                started = time.perf_counter()
                loaded = load_table(db, source, TABLES[t])
                seconds = time.perf_counter() - started
                if method == "spark":
                    source.unpersist()
                facts = sum(loaded.facts.values())
                out.setdefault(t, {})[method] = {"facts": facts, "seconds": round(seconds, 3),
                                                 "facts_per_s": round(facts / seconds)}
        finally:
            db.close()
        print(f"  load {method}: lineitem {out[STREAM][method]['facts_per_s']:,} facts/s", flush=True)
    return out


# ------------------------------------------------------------------ figures

def ccdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Points of the fraction of ``values`` greater than each value, from (smallest, 1)."""
    ordered = sorted(values)
    return ordered[:1] + ordered, [1.0] + [1 - (i + 1) / len(ordered) for i in range(len(ordered))]


def plot(runs: list[Run], path: str, title: str) -> None:
    """The paper's figure 3: (a) CCDF of install latency, (b) CCDF of update latency, (c) memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    for run in runs:
        for axis, values in ((axes[0], [i["seconds"] for i in run.installs]),
                             (axes[1], [u["seconds"] for u in run.updates])):
            xs, ys = ccdf(values)
            axis.step(xs, ys, where="post", label=run.name)
        axes[2].plot([m["at_s"] for m in run.memory], [m["memory_bytes"] / 2**20 for m in run.memory], label=run.name)
    for axis, label in ((axes[0], "(a) install latency (s)"), (axes[1], "(b) update latency (s)")):
        axis.set_xscale("log")
        axis.set_xlabel(label)
        axis.set_ylabel("fraction with latency greater")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("(c) time since the first batch (s)")
    axes[2].set_ylabel("memory held (MiB)")
    for axis in axes:
        axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


# ------------------------------------------------------------------ the run

def goals(trivial: float, runs: dict[str, Run], queries: dict, loading: dict, tables: Tables,
          numbers: Sequence[int]) -> dict[str, str]:
    """The issue's goals, each with its figures and whether it is met."""
    out = {}
    shared = runs["shared"]
    only_lineitem = [QUERIES[n].name for n in numbers if set(footprint(QUERIES[n], tables)) == {STREAM}]
    worst = max((i["seconds"] for i in shared.installs if i["query"] in only_lineitem), default=None)
    if worst is not None:
        out["lineitem-only installs (shared) < 10x trivial job"] = (
            f"{'met' if worst < 10 * trivial else 'NOT met'}: slowest {worst:.3f} s = {worst / trivial:.1f}x "
            f"({', '.join(only_lineitem)})")
    if "no sharing" in runs:
        alone = runs["no sharing"]
        ratio = median([i["seconds"] for i in alone.installs]) / median([i["seconds"] for i in shared.installs])
        out["installs >= 10x faster with sharing (medians)"] = f"{'met' if ratio >= 10 else 'NOT met'}: {ratio:.1f}x"
        peaks = max(m["memory_bytes"] for m in alone.memory) / max(max(m["memory_bytes"] for m in shared.memory), 1)
        out["memory >= 2x lower with sharing (peaks)"] = f"{'met' if peaks >= 2 else 'NOT met'}: {peaks:.2f}x"
    if queries:
        slowest = min(queries.items(), key=lambda kv: kv[1]["ratio"])
        out["incremental >= 10x faster than Spark SQL, every query"] = (
            f"{'met' if slowest[1]['ratio'] >= 10 else 'NOT met'}: lowest {slowest[1]['ratio']}x ({slowest[0]}), "
            f"{sum(q['ratio'] >= 10 for q in queries.values())} of {len(queries)} at >= 10x")
    if loading:
        rates = {m: v["facts_per_s"] for m, v in loading[STREAM].items()}
        out["lineitem load >= 100,000 facts/s"] = (
            f"{'met' if min(rates.values()) >= 100_000 else 'NOT met'}: "
            + ", ".join(f"{m} {r:,}" for m, r in rates.items()))
    return out


def table(runs: dict[str, Run], queries: dict, checks: dict[str, dict[str, str]], names: Sequence[str]) -> list[str]:
    """The per-query lines printed after the run ("-" where the per-query pass was left out)."""
    def installs(run: str, name: str) -> str:
        values = [i["seconds"] for i in runs[run].installs if i["query"] == name] if run in runs else []
        return f"{median(values):.2f}" if values else "-"

    def alone(name: str, key: str, form: str) -> str:
        return format(queries[name][key], form) if name in queries else "-"

    lines = [f"{'query':6} {'inst.shared':>11} {'inst.alone':>10} {'inst.unshared':>13} {'upd.med':>8} "
             f"{'upd.p99':>8} {'rows':>6} {'SparkSQL':>8} {'ratio':>6}  matched DuckDB (shared, no sharing)"]
    for name in names:
        lines.append(f"{name:6} {installs('shared', name):>11} {alone(name, 'install_alone_s', '.2f'):>10} "
                     f"{installs('no sharing', name):>13} {alone(name, 'update_median_s', '.2f'):>8} "
                     f"{alone(name, 'update_p99_s', '.2f'):>8} {alone(name, 'rows', 'd'):>6} "
                     f"{alone(name, 'sql_rerun_median_s', '.2f'):>8} {alone(name, 'ratio', '.1f'):>6}  "
                     f"{checks['shared'].get(name, '-')}, {checks.get('no sharing', {}).get(name, '-')}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=None, help="TPC-H scale factor (default 0.01)")
    parser.add_argument("--batches", type=int, default=None, help="batches per table (default 4; quick 3)")
    parser.add_argument("--seed", type=int, default=37, help="seed of the install/retire schedule")
    parser.add_argument("--updates", type=int, default=None,
                        help="lineitem epochs per query (default 2; 0 skips the per-query pass)")
    parser.add_argument("--queries", default=None, help="comma-separated query numbers (default all 22)")
    parser.add_argument("--skip-unshared", action="store_true", help="run the shared configuration only")
    parser.add_argument("--quick", action="store_true", help="smoke run: SF 0.01, 3 batches, queries 1,3,6,14")
    parser.add_argument("--load-only", action="store_true", help="measure load throughput alone")
    parser.add_argument("--skip-load", action="store_true", help="leave out the load throughput")
    args = parser.parse_args()
    scale = args.scale or 0.01
    batches = args.batches or (3 if args.quick else 4)
    updates = 2 if args.updates is None else args.updates
    numbers = ([int(n) for n in args.queries.split(",")] if args.queries
               else list(QUICK_QUERIES) if args.quick else sorted(QUERIES))
    name = "tpch_stream" + ("-quick" if args.quick else "" if scale == 0.01 else f"-sf{scale:g}")

    paths = generate(scale, os.path.join(DATA, f"sf{scale:g}"))
    spark = engine_session()
    print(f"TPC-H SF {scale:g}, {batches} batches, {len(numbers)} queries, seed {args.seed}; "
          f"session {describe_session(spark)}", flush=True)
    trivial_cold = trivial_job_seconds(spark)
    tables = Tables(spark, paths, batches)
    if args.load_only:
        report(f"tpch_load-sf{scale:g}", machine_facts(spark),
               {"scale": scale, "session": describe_session(spark), "load": load_throughput(spark, tables)})
        return
    plan = schedule(numbers, batches, random.Random(args.seed))
    con = connect(paths)
    answers = {n: answer(con, QUERIES[n].sql) for n in numbers}

    runs: dict[str, Run] = {}
    checks: dict[str, dict[str, str]] = {}
    shared = Shared(spark, tables, numbers)
    try:
        runs["shared"] = stream(shared, tables, plan, spark)
        late = {}
        for number in numbers:
            if number not in shared.handles:
                late[QUERIES[number].name] = round(shared.install(number, batches), 3)
        checks["shared"] = matched(shared.rows(), answers)
        queries, alone = per_query(shared, tables, numbers, updates) if updates else ({}, [])
    finally:
        shared.close()
    # installs are judged against a trivial job of the same session once it is warm (with
    # nothing else running): at its start, before any statement, the JIT compiler leaves
    # such a job 2-3x slower
    trivial = trivial_job_seconds(spark)
    if not args.skip_unshared:
        unshared = Unshared(spark, tables, numbers)
        try:
            runs["no sharing"] = stream(unshared, tables, plan, spark)
            checks["no sharing"] = matched(unshared.rows(), answers)
        finally:
            unshared.close()
    loading = {} if args.skip_load else load_throughput(spark, tables)

    picture = os.path.join(RESULTS if args.quick else os.path.join(ROOT, "docs"), f"{name}.png")
    os.makedirs(os.path.dirname(picture), exist_ok=True)
    plot(list(runs.values()), picture, f"TPC-H SF {scale:g}, {batches} batches per table, {len(numbers)} queries "
                                       f"arriving and retiring (seed {args.seed}), {os.cpu_count()} cores")
    for line in table(runs, queries, checks, [QUERIES[n].name for n in numbers]):
        print(line)
    figures = {
        "scale": scale, "batches": batches, "seed": args.seed, "queries": [QUERIES[n].name for n in numbers],
        "session": describe_session(spark), "trivial_job_s": round(trivial, 4),
        "trivial_job_at_start_s": round(trivial_cold, 4),
        "schedule": [{"batch": i, "install": [QUERIES[n].name for n in ins], "retire": [QUERIES[n].name for n in ret]}
                     for i, (ins, ret) in enumerate(plan)],
        "configurations": {
            r.name: {"stream_s": round(r.seconds, 1),
                     "install_median_s": round(median([i["seconds"] for i in r.installs]), 3),
                     "install_p99_s": round(percentile([i["seconds"] for i in r.installs], 99), 3),
                     "update_median_s": round(median([u["seconds"] for u in r.updates]), 3),
                     "update_p99_s": round(percentile([u["seconds"] for u in r.updates], 99), 3),
                     "memory_peak_mib": round(max(m["memory_bytes"] for m in r.memory) / 2**20, 1),
                     "memory_mean_mib": round(sum(m["memory_bytes"] for m in r.memory) / len(r.memory) / 2**20, 1),
                     "jvm_used_peak_mib": round(max(m["jvm_used_bytes"] for m in r.memory) / 2**20, 1),
                     "installs": r.installs, "updates": r.updates, "memory": r.memory}
            for r in runs.values()},
        "shared_installs_over_loaded_state_s": late,
        "matched_duckdb": checks,
        "per_query": queries,
        "index_only_lineitem_epoch_median_s": round(median(alone), 3) if alone else None,
        "load": loading,
        "goals": goals(trivial, runs, queries, loading, tables, numbers),
        "plot": os.path.relpath(picture, ROOT),
    }
    shown = {k: v for k, v in figures.items() if k != "configurations"}
    shown["configurations"] = {n: {k: v for k, v in c.items() if k not in ("installs", "updates", "memory")}
                               for n, c in figures["configurations"].items()}
    report(name, machine_facts(spark), shown)
    with open(os.path.join(RESULTS, f"{name}-series.json"), "w") as handle:  # every install, epoch and sample
        json.dump({n: {k: c[k] for k in ("installs", "updates", "memory")}
                   for n, c in figures["configurations"].items()}, handle, indent=2)


if __name__ == "__main__":
    main()
