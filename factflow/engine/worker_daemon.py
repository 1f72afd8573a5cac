"""Spark's Python daemon, with what factflow's tasks import loaded before it forks workers,
workers that do not re-read Spark's archives before every task, and workers that end
quietly when their executor has hung up.

Spark starts Python workers by forking them from one daemon process per executor
(``pyspark.daemon``). Each new worker then imports what its first task needs; for an index
probe or an index write (:mod:`factflow.arrangement.index`) that is numpy, pyarrow,
pandas and factflow itself: about 1 s per worker on this machine, paid whenever a task
needs more workers than are idle (a statement whose task chains several probes needs one
per probe), for instance by the first install after a stream of epochs (1.3 s for a
probe task that takes 0.45-0.67 s with warm workers). This daemon imports them once;
forked workers share them. Sessions factflow creates use it (``spark.python.daemon.module``,
see :mod:`factflow.engine.session`).

It also prepares the workers' zip importers (:func:`factflow.workers.prepare`) and stamps
them before it forks, so that no task of theirs re-reads ``pyspark.zip`` (0.2-0.3 s per
task before).

Workers talk to their executor over a Unix domain socket (see :mod:`factflow.engine.session`).
An executor closes the socket of a worker that sat idle for a minute; the worker then fails
to flush its output (``BrokenPipeError``: over a Unix socket the write fails at once, where
over TCP it went into the socket's buffer unnoticed) and Spark's daemon printed the
traceback to the driver's console. A worker whose executor hung up now just ends, as it
did over TCP.

Spark's daemon runs a full garbage collection in a reused worker after every task, and the
worker's next task waits for it: over the modules above that took 11 ms, 13 ms per task in
all for a probe that itself takes 1-2 ms (a TPC-H Q19 epoch's statement runs 40 probe tasks
on the driver, one after another). This daemon freezes its objects before it forks
(:func:`gc.freeze`): collections leave them out, and they stay shared with the workers
rather than copied as a collection touches them.
"""

import gc
import importlib

import factflow.arrangement.index  # noqa: F401 - numpy, pyarrow, pandas and factflow, for every worker
from factflow import workers
from pyspark import daemon

workers.prepare()
importlib.invalidate_caches()  # stamp the importers the daemon has, before it forks workers

_serve = daemon.worker


def _worker(sock, authenticated):
    """Serve tasks on ``sock`` (Spark's :func:`pyspark.daemon.worker`); an exit code of 1,
    without a traceback, once the executor has closed the socket."""
    try:
        return _serve(sock, authenticated)
    except (BrokenPipeError, ConnectionResetError):
        return 1


daemon.worker = _worker  # the daemon's forked children call the module's ``worker``

if __name__ == "__main__":
    gc.collect()
    gc.freeze()
    daemon.manager()
