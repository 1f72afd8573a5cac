"""Fixtures for tests on a real Spark standalone cluster whose workers stand in for separate
hosts (:mod:`standalone`), with an S3-compatible server.

PySpark allows one SparkContext per process, and the main suite uses a local one, so these
tests run in a pytest invocation of their own: ``pytest tests/cluster`` (``scripts/test.sh``
runs it after the main suite; a plain ``pytest`` leaves this directory out, see
``tests/conftest.py``). Where mount namespaces are not permitted the tests that need the
cluster skip, saying why.

The start-up times of the cluster and of its session are printed at the end of the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "storage"))  # durable.py

from standalone import ClusterUnavailable, S3Server, StandaloneCluster, check_namespaces, wait_for_executors

#: What the fixtures measured, for the run's summary.
_SECONDS: dict[str, float] = {}


@pytest.fixture(scope="session")
def cluster():
    """A :class:`standalone.StandaloneCluster` of two workers, 127.0.0.2 and 127.0.0.3,
    for the whole run; stopping it at the end checks that none of its processes is left."""
    try:
        check_namespaces()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    with StandaloneCluster() as started:
        _SECONDS["cluster start-up"] = started.start_seconds
        yield started
    listed = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    assert not [line for line in listed.splitlines() if str(started.base_dir) in line], "processes left after stop()"


@pytest.fixture(scope="session")
def s3():
    """A :class:`standalone.S3Server` (moto) with its bucket, for the whole run. This
    process's environment has :meth:`~standalone.S3Server.env` meanwhile, as a driver's
    host would; executors get it from the ``cluster_spark`` session's settings."""
    with S3Server() as server, pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
            patch.delenv(name, raising=False)  # would take precedence over, or mix with, the server's settings
        for name, value in server.env().items():
            patch.setenv(name, value)
        yield server


@pytest.fixture(scope="session")
def cluster_spark(cluster, s3):
    """The one SparkSession of this run, made by ``factflow.create_session`` on ``cluster``'s
    master, with an executor on every worker and ``s3``'s environment on every executor."""
    from factflow import create_session
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        pytest.fail("a SparkContext already runs in this process: run tests/cluster in a pytest invocation of "
                    "its own (PySpark allows one SparkContext per process)")
    began = time.monotonic()
    session = create_session(cluster.master_url, app_name="factflow-cluster-tests",
                             conf={**cluster.session_conf(), **s3.executor_conf(),
                                   "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    try:
        wait_for_executors(session, cluster.workers)
        _SECONDS["session start-up (to all executors registered)"] = time.monotonic() - began
        yield session
    finally:
        session.stop()


def pytest_terminal_summary(terminalreporter):
    """Report the start-up times the fixtures measured."""
    if _SECONDS:
        terminalreporter.section("cluster start-up")
        for what, seconds in _SECONDS.items():
            terminalreporter.write_line(f"{what}: {seconds:.1f} s")
