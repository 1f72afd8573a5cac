"""factflow on a standalone cluster whose two workers stand in for separate hosts.

With state on the S3 server and on a directory every worker shares: the differential
oracle streams pass (every join strategy, recursion, negation, aggregates, queries
installed mid-stream) and a durable engine restarts exactly; each misconfiguration is
refused when the engine starts, naming the executor's host; and a worker killed with
SIGKILL and started again loses nothing (stored batches live in their index files, not
in an executor): the next epochs are exact, at most one failing once with a factflow
error and succeeding when retried.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter

import pytest

from factflow import ConfigurationError, Engine, EngineConfig, FactflowError
from factflow.engine import preflight
from durable import LIGHT, check_queries, define, oracle_after, valid_stream
from oracle import normalized
from standalone import wait_for_executors
from test_differential import CATALOG, GOAL_DIRECTED, JOIN_CATALOG, run_stream

HOSTS = ("127.0.0.2", "127.0.0.3")
#: a stored batch from four rows on: bulk epochs, stored batches kept in index files, probes
CONFIG = EngineConfig(local_limit=3, checkpoint_interval=0)
QUERIES = {
    "binary": [CATALOG[6], CATALOG[28], CATALOG[40]],         # a join, negation, an aggregate
    "delta": [JOIN_CATALOG[0], JOIN_CATALOG[2], CATALOG[-2]],  # constants, a triangle, recursion
    "wco": [JOIN_CATALOG[1], JOIN_CATALOG[7], GOAL_DIRECTED[0]],  # a 4-cycle, an input, goal-directed
}


@pytest.fixture(params=["s3", "shared"])
def state(request, cluster, s3):
    """Engine keywords putting a new state directory on the S3 server or the shared directory."""
    name = f"state-{uuid.uuid4().hex[:8]}"
    if request.param == "s3":
        return {"state_dir": f"s3://{s3.bucket}/{name}"}
    return {"state_dir": str(cluster.shared_dir / name)}


@pytest.mark.parametrize("join", ["binary", "delta", "wco"])
def test_the_oracle_streams_pass_on_the_cluster(cluster_spark, state, join):
    run_stream(cluster_spark, seed=7, epochs=6, queries=QUERIES[join], join=join, max_ops=6,
               config=CONFIG, engine_options=state)


def test_a_durable_engine_restarts_exactly_on_the_cluster(cluster_spark, state):
    stream = valid_stream(seed=11, count=9, max_ops=8)
    with Engine(spark=cluster_spark, config=CONFIG, **state) as db:
        define(db)
        for i, tx in enumerate(stream[:6]):
            db.transact(tx, source="feed", offset=i)
            if i == 3:
                db.checkpoint()
    with Engine(spark=cluster_spark, config=CONFIG, **state) as db:
        assert db.epoch == 6 and db.offsets() == {"feed": 5} and db.recovery.checkpoint == 4
        check_queries(db, oracle_after(stream[:6]), LIGHT)
        for tx in stream[6:]:
            db.transact(tx)
        check_queries(db, oracle_after(stream), LIGHT)


def test_misconfigurations_are_refused_at_start_naming_the_executor(cluster_spark, cluster, tmp_path):
    """Without a state_dir (the driver's temporary directory), or with one under the driver's
    /tmp, executors on other hosts cannot see the files: refused before any work. So is a
    task interpreter without factflow's dependencies."""
    preflight._CHECKED.clear()
    with pytest.raises(ConfigurationError) as refused:
        Engine(spark=cluster_spark)
    message = str(refused.value)
    assert "cannot use the engine's state location" in message and "cannot read" in message
    assert any(f"executor on {host}" in message for host in HOSTS) and "state_dir" in message, message
    with pytest.raises(ConfigurationError, match=r"executor on 127\.0\.0\.[23] cannot use .* state location"):
        Engine(spark=cluster_spark, state_dir=str(tmp_path / "driver-only"))
    bare = cluster.shared_dir / f"bare-{uuid.uuid4().hex[:6]}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    real = cluster_spark.sparkContext.pythonExec
    cluster_spark.sparkContext.pythonExec = str(bare / "bin" / "python")
    try:
        preflight._CHECKED.clear()
        with pytest.raises(ConfigurationError, match=r"bare.*No module named 'factflow' \(on 127\.0\.0\.[23]\)"):
            Engine(spark=cluster_spark, state_dir=str(cluster.shared_dir / "unused"))
    finally:
        cluster_spark.sparkContext.pythonExec = real
        preflight._CHECKED.clear()


def test_a_worker_killed_between_epochs_loses_nothing(cluster_spark, cluster, state):
    """SIGKILL a worker (its executor, its Python workers, its private /tmp go), start it
    again: every later epoch is exact; at most one fails, once, with a factflow error, and
    succeeds when retried."""
    stream = valid_stream(seed=13, count=10, max_ops=8)
    with Engine(spark=cluster_spark, config=CONFIG, **state) as db:
        define(db)
        queries = {text: db.query(text, semantics=semantics) for text, _, semantics in LIGHT}
        for tx in stream[:5]:
            db.transact(tx)
        db.wait_for_maintenance()
        assert any(not b.is_local for a in db._state.arrangements.values() for t in a.traces.values()
                   for b in t.batches)  # stored batches to lose, were they on the executors
        cluster.kill_worker(0)
        failures = 0
        for position, tx in enumerate(stream[5:], start=5):
            if position == 7:
                cluster.start_worker(0)
                cluster.wait_for_workers(2, timeout=60)
                wait_for_executors(cluster_spark, 2)
            try:
                db.transact(tx)
            except FactflowError:
                failures += 1
                db.transact(tx)  # the retry succeeds
            expected = oracle_after(stream[:position + 1])
            for text, q in queries.items():
                semantics = next(s for t, _, s in LIGHT if t == text)
                assert normalized(Counter(q.rows())) == normalized(expected.query(text, (), semantics)), \
                    f"{text} after epoch {db.epoch}"
        assert failures <= 1
        check_queries(db, oracle_after(stream), LIGHT)
