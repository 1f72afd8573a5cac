"""One SparkSession for the whole test run (local mode, small memory and shuffles)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"

#: tests/cluster runs on a standalone cluster with a SparkSession of its own, and tests/tpch
#: on a local session with a larger driver (its conftest says why); PySpark allows one
#: SparkContext per process, so each runs in a pytest invocation of its own (``pytest
#: tests/cluster``, ``pytest tests/tpch``, which scripts/test.sh runs after the main suite).
collect_ignore = ["cluster", "tpch"]


@pytest.fixture(scope="session")
def spark():
    from factflow import create_session

    session = create_session(
        "local[2]",
        app_name="factflow-tests",
        conf={"spark.driver.memory": "2g", SHUFFLE_PARTITIONS: "2", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3():
    """moto's S3 server on 127.0.0.1 with a bucket ``factflow``, for the whole run
    (:class:`standalone.S3Server` of the cluster tests). Tasks of the local session are
    forked from a JVM started before it, so they do not see environment variables set now:
    tests pass the server to factflow as ``storage_options`` (``server.storage_options()``)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cluster"))
    from standalone import S3Server

    with S3Server() as server:
        yield server



@pytest.fixture(autouse=True)
def _shuffle_partitions_left_as_they_were():
    """Fails a test that leaves the shared session's shuffle partitions changed. Unsetting
    them falls back to Spark's default of 200, not to the session's 2: every later bulk
    statement and merge then shuffled into 200 tasks, and the suite ran several times slower."""
    yield
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None and not session.sparkContext._jsc.sc().isStopped():
        left = session.conf.get(SHUFFLE_PARTITIONS)
        session.conf.set(SHUFFLE_PARTITIONS, "2")  # so that only this test fails
        assert left == "2", f"the test left {SHUFFLE_PARTITIONS} at {left}"


@pytest.fixture
def classes_compiled(spark):
    """A function: how many classes Spark's code generation has compiled in this JVM so far
    (the driver's and the local session's tasks'; Spark's ``CodegenMetrics``)."""
    counter = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    return lambda: int(counter.getCount())


@pytest.fixture
def engine(spark):
    from factflow import Engine

    db = Engine(spark=spark)
    yield db
    db.close()


@pytest.fixture
def people(engine):
    """An engine with a small person schema."""
    engine.create_attribute(":person/name", type="string", semantics="one")
    engine.create_attribute(":person/age", type="long", semantics="one")
    engine.create_attribute(":person/knows", type="ref")
    engine.create_attribute(":person/tag", type="string", semantics="raw")
    return engine
