"""Durable state in an object store (moto's S3 server on 127.0.0.1), in local mode.

The same engine as on a local path: what it logs, checkpoints and indexes goes to
``s3://factflow/...`` through :class:`factflow.storage.location.Location` (no directory named
``s3:`` appears anywhere), reopening recovers it exactly, the log is one create-only object
per record so a second writer fails instead of overwriting, a second engine is refused while
the first holds the lease and takes over once it lapses, and small epochs probe index files
copied to the executor's cache. The cluster tests repeat this with executors on other hosts.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pandas as pd
import pytest

from factflow import Engine, EngineConfig, StateLockedError, StorageError
from factflow.storage.location import Location, ObjectLock
from factflow.storage.wal import LogRecord, WriteAheadLog
from durable import LIGHT, check_queries, define, oracle_after, valid_stream

CONFIG = EngineConfig(local_limit=3, checkpoint_interval=0)  # bulk epochs, stored batches with index files


@pytest.fixture
def where(s3) -> tuple[str, dict]:
    """A fresh prefix of the bucket, and the storage options reaching the server."""
    return f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}", s3.storage_options()


def frame(tx: list) -> pd.DataFrame:
    return pd.DataFrame({"e": [op[1] for op in tx], "a": [op[2] for op in tx],
                         "v": pd.Series([op[3] for op in tx], dtype=object),
                         "added": [op[0] == ":db/add" for op in tx]})


def test_a_durable_engine_on_s3_recovers_exactly(spark, where, tmp_path, monkeypatch):
    uri, options = where
    monkeypatch.chdir(tmp_path)  # a URI taken for a relative path would show up here
    stream = valid_stream(seed=41, count=10, max_ops=8)
    with Engine(spark=spark, state_dir=uri, storage_options=options, config=CONFIG) as db:
        define(db)
        for i, tx in enumerate(stream[:7]):
            db.transact(frame(tx) if i % 2 else tx, source="feed", offset=i)
            if i == 3:
                db.checkpoint()
        db.create_attribute(":x/bulk", type="long")
        db.transact(frame([[":db/add", 100 + k, ":x/bulk", k] for k in range(6)]))  # a bulk epoch: Parquet files
        check_queries(db, oracle_after(stream[:7]), LIGHT)  # small epochs probe index files in the store
        assert not os.listdir(tmp_path)
    location = Location(uri, options)
    assert {"FORMAT", "wal", "checkpoints"} <= set(location.list())
    assert location.list("wal")[0] == "000000000001.log" and "closed.json" in location.list("wal")
    assert any(name.startswith("bulk-") for name in location.list("wal"))
    with Engine(spark=spark, state_dir=uri, storage_options=options, config=CONFIG) as db:
        assert db.epoch == 8 and db.offsets() == {"feed": 6} and db.recovery.checkpoint == 4
        check_queries(db, oracle_after(stream[:7]), LIGHT)
        assert db.query("[:find ?e ?v :where [?e :x/bulk ?v]]").results() == {(100 + k, k): 1 for k in range(6)}
        for tx in stream[7:]:
            db.transact(tx)
    with Engine(spark=spark, state_dir=uri, storage_options=options, config=CONFIG) as db:
        assert db.epoch == 11
        check_queries(db, oracle_after(stream), LIGHT)


def test_small_epochs_probe_copies_of_the_index_files(spark, where):
    """A stored batch's index files are written to the store, and the probes of small
    epochs read copies of them in the executor's file cache (Spark's work directory)."""
    from pyspark import SparkFiles

    uri, options = where
    cache = os.path.join(SparkFiles.getRootDirectory(), "factflow-file-cache")
    before = set(os.listdir(cache)) if os.path.isdir(cache) else set()
    with Engine(spark=spark, state_dir=uri, storage_options=options, config=CONFIG) as db:
        db.create_attribute(":g/edge", type="ref")
        db.transact(pd.DataFrame({"e": range(40), "a": ":g/edge", "v": [(i * 7) % 40 for i in range(40)]}))
        db.wait_for_maintenance()
        q = db.query("[:find ?a ?c :where [?a :g/edge ?b] [?b :g/edge ?c]]", join="delta")
        for i in range(3):
            db.transact([[":db/add", 100 + i, ":g/edge", i]])
        expected = {(100 + i, (i * 7) % 40): 1 for i in range(3)}
        assert {row: n for row, n in q.results().items() if row[0] >= 100} == expected
        assert set(os.listdir(cache)) - before  # copies fetched from the store
        runs = Location(uri, options).list("indexes")
        assert len(runs) == 1 and Location(uri, options).list(f"indexes/{runs[0]}")
    assert not Location(uri, options).list(f"indexes/{runs[0]}")  # released with the engine


def test_a_second_engine_is_refused_and_a_lapsed_lease_taken_over(spark, where, monkeypatch):
    uri, options = where
    monkeypatch.setenv("FACTFLOW_LOCK_LEASE", "2")
    first = Engine(spark=spark, state_dir=uri, storage_options=options)
    try:
        with pytest.raises(StateLockedError, match=r"in use by another engine \(process \d+ on .*renewed"):
            Engine(spark=spark, state_dir=uri, storage_options=options)
        time.sleep(2.5)  # the holder renews its lease meanwhile
        with pytest.raises(StateLockedError):
            Engine(spark=spark, state_dir=uri, storage_options=options)
    finally:
        first.close()
    location = Location(uri, options)
    assert not location.exists("LOCK")
    dead = ObjectLock(location)  # an engine that died: its lease is never renewed again
    dead._stop.set()
    time.sleep(2.5)
    with Engine(spark=spark, state_dir=uri, storage_options=options) as taken:
        assert json.loads(location.read("LOCK"))["owner"] != dead.owner["owner"]
        assert taken.epoch == 0


def test_log_objects_are_created_only_once(where):
    """Two writers of one log: the second append to a number the first wrote fails, and that
    log refuses every later append; the first record stays."""
    uri, options = where
    location = Location(f"{uri}/wal", options)
    first, second = WriteAheadLog(location), WriteAheadLog(location)
    for log in (first, second):
        list(log.scan(1))
        log.open_for_append(1)
    first.append(LogRecord({"type": "epoch", "epoch": 1}))
    with pytest.raises(StorageError, match="another engine writes the log"):
        second.append(LogRecord({"type": "epoch", "epoch": 1, "other": True}))
    with pytest.raises(StorageError, match="failed earlier"):
        second.append(LogRecord({"type": "epoch", "epoch": 2}))
    first.close()
    found = [r.meta for _, _, r in WriteAheadLog(location).scan(1)]
    assert found == [{"type": "epoch", "epoch": 1}]


def test_a_uri_of_an_unknown_scheme_is_refused():
    with pytest.raises(StorageError, match="unknown storage scheme 'ftp'"):
        Location("ftp://host/path")
    with pytest.raises(StorageError, match="needs a bucket"):
        Location("s3:///path")
