"""Engines sharing a SparkSession: each works until its own close, and only factflow's own session is stopped."""

import os
import subprocess
import sys
import textwrap

import pytest

from factflow.engine.session import DEFAULT_SPARK_CONF

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def restored_conf(spark):
    """Put back the runtime settings ``Engine()`` applies to the test run's session when it joins it."""
    saved = {key: spark.conf.get(key, None) for key in DEFAULT_SPARK_CONF}
    yield
    for key, value in saved.items():
        if spark.conf.get(key, None) != value:
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def use(db, name):
    db.create_attribute(name, type="long")
    q = db.query(f"[:find ?v :where [1 {name} ?v]]")
    db.transact([[":db/add", 1, name, 7]])
    return q.results()


def test_engines_joining_a_session_factflow_did_not_start_never_stop_it(spark, restored_conf):
    from factflow import Engine

    first, second = Engine(), Engine()  # both join the test run's session (getOrCreate)
    assert first.spark is spark and second.spark is spark
    first.close()
    assert use(second, ":s/x") == {(7,): 1}
    second.close()
    assert spark.range(3).count() == 3  # still running


def test_the_last_engine_stops_the_session_factflow_started():
    """In a fresh interpreter (this one already runs the test session), two ``Engine()``s
    share the session factflow starts; it stops with the second close, not the first."""
    script = textwrap.dedent("""
        from pyspark import SparkContext
        from factflow import Engine, create_session

        first, second = Engine(master="local[1]"), Engine(master="local[1]")
        assert first.spark is second.spark
        first.close()
        second.create_attribute(":s/x", type="long")
        q = second.query("[:find ?v :where [1 :s/x ?v]]")
        second.transact([[":db/add", 1, ":s/x", 7]])
        assert q.results() == {(7,): 1}, q.results()
        second.close()
        assert SparkContext._active_spark_context is None, "the last engine left the session running"

        given = create_session("local[1]")
        Engine(spark=given).close()
        joined = Engine()
        joined.close()
        assert given.range(3).count() == 3, "an engine stopped a session it did not start"
        given.stop()
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_small_statements_keep_the_sessions_excluded_optimizer_rules(spark):
    """The engine's settings for small statements add to the rules a session excludes, and
    every setting is put back afterwards."""
    from factflow.engine.apply import small_statements
    from factflow.engine.config import EngineConfig

    key = "spark.sql.optimizer.excludedRules"
    mine = "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation"
    before = spark.conf.get(key, None)
    spark.conf.set(key, mine)
    try:
        with small_statements(spark, EngineConfig().small_conf):
            inside = spark.conf.get(key).split(",")
            assert spark.conf.get("spark.sql.shuffle.partitions") == "1"
        assert inside[0] == mine and len(inside) == 3 and len(set(inside)) == 3
        assert spark.conf.get(key) == mine
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def test_python_workers_are_started_once_per_session(spark, monkeypatch):
    """An engine starts Spark's Python workers in the background, once per application: a
    job of its own group that succeeds; later engines do not start it again."""
    from factflow.engine import warmup

    monkeypatch.setattr(warmup, "_WARMED", set())  # as if no engine had run on this session yet
    thread = warmup.warm_up(spark)
    assert thread is not None
    thread.join(120)
    assert not thread.is_alive()
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup("factflow-warmup")]
    assert jobs and all(j.status == "SUCCEEDED" for j in jobs)
    assert warmup.warm_up(spark) is None
