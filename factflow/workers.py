"""What factflow's task code does to the Spark Python worker it runs in.

Spark's Python worker calls ``importlib.invalidate_caches()`` before every task, after
adding the task's files to the path (``setup_spark_files``). Since Python 3.10 that makes
every ``zipimporter`` re-read its archive's whole directory (CPython issue gh-103200; so in
the 3.11 used here), and Spark imports ``pyspark`` from ``pyspark.zip``: one importer per
imported subpackage, each re-reading the archive's 1,300 entries. On this machine that was
0.2-0.3 s before every task's first row, reused worker or not, and once more for each
worker a task chains (a probe statement's task runs one per probe).

:func:`prepare` makes an importer re-read its archive only when the file changed since it
last read it (its modification time or size), so an unchanged archive costs a ``stat`` per
importer. factflow's worker daemon (:mod:`factflow.engine.worker_daemon`) calls it before
it forks workers. factflow's task functions (index probes and writes, fact-file writes, the
workers' warm-up) call it as well, so that the workers of a session factflow did not create
pay the re-reads only until their first factflow task. It is meant for worker processes:
factflow's driver-side code never calls it.
"""

from __future__ import annotations

import os
import zipimport

__all__ = ["prepare"]

_reread = zipimport.zipimporter.invalidate_caches


def _stamp(path: str) -> tuple[int, int] | None:
    """The modification time and size of ``path``; None when it cannot be read."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


def _reread_when_changed(importer: zipimport.zipimporter) -> None:
    """``zipimporter.invalidate_caches``, skipped while the archive is unchanged since the last read."""
    stamp = _stamp(importer.archive)
    if stamp is None or getattr(importer, "_factflow_stamp", None) != stamp:
        _reread(importer)
        importer._factflow_stamp = stamp


def prepare() -> None:
    """Make this process's zip importers re-read their archives only when they changed."""
    zipimport.zipimporter.invalidate_caches = _reread_when_changed
