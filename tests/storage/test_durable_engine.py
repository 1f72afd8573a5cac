"""Durable engines: what a reopened state directory holds, offsets, damage, the lock, versions.

Each test streams random valid transactions (retractions, cardinality-one overwrites,
raw multiplicities) into an ``Engine(state_dir=...)``, closes it (or leaves the files as a
crash would), damages files where the test says so, reopens the directory and compares
the results of queries (joins, recursion, negation, aggregates) with the oracle over the
transactions that must have survived.
"""

from __future__ import annotations

import datetime
import glob
import os
import zlib
from collections import Counter

import pandas as pd
import pytest

from factflow import (
    CorruptStateError, Engine, EngineConfig, QueryError, StateLockedError, StateVersionError, StorageError, TransactionError,
)
from factflow.cli import main as cli
from factflow.storage import wal as wal_module
from factflow.storage.store import StateStore
from factflow.storage.files import open_sealed_json, sealed_json, write_atomic
from oracle import normalized
from durable import LIGHT, check_queries, define, oracle_after, valid_stream

QUICK = EngineConfig(checkpoint_interval=0)  # checkpoints only when a test asks


def open_engine(spark, directory, config=QUICK) -> Engine:
    db = Engine(spark=spark, state_dir=str(directory), config=config)
    define(db)
    return db


def test_a_reopened_directory_holds_the_catalog_facts_epoch_and_offsets(spark, tmp_path):
    stream = valid_stream(seed=1, count=14)
    db = open_engine(spark, tmp_path)
    db.create_attribute(":x/when", type="instant", semantics="one")
    for i, tx in enumerate(stream[:9]):
        assert db.transact(tx, source="feed", offset=i) == i + 1
        if i == 4:
            assert db.checkpoint() == 5
    db.close()

    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
    try:
        assert db.epoch == 9 and db.offsets() == {"feed": 8}
        assert (db.recovery.checkpoint, db.recovery.log_epochs) == (5, 4)
        assert [(str(a.name), a.value_type, a.semantics) for a in db.schema][-1] == (":x/when", "instant", "one")
        assert db.rules.names() and "reach" in db.rules
        check_queries(db, oracle_after(stream[:9]))
        define(db)  # the same definitions again: nothing new is logged
        for i, tx in enumerate(stream[9:], start=9):
            assert db.transact(tx, source="feed", offset=i) == i + 1
    finally:
        db.close()
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
    try:
        assert db.epoch == 14 and db.recovery.log_records == 9  # 4 + 5 epochs, no catalog records
        check_queries(db, oracle_after(stream), LIGHT)
    finally:
        db.close()


def test_background_checkpoints_truncate_the_log_behind_the_previous_one(spark, tmp_path):
    stream = valid_stream(seed=2, count=12)
    db = open_engine(spark, tmp_path, EngineConfig(checkpoint_interval=3))
    try:
        for tx in stream:
            db.transact(tx)
        db._durability.wait()
        report = db.storage_report()
        assert report["checkpointed_epoch"] == 12 and report["last_checkpoint"].facts > 0
    finally:
        db.close()
    checkpoints = sorted(os.listdir(tmp_path / "checkpoints"))
    assert checkpoints == ["000000000009", "000000000012"]
    segments = sorted(os.listdir(tmp_path / "wal"))
    first_kept = open_sealed_json(str(tmp_path / "checkpoints" / "000000000009" / "manifest.json"))["log_segment"]
    assert int(segments[0].split(".")[0]) == first_kept
    db = Engine(spark=spark, state_dir=str(tmp_path))
    try:
        assert db.epoch == 12 and db.recovery.checkpoint == 12 and db.recovery.log_records == 0
        check_queries(db, oracle_after(stream), LIGHT)
    finally:
        db.close()


def test_bulk_epochs_and_stored_batches_survive(spark, tmp_path):
    """With a local limit of 3 rows, frames of 10 rows are bulk epochs: their changes are
    logged as Parquet files written by Spark, checkpoints write stored batches with Spark,
    and recovery loads attributes through Spark."""
    config = EngineConfig(local_limit=3, checkpoint_interval=0)
    stream = valid_stream(seed=3, count=6, max_ops=12)
    db = open_engine(spark, tmp_path, config)
    try:
        for i, tx in enumerate(stream):
            db.transact(pd.DataFrame({"e": [op[1] for op in tx], "a": [op[2] for op in tx],
                                      "v": pd.Series([op[3] for op in tx], dtype=object),
                                      "added": [op[0] == ":db/add" for op in tx]}) if i % 2 else tx)
            if i == 3:
                db.checkpoint()
        assert glob.glob(str(tmp_path / "wal" / "bulk-*" / "a*-part-*.parquet"))
    finally:
        db.close()
    db = Engine(spark=spark, state_dir=str(tmp_path), config=config)
    try:
        assert db.epoch == 6
        check_queries(db, oracle_after(stream), LIGHT)
        db.checkpoint()
    finally:
        db.close()
    db = Engine(spark=spark, state_dir=str(tmp_path), config=config)
    try:
        assert db.recovery.checkpoint == 6
        check_queries(db, oracle_after(stream), LIGHT)
    finally:
        db.close()


def test_instants_survive_the_log_checkpoints_and_recovery(spark, tmp_path):
    """Instants (UTC timestamps) through small and bulk log records, a Spark-written
    checkpoint and both recovery paths."""
    config = EngineConfig(local_limit=3, checkpoint_interval=0)
    query = "[:find ?e ?t :where [?e :x/when ?t]]"
    db = Engine(spark=spark, state_dir=str(tmp_path), config=config)
    try:
        db.create_attribute(":x/when", type="instant", semantics="one")
        db.transact([[":db/add", 1, ":x/when", datetime.datetime(2020, 1, 1, 12, 30, 0, 250)]])
        db.transact(pd.DataFrame({"e": range(2, 9), "a": ":x/when",
                                  "v": [datetime.datetime(2021, 1, d, 8) for d in range(1, 8)]}))
        expected = db.query(query).results()
        assert len(expected) == 8
    finally:
        db.close()
    db = Engine(spark=spark, state_dir=str(tmp_path), config=config)
    try:
        assert db.query(query).results() == expected
        db.checkpoint()
        db.transact([[":db/add", 2, ":x/when", datetime.datetime(1999, 12, 31, 23, 59)]])
        expected = db.query(query).results()
    finally:
        db.close()
    db = Engine(spark=spark, state_dir=str(tmp_path), config=config)
    try:
        assert db.recovery.checkpoint == 2 and db.query(query).results() == expected
    finally:
        db.close()


def test_offsets_make_replays_exactly_once(spark, tmp_path):
    add = lambda e, v: [[":db/add", e, ":d/age", v]]  # noqa: E731
    db = open_engine(spark, tmp_path)
    try:
        assert db.transact(add(1, 1), source="a", offset=10) == 1
        assert db.transact(add(2, 2), source="b", offset=0) == 2
        assert db.transact(add(3, 3), source="a", offset=12) == 3
        assert db.transact(add(9, 9), source="a", offset=12) == 3   # a replay: skipped
        assert db.transact(add(9, 9), source="a", offset=11) == 3   # skipped over by 12
        assert db.transact(add(9, 9), source="a", offset=5) == 1
        assert db.epoch == 3
        outcomes = db.transact_many([add(4, 4), add(5, 5), add(9, 9), add(6, 6), add(7, 7)],
                                    offsets=[("a", 13), ("b", 1), ("a", 13), None, ("a", 12)])
        assert outcomes == [4, 4, 4, 4, 3]
        assert db.offsets() == {"a": 13, "b": 1}
        with pytest.raises(TransactionError, match="offset"):
            db.transact(add(1, 1), source="a")
    finally:
        db.close()
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
    try:
        assert db.offsets() == {"a": 13, "b": 1}
        assert db.transact(add(9, 9), source="b", offset=1) == 4
        q = db.query("[:find ?e :where [?e :d/age _]]")
        assert set(q.results()) == {(1,), (2,), (3,), (4,), (5,), (6,)}
    finally:
        db.close()


def test_offsets_without_a_state_dir(engine):
    engine.create_attribute(":x/n", type="long")
    assert engine.transact([[":db/add", 1, ":x/n", 1]], source="s", offset=1) == 1
    assert engine.transact([[":db/add", 1, ":x/n", 2]], source="s", offset=1) == 1
    assert engine.offsets() == {"s": 1}
    with pytest.raises(StorageError, match="no state_dir"):
        engine.checkpoint()


def test_what_a_crash_during_a_checkpoint_or_its_cleanup_leaves_is_recovered(spark, tmp_path, monkeypatch):
    """A crash before the obsolete checkpoints and segments are removed leaves them all; one
    while a checkpoint is written leaves files without a manifest and temporary files."""
    stream = valid_stream(seed=8, count=8)
    db = open_engine(spark, tmp_path)
    try:
        for i, tx in enumerate(stream[:6]):
            db.transact(tx)
            if i in (1, 3):
                db.checkpoint()
        with monkeypatch.context() as patch:  # "killed" before removing anything
            patch.setattr(StateStore, "_remove_obsolete", lambda self: None)
            db.checkpoint()
        db.transact(stream[6])
    finally:
        db.close()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["000000000002", "000000000004", "000000000006"]
    unfinished = tmp_path / "checkpoints" / "000000000007"
    unfinished.mkdir()
    (unfinished / "a0-part-00000.parquet").write_bytes(b"half a file")
    (tmp_path / "checkpoints" / "000000000006" / "manifest.json.tmp").write_bytes(b"{")
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
    try:
        assert db.epoch == 7 and db.recovery.checkpoint == 6 and db.recovery.log_epochs == 1
        assert not unfinished.exists()
        assert not (tmp_path / "checkpoints" / "000000000006" / "manifest.json.tmp").exists()
        check_queries(db, oracle_after(stream[:7]), LIGHT)
        db.transact(stream[7])
        db.checkpoint()
    finally:
        db.close()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["000000000006", "000000000008"]
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
    try:
        assert db.epoch == 8 and db.recovery.checkpoint == 8
    finally:
        db.close()


def test_a_torn_log_tail_is_cut_to_the_last_whole_record(spark, tmp_path):
    stream = valid_stream(seed=4, count=6)
    db = open_engine(spark, tmp_path)
    for tx in stream:
        db.transact(tx)
    db.close()
    os.remove(tmp_path / "wal" / "closed.json")  # as a crash leaves it: no clean close
    segment = sorted(glob.glob(str(tmp_path / "wal" / "*.log")))[-1]
    size = os.path.getsize(segment)
    with open(segment, "r+b") as handle:  # cut the last record in the middle, as a crash mid-write would
        handle.truncate(size - 7)
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
    try:
        assert db.epoch == 5 and "torn tail" in db.recovery.torn[0]
        check_queries(db, oracle_after(stream[:5]), LIGHT)
        assert db.transact(stream[5]) == 6
    finally:
        db.close()
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
    try:
        assert db.epoch == 6 and db.recovery.torn == []
        check_queries(db, oracle_after(stream), LIGHT)
    finally:
        db.close()


def test_a_corrupt_checkpoint_is_refused_and_recovery_falls_back(spark, tmp_path):
    stream = valid_stream(seed=5, count=9)
    db = open_engine(spark, tmp_path)
    for i, tx in enumerate(stream):
        db.transact(tx)
        if i in (2, 5):
            db.checkpoint()
    db.close()
    newest = sorted(glob.glob(str(tmp_path / "checkpoints" / "000000000006" / "a*.parquet")))[0]
    with open(newest, "r+b") as handle:  # flip one byte in the middle of a checkpoint file
        handle.seek(os.path.getsize(newest) // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x01]))
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
    try:
        assert db.recovery.checkpoint == 3 and db.epoch == 9
        assert len(db.recovery.refused) == 1 and newest in db.recovery.refused[0]
        assert "checksum" in db.recovery.refused[0]
        check_queries(db, oracle_after(stream), LIGHT)
        db.checkpoint()  # a good checkpoint again: the refused one is removed
    finally:
        db.close()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["000000000003", "000000000009"]


def test_damage_with_nothing_to_fall_back_to_is_an_error_naming_the_file(spark, tmp_path):
    stream = valid_stream(seed=6, count=4)
    db = open_engine(spark, tmp_path)
    for i, tx in enumerate(stream):
        db.transact(tx)
        if i == 1:
            db.checkpoint()
            db.transact([])
            db.checkpoint()  # two checkpoints: the log before the first is gone
    db.close()
    manifests = sorted(glob.glob(str(tmp_path / "checkpoints" / "*" / "manifest.json")))
    for manifest in manifests:
        with open(manifest, "r+b") as handle:
            handle.seek(20)
            handle.write(b"#")
    with pytest.raises(CorruptStateError, match="manifest.json"):
        Engine(spark=spark, state_dir=str(tmp_path))


def test_a_second_engine_on_one_directory_is_refused(spark, tmp_path):
    db = open_engine(spark, tmp_path)
    try:
        with pytest.raises(StateLockedError, match="in use by another engine"):
            Engine(spark=spark, state_dir=str(tmp_path))
        assert db.transact([[":db/add", 1, ":d/age", 1]]) == 1  # the first one is unharmed
    finally:
        db.close()
    Engine(spark=spark, state_dir=str(tmp_path)).close()  # closing gives the directory up


def test_a_newer_format_version_is_refused_by_name(spark, tmp_path):
    open_engine(spark, tmp_path).close()
    path = str(tmp_path / "FORMAT")
    body = open_sealed_json(path)
    write_atomic(path, sealed_json(dict(body, version=body["version"] + 1)))
    with pytest.raises(StateVersionError, match=f"FORMAT was written in storage format version {body['version'] + 1}"):
        Engine(spark=spark, state_dir=str(tmp_path))


def test_an_epoch_that_cannot_be_logged_is_rolled_back(spark, tmp_path, monkeypatch):
    stream = valid_stream(seed=7, count=4)
    db = open_engine(spark, tmp_path)
    try:
        db.transact(stream[0])

        def failing(fd):
            raise OSError(5, "Input/output error")

        with monkeypatch.context() as patch:  # the record's fdatasync fails; cutting it off works
            patch.setattr(wal_module, "_datasync", failing)
            with pytest.raises(StorageError, match="Input/output error"):
                db.transact(stream[1])
        assert db.epoch == 1
        check_queries(db, oracle_after(stream[:1]), LIGHT)
        assert db.transact(stream[1]) == 2
        with monkeypatch.context() as patch:  # cutting the record off fails too: the log refuses
            patch.setattr(wal_module, "_datasync", failing)
            patch.setattr(wal_module.os, "fsync", failing)
            with pytest.raises(StorageError, match="Input/output error"):
                db.transact(stream[2])
        with pytest.raises(StorageError, match="failed earlier"):
            db.transact(stream[3])
        assert db.epoch == 2
    finally:
        db.close()
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
    try:  # the record that was written but not made durable may or may not be there, whole
        assert db.epoch in (2, 3)
        check_queries(db, oracle_after(stream[:db.epoch]), LIGHT)
    finally:
        db.close()


def test_checksums_cover_the_log_records(tmp_path):
    """Every record carries a CRC32 of its payload, and one of its length and that checksum
    (a unit check of the framing the engine writes)."""
    record = wal_module.LogRecord({"type": "rules", "text": "[]"})
    data = record.encode()
    length, crc, frame_crc = wal_module._FRAME[2].unpack_from(data)
    assert length == len(data) - 12 and crc == zlib.crc32(data[12:]) and frame_crc == zlib.crc32(data[:8])


def test_durable_queries_are_installed_again_and_continue(spark, tmp_path):
    """A durable query comes back under its name after a restart (from the log and from a
    checkpoint), continues with the epochs after it, and is gone once its user closes it."""
    stream = valid_stream(seed=7, count=12)
    kept = [("[:find ?e ?n :in $ [?n ...] :where [?e :d/name ?n]]", (["a", "ab", "b"],), "set", "named"),
            ("[:find ?a ?b :where (reach ?a ?b)]", (), "set", "reach")]
    db = open_engine(spark, tmp_path)
    for text, inputs, semantics, name in kept:
        db.query(text, name=name, inputs=inputs, semantics=semantics, durable=True)
    db.query(kept[0][0], name="passing", inputs=kept[0][1])  # not durable: gone after the restart
    for tx in stream[:4]:
        db.transact(tx)
    db.checkpoint()
    db.transact(stream[4])
    db.close()

    def check(db, upto: int, names: list[str]) -> None:
        assert sorted(db.queries) == sorted(names)
        oracle = oracle_after(stream[:upto])
        for text, inputs, semantics, name in kept:
            if name in names:
                assert normalized(Counter(db.queries[name].rows())) == \
                    normalized(oracle.query(text, inputs, semantics)), name

    db = open_engine(spark, tmp_path)
    try:
        assert db.recovery.queries == ["named", "reach"] and db.queries["reach"].durable
        check(db, 5, ["named", "reach"])
        again = db.query(kept[1][0], name="reach", durable=True)  # the same definition: the installed query
        assert again is db.queries["reach"]
        with pytest.raises(QueryError, match="already installed"):
            db.query("[:find ?a :where [?a :d/friend _]]", name="reach", durable=True)
        passing = db.query(kept[0][0], name="passing", inputs=kept[0][1])
        assert not passing.durable
        assert db.query(kept[0][0], name="passing", inputs=(("a", "ab", "b"),), durable=True) is passing
        assert passing.durable  # the same query asked durable: it is kept from now on
        for tx in stream[5:9]:
            db.transact(tx)
        check(db, 9, ["named", "reach", "passing"])
        db.queries["named"].close()  # dropped for good
    finally:
        db.close()

    db = open_engine(spark, tmp_path)
    try:
        check(db, 9, ["reach", "passing"])
        for tx in stream[9:]:
            db.transact(tx)
        db.checkpoint()  # the manifest, not the log, now holds the definitions
    finally:
        db.close()
    db = open_engine(spark, tmp_path)
    try:
        assert db.recovery.checkpoint == 12
        check(db, 12, ["reach", "passing"])
    finally:
        db.close()


def test_durable_queries_need_a_state_dir(engine):
    with pytest.raises(StorageError, match="state_dir"):
        engine.query("[:find ?a :where [?a :x/y _]]", durable=True)


class _Died(BaseException):
    """The process ending where a test says (nothing after it runs)."""


def _dying_after_the_record(patch, durability, error: BaseException) -> None:
    """Make the next epoch's queries raise ``error`` once its log record is written."""
    from factflow.engine.state import EngineState

    def evaluating(self, *args, **kwargs):
        durability._log_thread.submit(lambda: None).result()  # the record before it is written
        raise error

    patch.setattr(EngineState, "evaluate", evaluating)


AGES = ("[:find ?e ?a :where [?e :d/age ?a]]", (), "multiset")


def test_a_guessed_epoch_the_log_ends_with_is_applied_again_not_replayed(spark, tmp_path, monkeypatch, capsys):
    # A small epoch's record is written while its queries run, and a guessed epoch's holds
    # the guess. Here the guess is wrong (entity 1's one name replaced, age 5 asserted
    # again) and the process dies before the check: replayed as written, entity 1 would have
    # two names and age 5 a multiplicity of 2.
    first = [[":db/add", 1, ":d/name", "a"], [":db/add", 1, ":d/age", 5]]
    wrong = [[":db/add", 1, ":d/name", "b"], [":db/add", 1, ":d/age", 5], [":db/add", 2, ":d/age", 7]]
    db = open_engine(spark, tmp_path)
    try:
        db.transact(first)
        q = db.query("[:find ?n (count ?e) :where [?e :d/name ?n]]")  # epochs on :d/name are guessed
        with monkeypatch.context() as patch:
            _dying_after_the_record(patch, db._durability, _Died())
            patch.setattr("factflow.engine.epoch._void", lambda writes: None)  # nothing after the death
            with pytest.raises(_Died):
                db.transact(wrong)
        q.close()
    finally:
        db.close()
    assert cli(["repair", str(tmp_path)]) == 0
    assert "ends with guessed epoch 2, not yet checked" in capsys.readouterr().out
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
    try:
        assert "guessed epoch 2" in db.recovery.unconfirmed and "applied again as epoch 2" in db.recovery.unconfirmed
        assert db.epoch == 2
        check_queries(db, oracle_after([first, wrong]), LIGHT + [AGES])
    finally:
        db.close()
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)  # now its exact record replaces the guess
    try:
        assert db.epoch == 2 and db.recovery.unconfirmed is None
        check_queries(db, oracle_after([first, wrong]), LIGHT + [AGES])
    finally:
        db.close()


def test_in_event_time_a_guessed_epoch_the_log_ends_with_is_applied_again_at_its_time(spark, tmp_path, monkeypatch):
    first = [[":db/add", 1, ":d/name", "a"]]
    wrong = [[":db/add", 1, ":d/name", "b"], [":db/add", 2, ":d/name", "c"]]  # a cardinality-one replacement
    db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK, time="event")
    try:
        define(db)
        db.transact(first, time=10)
        assert db.advance_to(11) == [10]
        q = db.query("[:find ?n (count ?e) :where [?e :d/name ?n]]")
        db.transact(wrong, time=20)
        with monkeypatch.context() as patch:
            _dying_after_the_record(patch, db._durability, _Died())
            patch.setattr("factflow.engine.epoch._void", lambda writes: None)
            with pytest.raises(_Died):
                db.advance_to(21)
        q.close()
    finally:
        db.close()
    with Engine(spark=spark, state_dir=str(tmp_path), config=QUICK, time="event") as db:
        assert "guessed epoch 20" in db.recovery.unconfirmed and db.epoch == 20
        check_queries(db, oracle_after([first, wrong]), LIGHT)
    with Engine(spark=spark, state_dir=str(tmp_path), config=QUICK, time="event") as db:
        assert db.epoch == 20 and db.recovery.unconfirmed is None
        check_queries(db, oracle_after([first, wrong]), LIGHT)


def test_an_epoch_that_fails_after_its_record_is_written_is_void(spark, tmp_path, monkeypatch):
    stream = valid_stream(seed=9, count=3)
    db = open_engine(spark, tmp_path)
    try:
        db.transact(stream[0])
        q = db.query("[:find ?e ?a :where [?e :d/age ?a]]")
        with monkeypatch.context() as patch:
            _dying_after_the_record(patch, db._durability, RuntimeError("lost an executor"))
            with pytest.raises(Exception, match="lost an executor"):
                db.transact(stream[1])
        assert db.epoch == 1
        q.close()
    finally:
        db.close()
    for expected, applied in ((1, [stream[0]]), (2, [stream[0], stream[2]])):
        db = Engine(spark=spark, state_dir=str(tmp_path), config=QUICK)
        try:  # the failed epoch's record is in the log, then its void
            assert db.epoch == expected and db.recovery.unconfirmed is None
            check_queries(db, oracle_after(applied), LIGHT + [AGES])
            if expected == 1:
                assert db.transact(stream[2]) == 2
        finally:
            db.close()
