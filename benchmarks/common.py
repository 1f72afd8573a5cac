"""Shared helpers for the benchmarks: the Spark session, machine facts, statistics, output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from factflow import create_session  # noqa: E402
from factflow.engine.session import DEFAULT_SPARK_CONF  # noqa: E402

GRAPHS = os.environ.get("FACTFLOW_GRAPHS", os.path.join(ROOT, "..", "shared", "data", "graphs"))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def session(memory: str = "6g", master: str = "local[*]"):
    """The benchmark SparkSession (local mode on every core, factflow's defaults)."""
    return create_session(master, app_name="factflow-bench", conf={"spark.driver.memory": memory})


def engine_session(master: str = "local[*]"):
    """A SparkSession configured as the one ``factflow.Engine()`` creates for itself (factflow's
    defaults, driver memory included; only the application name differs), so that figures
    measured with ``Engine(spark=engine_session())`` are those of a default engine.
    (:func:`session` sets a 6 GB driver where the engine's default is 2 GB.)"""
    return create_session(master, app_name="factflow-bench")


def session_differences(spark) -> dict:
    """The settings of ``spark`` that differ from what a default ``factflow.Engine()`` gets
    (``{key: (this session, engine default)}``; empty when the session is the engine's own)."""
    context = spark.sparkContext.getConf()
    differences = {}
    for key, default in DEFAULT_SPARK_CONF.items():
        value = context.get(key, None)
        if value is None:
            value = spark.conf.get(key, None)
        if value != default:
            differences[key] = (value, default)
    return differences


def describe_session(spark) -> str:
    """One line saying whether ``spark`` is configured as a default engine's session."""
    heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory() / 2**30
    differences = session_differences(spark)
    if not differences:
        return f"as a default factflow.Engine() gets it (driver heap max {heap:.1f} GiB)"
    shown = ", ".join(f"{k}={v!r} (engine default {d!r})" for k, (v, d) in differences.items())
    return f"DIFFERS from a default factflow.Engine(): {shown}; driver heap max {heap:.1f} GiB"


def machine_facts(spark) -> dict:
    """What the figures were measured on (``spark`` None: the machine only, for a benchmark
    whose sessions ran in processes of their own)."""
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except OSError:
        mem_kb = 0
    machine = {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "java": java,
    }
    if spark is None:
        import pyspark

        return dict(machine, spark=pyspark.__version__)
    return {
        **machine,
        "spark": spark.version,
        "master": spark.sparkContext.master,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "driver_memory": spark.sparkContext.getConf().get("spark.driver.memory", None),
        "session_differs_from_engine_defaults": {k: v[0] for k, v in session_differences(spark).items()},
    }


def median(values: Sequence[float]) -> float:
    """The median."""
    return statistics.median(values)


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank)."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    """Run ``fn``; return (seconds, result)."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def trivial_job_seconds(spark, runs: int = 15) -> float:
    """Median time of a trivial Spark job (collect three rows) on ``spark``."""
    times = [timed(lambda: spark.range(3).toArrow())[0] for _ in range(runs)]
    return median(times[3:])


def limited(spark, fn: Callable[[], object], limit: float) -> tuple[float | None, object]:
    """Run ``fn``; past ``limit`` seconds every Spark job of ``spark`` is cancelled:
    (seconds, result), or (None, why it has no time: past the limit, or its error)."""
    done = threading.Event()

    def cancel() -> None:
        if done.wait(limit):
            return
        while not done.is_set():
            spark.sparkContext.cancelAllJobs()
            time.sleep(0.5)

    watchdog = threading.Thread(target=cancel, daemon=True)
    watchdog.start()
    started = time.perf_counter()
    try:
        result = fn()
        return time.perf_counter() - started, result
    except Exception as exc:  # noqa: BLE001 - cancelled past the limit, or failed
        elapsed = time.perf_counter() - started
        if elapsed >= limit:
            return None, f"did not finish in {limit:.0f} s"
        return None, f"failed after {elapsed:.0f} s ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
    finally:
        done.set()
        watchdog.join()


def jvm_used_bytes(spark) -> int:
    """The driver JVM's used heap, in bytes (live objects and garbage not yet collected)."""
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
    return runtime.totalMemory() - runtime.freeMemory()


def jobs_so_far(spark) -> int:
    """Spark jobs submitted by ``spark`` so far (the scheduler's next job id)."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


def report(name: str, facts: dict, figures: dict) -> None:
    """Print the figures and machine facts, and save them as JSON under benchmarks/results/."""
    print(f"\n== {name} ==")
    for key, value in facts.items():
        print(f"  machine.{key}: {value}")
    for key, value in figures.items():
        print(f"  {key}: {value}")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{name}.json"), "w") as handle:
        json.dump({"machine": facts, "figures": figures}, handle, indent=2, default=str)
