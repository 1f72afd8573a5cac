"""What a cluster costs: the same epochs in local mode and on a two-worker standalone cluster.

The workload of ``benchmarks/epoch_latency.py`` (LDBC SNB persons, knows and places; five
queries; transactions of 1, 100 and 10,000 changes) runs in three configurations, each in
a process of its own (PySpark allows one SparkContext per process), in turns, ``--rounds``
times, on one machine in one run:

- ``local``: a default ``factflow.Engine()`` (local mode) with its state in a local directory;
- ``shared``: the same on a standalone cluster of two workers, each in its own mount namespace
  with a private ``/tmp`` and its own loopback address (``tests/cluster/standalone.py``: what the
  cluster tests use, separate hosts as far as Spark can tell), state in a directory every
  worker sees;
- ``s3``: the same cluster with state in an S3 bucket (moto's server on 127.0.0.1).

Each configuration loads the data into a durable engine, installs the five queries, times
the install of a sixth query on the loaded state, runs ``--warmup`` epochs of one change
and a quarter as many of 100 changes (not measured), then ``--epochs`` epochs of each size.
The warm-up is what "a warm cache"
means here: besides the file caches, a JVM compiles the code of the tasks it runs only
after it has run them a while (``benchmarks/cluster_tasks.py``: after 10 epochs whose one
task ran on an executor every other epoch, a cluster's small epoch took 1.8-1.9x local
mode's, after 45-64 epochs 1.4-1.5x). A one-change epoch's statements now run on the
driver without a Spark job, so they no longer warm the executors: the 100-change epochs of
the warm-up do (their queries' statement probes stored state in a job; without them the
jobs of the first measured 100-change epochs met cold executors). Reported per
configuration and size:
the median and max epoch time (the first two epochs of each size left out: they plan new
statement shapes), Spark jobs and statements run on the driver per epoch, the share of
statements run from kept plans, and the median time per phase of the one-change epochs;
and per round the ratio of each cluster configuration's median to local mode's, whose
median over rounds is the figure quoted (target: a small epoch on the cluster within 1.5x
of local mode, with a warm cache). The cluster's executors: one core and 2 GiB each.

    python benchmarks/cluster.py [--rounds 2] [--epochs 8] [--warmup 40]
    python benchmarks/cluster.py --quick        # one round of 3 epochs per size, 10 to warm up
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

from common import ROOT, machine_facts, median, report

sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))

MODES = ("local", "shared", "s3")
SIZES = (1, 100, 10_000)
EXTRA = "[:find ?p ?n :where [?p :person/lastName ?n] [?p :person/gender \"male\"] [?p :person/browserUsed \"Opera\"]]"


def child(mode: str, epochs: int, warmup: int, settings: dict) -> dict:
    """One configuration, in this process: load, install, warm up, time the epochs."""
    from epoch_latency import FIVE, RULES, persons_of, transaction

    from factflow import Engine, create_session
    from factflow.io.ldbc import load_ldbc

    if mode == "local":
        spark = create_session(app_name="factflow-bench-local")
    else:
        spark = create_session(settings["master"], app_name=f"factflow-bench-{mode}", conf=settings["conf"])
        from standalone import wait_for_executors

        wait_for_executors(spark, 2)
    state = settings["state"]
    figures: dict = {"mode": mode, "master": spark.sparkContext.master, "state": state}
    with Engine(spark=spark, state_dir=state) as db:
        began = time.perf_counter()
        load_ldbc(db)
        figures["load_s"] = round(time.perf_counter() - began, 3)
        db.register(RULES)
        for i, (text, inputs) in enumerate(FIVE):
            db.query(text, name=f"q{i + 1}", inputs=inputs)
        db.wait_for_maintenance()
        began = time.perf_counter()
        db.query(EXTRA, name="extra").close()
        figures["install_s"] = round(time.perf_counter() - began, 3)
        persons = persons_of(db)
        rng = random.Random(7)
        next_id = [10**15]
        began = time.perf_counter()
        for size in [1] * warmup + [100] * (warmup // 4):
            db.transact(transaction(rng, size, persons, next_id))
        figures["warmup_s"] = round(time.perf_counter() - began, 3)
        for size in SIZES:
            times, jobs, on_driver, reused, phases = [], [], [], [], []
            for _ in range(epochs):
                db.transact(transaction(rng, size, persons, next_id))
                r = db.epoch_log[-1]
                times.append(r.seconds)
                phases.append(r.phases)
                jobs.append(len(r.jobs))
                on_driver.append(len(r.on_driver))
                reused.append(r.plans_reused / r.statements if r.statements else 0.0)
            warm = slice(2, None) if epochs > 2 else slice(None)
            figures[str(size)] = {"median_s": round(median(times[warm]), 3), "max_s": round(max(times[warm]), 3),
                                  "jobs_median": median(jobs[warm]), "on_driver_median": median(on_driver[warm]),
                                  "from_kept_plans": round(sum(reused[warm]) / len(reused[warm]), 2)}
            if size == 1:
                figures["small_epoch_phases_s"] = {k: round(median([p.get(k, 0.0) for p in phases[warm]]), 4)
                                                   for k in phases[-1]}
                figures["small_epoch_jobs"] = r.steps
        figures["file_cache"] = file_cache(spark)
    spark.stop()
    return figures


def cached_files() -> tuple[int, int]:
    """The files and bytes of index files this Spark process (an executor's Python worker, or
    the driver) has copied from an object store (see factflow.storage.cache)."""
    from pyspark import SparkFiles

    directory = os.path.join(SparkFiles.getRootDirectory(), "factflow-file-cache")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return len(names), sum(os.path.getsize(os.path.join(directory, n)) for n in names)


def file_cache(spark) -> dict:
    """Per executor host, and for the driver (whose small statements probe too), the files
    and bytes of index files copied to its cache, read by a task on each executor."""
    def count(_rows):
        import socket

        yield (os.environ.get("SPARK_LOCAL_IP") or socket.gethostname(), *cached_files())

    tasks = max(2, spark.sparkContext.defaultParallelism)
    seen = spark.sparkContext.parallelize(range(tasks), tasks).mapPartitions(count).collect()
    on_driver = cached_files()
    return {host: {"files": files, "bytes": size}
            for host, files, size in [("driver", *on_driver), *sorted(set(seen))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="turns of the three configurations (default 2)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per size (default 8)")
    parser.add_argument("--warmup", type=int, default=None, help="unmeasured epochs of one change first, then a quarter as many of 100 (default 40)")
    parser.add_argument("--quick", action="store_true", help="one round of 3 epochs per size, 10 to warm up")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    epochs = args.epochs or (3 if args.quick else 8)
    warmup = args.warmup if args.warmup is not None else (10 if args.quick else 40)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, epochs, warmup, json.loads(args.settings))), flush=True)
        return
    rounds = args.rounds or (1 if args.quick else 2)

    from standalone import S3Server, StandaloneCluster

    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with S3Server() as s3, StandaloneCluster() as cluster:
        local_dir = tempfile.mkdtemp(prefix="factflow-bench-state-")
        for round_ in range(rounds):
            for mode in MODES:
                name = f"bench-{round_}-{mode}"
                state = {"local": os.path.join(local_dir, name), "shared": str(cluster.shared_dir / name),
                         "s3": f"s3://{s3.bucket}/{name}"}[mode]
                settings = {"master": cluster.master_url, "conf": {**cluster.session_conf(), **s3.executor_conf()},
                            "state": state}
                env = dict(os.environ, **(s3.env() if mode == "s3" else {}))
                print(f"round {round_ + 1}, {mode} ...", flush=True)
                done = subprocess.run([sys.executable, __file__, "--child", mode, "--epochs", str(epochs),
                                       "--warmup", str(warmup), "--settings", json.dumps(settings)],
                                      env=env, capture_output=True, text=True)
                line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
                if line is None:
                    raise SystemExit(f"{mode} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
                found = json.loads(line[len("RESULT "):])
                results[mode].append(found)
                print(f"  load {found['load_s']} s, install {found['install_s']} s, " + ", ".join(
                    f"{size}: {found[str(size)]['median_s']} s ({found[str(size)]['jobs_median']} jobs, "
                    f"{found[str(size)]['on_driver_median']} on the driver)"
                    for size in SIZES), flush=True)
    figures: dict = {"rounds": rounds, "epochs_per_size": epochs, "warmup_epochs": warmup, "queries": 5}
    for mode in MODES:
        runs = results[mode]
        figures[mode] = {
            "load_s": median([r["load_s"] for r in runs]), "install_s": median([r["install_s"] for r in runs]),
            "warmup_s": median([r["warmup_s"] for r in runs]),
            **{f"epoch_{size}_median_s": median([r[str(size)]["median_s"] for r in runs]) for size in SIZES},
            **{f"epoch_{size}_max_s": max(r[str(size)]["max_s"] for r in runs) for size in SIZES},
            **{f"epoch_{size}_jobs": median([r[str(size)]["jobs_median"] for r in runs]) for size in SIZES},
            **{f"epoch_{size}_on_driver": median([r[str(size)]["on_driver_median"] for r in runs]) for size in SIZES},
            "small_epoch_from_kept_plans": median([r["1"]["from_kept_plans"] for r in runs]),
            "small_epoch_phases_s": {k: median([r["small_epoch_phases_s"].get(k, 0.0) for r in runs])
                                     for k in runs[-1]["small_epoch_phases_s"]},
            "small_epoch_jobs": runs[-1]["small_epoch_jobs"],
            "file_cache_at_end": runs[-1]["file_cache"],
        }
    for mode in ("shared", "s3"):
        for size in SIZES:
            ratios = [c[str(size)]["median_s"] / l[str(size)]["median_s"]
                      for c, l in zip(results[mode], results["local"])]
            figures[f"ratio_{mode}_to_local_{size}"] = round(median(ratios), 2)
        figures[f"ratio_{mode}_to_local_install"] = round(median(
            [c["install_s"] / l["install_s"] for c, l in zip(results[mode], results["local"])]), 2)
    print(f"\n{'':>8} {'load':>7} {'install':>8} " + " ".join(f"{s:>9}" for s in SIZES))
    for mode in MODES:
        f = figures[mode]
        print(f"{mode:>8} {f['load_s']:>6.1f}s {f['install_s']:>7.2f}s "
              + " ".join(f"{f[f'epoch_{s}_median_s']:>8.3f}s" for s in SIZES))
    for mode in ("shared", "s3"):
        print(f"{mode} / local: install {figures[f'ratio_{mode}_to_local_install']}x, "
              + ", ".join(f"{s} changes {figures[f'ratio_{mode}_to_local_{s}']}x" for s in SIZES))
    report("cluster" + ("-quick" if args.quick else ""), machine_facts(None), figures)


if __name__ == "__main__":
    main()
