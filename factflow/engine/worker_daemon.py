"""Spark's Python daemon, with what factflow's tasks import loaded before it forks workers,
and a task set-up that does not re-read Spark's archives.

Spark starts Python workers by forking them from one daemon process per executor
(``pyspark.daemon``). Each new worker then imports what its first task needs; for an index
probe or an index write (:mod:`factflow.arrangement.index`) that is numpy, pyarrow,
pandas and factflow itself: about 1 s per worker on this machine, paid whenever a task
needs more workers than are idle (a statement whose task chains several probes needs one
per probe), for instance by the first install after a stream of epochs (1.3 s for a
probe task that takes 0.45-0.67 s with warm workers). This daemon imports them once;
forked workers share them. Sessions factflow creates use it (``spark.python.daemon.module``,
see :mod:`factflow.engine.session`).

Every Python task also begins with ``importlib.invalidate_caches()`` (Spark's worker calls
it after adding the task's files to the path). Since Python 3.10 that makes every
``zipimporter`` re-read its archive's whole directory (CPython issue gh-103200; so in the
3.11 used here), and Spark imports ``pyspark`` from ``pyspark.zip``: one importer per
imported subpackage, each re-reading the archive's 1,300 entries. On this machine that was 0.2-0.3 s before every task's first row, reused worker or
not, for each worker a task chains (a probe statement's task runs one per probe). Here an
importer re-reads its archive only when the file changed since it last read it (its
modification time or size), so an unchanged archive costs a ``stat`` per importer.
"""

import importlib
import os
import zipimport

import factflow.arrangement.index  # noqa: F401 - numpy, pyarrow, pandas and factflow, for every worker
from pyspark import daemon

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


zipimport.zipimporter.invalidate_caches = _reread_when_changed
importlib.invalidate_caches()  # stamp the importers the daemon has, before it forks workers

if __name__ == "__main__":
    daemon.manager()
