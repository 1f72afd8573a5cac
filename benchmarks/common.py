"""Shared helpers for the benchmarks: the Spark session, machine facts, statistics, output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from factflow import create_session  # noqa: E402

GRAPHS = os.environ.get("FACTFLOW_GRAPHS", os.path.join(ROOT, "..", "shared", "data", "graphs"))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def session(memory: str = "6g", master: str = "local[*]"):
    """The benchmark SparkSession (local mode on every core, factflow's defaults)."""
    return create_session(master, app_name="factflow-bench", conf={"spark.driver.memory": memory})


def machine_facts(spark) -> dict:
    """What the figures were measured on."""
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except OSError:
        mem_kb = 0
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "java": java,
        "spark": spark.version,
        "master": spark.sparkContext.master,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
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
