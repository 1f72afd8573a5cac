"""Where a small epoch's time goes on a cluster: its Spark jobs and their tasks, against local mode.

``benchmarks/cluster.py`` measures what a cluster costs per epoch; this says where that
time goes. The same workload (``epoch_latency.py``'s LDBC SNB tiny persons, knows and
places; five queries; epochs of one change) runs in local mode and on the two-worker
standalone cluster of the cluster tests (``tests/cluster/standalone.py``: each worker in
its own mount namespace with its own loopback address), state in a local directory and in
a directory both workers see. Each in a process of its own with the Spark UI on (the
only difference from a default session), so that its REST API gives every job's span and
its tasks' metrics: deserialization on the executor, run time (wall), CPU and GC time, the
size of the results, the scheduler's delay (launch to start, and finish to the driver's
knowing), and from the job's submission to its first task's launch and from its last
task's end to its completion.

Printed per configuration: each small epoch's time and phases, then for the last
``--shown`` epochs each job's span and its task's metrics, and the medians over those jobs;
and the median time of a trivial job (one row, one task) in the same session: the floor
Spark puts under any job in that configuration.

    python benchmarks/cluster_tasks.py [--epochs 12] [--shown 6]

``EXTRA_CONF`` (a JSON object of Spark settings) adds settings to both sessions, to test a
hypothesis, e.g. ``EXTRA_CONF='{"spark.sql.codegen.wholeStage": "false"}'``.
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
import urllib.request
from datetime import datetime, timezone

from common import ROOT, machine_facts, median, report

sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))

METRICS = ("job_ms", "stages", "tasks", "to_launch_ms", "after_tasks_ms", "task_ms", "deserialize_ms", "run_ms", "cpu_ms",
           "gc_ms", "result_bytes", "scheduler_delay_ms")
#: Runs of the trivial job whose median is the Spark floor a job costs in each configuration.
TRIVIAL_RUNS = 40


def _instant(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fGMT").replace(tzinfo=timezone.utc).timestamp()


def job_metrics(spark, jobs: int) -> list[dict]:
    """The last ``jobs`` jobs labelled with an epoch: each one's span and its tasks' metrics."""
    base = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}"

    def get(path: str):
        with urllib.request.urlopen(f"{base}/{path}") as response:
            return json.load(response)

    found = []
    for job in get("jobs"):  # newest first
        description = job.get("description") or ""
        if not description.startswith("epoch ") or "maintenance" in description or "completionTime" not in job:
            continue
        entry = {"job": description[:48], "job_ms": round(1000 * (_instant(job["completionTime"])
                                                                   - _instant(job["submissionTime"])))}
        tasks = [t for stage in job["stageIds"] for attempt in get(f"stages/{stage}")
                 for t in get(f"stages/{stage}/{attempt['attemptId']}/taskList?length=100")]
        if tasks:
            metrics = [t.get("taskMetrics", {}) for t in tasks]
            launches = [_instant(t["launchTime"]) for t in tasks]
            ends = [start + t.get("duration", 0) / 1000 for start, t in zip(launches, tasks)]
            entry.update({"stages": len(job["stageIds"]), "tasks": len(tasks),
                          "to_launch_ms": round(1000 * (min(launches) - _instant(job["submissionTime"]))),
                          "after_tasks_ms": round(1000 * (_instant(job["completionTime"]) - max(ends))),
                          "task_ms": sum(t.get("duration", 0) for t in tasks),
                          "deserialize_ms": sum(m.get("executorDeserializeTime", 0) for m in metrics),
                          "run_ms": sum(m.get("executorRunTime", 0) for m in metrics),
                          "cpu_ms": round(sum(m.get("executorCpuTime", 0) for m in metrics) / 1e6),
                          "gc_ms": sum(m.get("jvmGcTime", 0) for m in metrics),
                          "result_bytes": sum(m.get("resultSize", 0) for m in metrics),
                          "scheduler_delay_ms": sum(t.get("schedulerDelay", 0) for t in tasks)})
        found.append(entry)
        if len(found) == jobs:
            break
    return list(reversed(found))


def child(mode: str, epochs: int, shown: int, settings: dict) -> dict:
    """One configuration in this process: load, install the five queries, small epochs."""
    from epoch_latency import FIVE, RULES, persons_of, transaction

    from factflow import Engine, create_session
    from factflow.io.ldbc import load_ldbc

    ui = {"spark.ui.enabled": "true", **json.loads(os.environ.get("EXTRA_CONF", "{}"))}
    if mode == "local":
        spark = create_session(app_name="factflow-bench-tasks-local", conf=ui)
    else:
        from standalone import wait_for_executors

        spark = create_session(settings["master"], app_name="factflow-bench-tasks-cluster",
                               conf={**settings["conf"], **ui})
        wait_for_executors(spark, 2)
    figures: dict = {"mode": mode, "master": spark.sparkContext.master}
    with Engine(spark=spark, state_dir=settings["state"]) as db:
        load_ldbc(db)
        db.register(RULES)
        for i, (text, inputs) in enumerate(FIVE):
            db.query(text, name=f"q{i + 1}", inputs=inputs)
        db.wait_for_maintenance()
        persons, rng, next_id = persons_of(db), random.Random(7), [10**15]
        reports = []
        for _ in range(epochs):
            db.transact(transaction(rng, 1, persons, next_id))
            reports.append(db.epoch_log[-1])
        db.wait_for_maintenance()
        time.sleep(1)  # the UI's listener catches up
        last = reports[-shown:]
        figures["epochs"] = [{"epoch": r.epoch, "s": round(r.seconds, 3),
                              **{k: round(v, 3) for k, v in r.phases.items()}} for r in last]
        figures["epoch_median_s"] = median([r.seconds for r in last])
        figures["jobs"] = job_metrics(spark, sum(len(r.jobs) for r in last))
        trivial = spark.range(0, 1, 1, 1)
        times = []
        for _ in range(TRIVIAL_RUNS):
            start = time.perf_counter()
            trivial.collect()
            times.append(time.perf_counter() - start)
        figures["trivial_job_ms"] = round(1000 * median(times[TRIVIAL_RUNS // 4:]), 1)
    spark.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12, help="epochs of one change")
    parser.add_argument("--shown", type=int, default=6, help="the last epochs whose jobs are shown")
    parser.add_argument("--child", choices=("local", "cluster"), help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.epochs, args.shown, json.loads(args.settings))),
              flush=True)
        return

    from standalone import StandaloneCluster

    results = {}
    with StandaloneCluster() as cluster:
        local_dir = tempfile.mkdtemp(prefix="factflow-bench-tasks-")
        for mode in ("local", "cluster"):
            settings = {"master": cluster.master_url, "conf": cluster.session_conf(),
                        "state": os.path.join(local_dir, mode) if mode == "local" else str(cluster.shared_dir / "tasks")}
            done = subprocess.run([sys.executable, __file__, "--child", mode, "--epochs", str(args.epochs),
                                   "--shown", str(args.shown), "--settings", json.dumps(settings)],
                                  capture_output=True, text=True)
            line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"{mode} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            results[mode] = found = json.loads(line[len("RESULT "):])
            print(f"\n{mode}: small epochs {[e['s'] for e in found['epochs']]}, median {found['epoch_median_s']:.3f} s; "
                  f"a trivial job (one row, one task, no Python) {found['trivial_job_ms']} ms")
            for job in found["jobs"]:
                print(f"  {job['job']:<40} " + " ".join(f"{k} {job.get(k, '-')}" for k in METRICS))
            kinds = {"changes": [j for j in found["jobs"] if "effective changes" in j["job"]],
                     "queries": [j for j in found["jobs"] if "queries" in j["job"]]}
            found["median"] = {kind: {k: median([j[k] for j in jobs if k in j]) for k in METRICS}
                               for kind, jobs in kinds.items() if jobs}
            for kind, values in found["median"].items():
                print(f"  median {kind:<33} " + " ".join(f"{k} {v}" for k, v in values.items()))
    report("cluster-tasks", machine_facts(None), {m: {k: v for k, v in f.items() if k != "jobs"}
                                                  for m, f in results.items()})


if __name__ == "__main__":
    main()
