"""Warming a Spark application up before the first epoch needs it: its Python workers, and
the class loader its tasks run under.

Index files are written, and traces probed, by Python functions inside Spark tasks
(``mapInArrow``, see :mod:`factflow.arrangement.index`). The first such job of a Spark
application starts Spark's Python worker daemon and its workers: measured here, 1.8 s
for a job that takes 0.46 s once they run. Without a warm-up that cost lands on whichever
epoch first writes an index file, often one far into a stream (epoch 72 of the oregon1
triangles, which then took 3.5 s instead of about 1 s). So an engine starts them when it
is created: one tiny job per session, in a background thread, as many tasks as the
session runs at once. Nothing waits for it; if it fails (the session stopped meanwhile)
it is logged at debug level and changes nothing. The same thread first records the class
loader Spark's tasks run under, so that engine threads compile generated code once
(:func:`factflow.engine.session.share_task_class_loader`). On a cluster it also starts the
driver's own Python workers: a small epoch's probes of index files run there, in statements
the driver runs without a Spark job (:func:`factflow.arrangement.bound.collected`); in local
mode the driver's workers are the tasks'.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from factflow.arrangement.bound import collected, supported, tasks_in_driver_jvm
from factflow.engine.session import label_jobs, share_task_class_loader

__all__ = ["warm_up"]

log = logging.getLogger("factflow.engine")

_WARMED: set[str] = set()
_WARMED_LOCK = threading.Lock()


def warm_up(spark: SparkSession, pool: str | None = None) -> threading.Thread | None:
    """Share the tasks' class loader and start ``spark``'s Python workers in the background,
    once per Spark application; returns the thread doing it (None when another engine did
    it already). ``pool``: the scheduler pool of its jobs."""
    application = spark.sparkContext.applicationId
    with _WARMED_LOCK:
        if application in _WARMED:
            return None
        _WARMED.add(application)
    thread = threading.Thread(target=_warm, args=(spark, pool), name="factflow-warmup", daemon=True)
    thread.start()
    return thread


def _warm(spark: SparkSession, pool: str | None) -> None:
    sc = spark.sparkContext
    try:
        label_jobs(sc, "factflow-warmup", "factflow: share the tasks' class loader, start Python workers")
        if pool is not None:
            sc.setLocalProperty("spark.scheduler.pool", pool)
        share_task_class_loader(sc)
        tasks = max(1, sc.defaultParallelism)
        spark.range(0, tasks, 1, tasks).mapInArrow(_nothing, "id BIGINT").collect()
        if not tasks_in_driver_jvm(sc.master) and supported(spark):  # the driver's own Python workers
            collected(spark.sql("SELECT * FROM VALUES (0L) AS t(id)").mapInArrow(_nothing, "id BIGINT"))
    except Exception:  # noqa: BLE001 - a warm-up that fails costs only the first epoch its time
        log.debug("starting Spark's Python workers failed", exc_info=True)


def _nothing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The task side: load what probes and index writes use, consume the input, emit nothing."""
    import factflow.arrangement.index  # noqa: F401 - what the first probe or index write imports
    from factflow import workers

    workers.prepare()
    for _ in batches:
        pass
    return iter(())
