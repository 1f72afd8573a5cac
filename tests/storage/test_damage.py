"""Fault injection over whole state directories: one flipped byte or one cut, anywhere.

A durable engine writes a state directory with every kind of file (log segments with
attribute, rules, query and epoch records, a bulk epoch's Parquet files, two checkpoints
with their manifests, ``FORMAT``, the clean close marker), once in transaction time and
once in event time (pending and frontier records). Then, on a copy each time, one byte
is flipped at many offsets of every file (segment and record headers, length and
checksum fields, payloads, first and last records, checkpoint and bulk files, manifests)
or the file is cut at many lengths, and the directory is read back
(:meth:`StateStore.recover`, no Spark). Each reading must either recover the
acknowledged state exactly (catalog, facts, epoch, offsets, buffered transactions) or
refuse with a :class:`CorruptStateError` naming the damaged file. After a crash (no clean
close marker, half a record at the end), the same holds with one more outcome allowed:
the unacknowledged half record is dropped. Never anything else.

Engine-level tests check the case found by fault injection (a flip in the middle of the
newest segment after 17 acknowledged epochs), ``accept_data_loss`` and ``factflow repair``.
"""

from __future__ import annotations

import glob
import os
import shutil
import struct
from collections import Counter

import pandas as pd
import pytest

from factflow import CorruptStateError, Engine, EngineConfig, StateVersionError
from factflow.cli import main as cli
from factflow.storage.facts import read_tables
from factflow.storage.store import StateStore
from factflow.storage.wal import _FRAME, _HEADER_SIZE, LogRecord
from factflow.model.types import kind_of_type
from durable import LIGHT, check_queries, define, oracle_after, valid_stream

CONFIG = EngineConfig(local_limit=3, checkpoint_interval=0)  # frames of more than 3 rows are bulk epochs


def frame(tx: list) -> pd.DataFrame:
    return pd.DataFrame({"e": [op[1] for op in tx], "a": [op[2] for op in tx],
                         "v": pd.Series([op[3] for op in tx], dtype=object),
                         "added": [op[0] == ":db/add" for op in tx]})


@pytest.fixture(scope="module")
def directories(spark, tmp_path_factory) -> dict[str, str]:
    """Two cleanly closed state directories holding every kind of file and record."""
    base = tmp_path_factory.mktemp("damage")
    transaction = str(base / "transaction")
    stream = valid_stream(seed=31, count=12, max_ops=6)
    with Engine(spark=spark, state_dir=transaction, config=CONFIG) as db:
        define(db)
        for i, tx in enumerate(stream):
            db.transact(tx, source="feed", offset=i)
            if i == 5:  # a bulk epoch: its changes are Parquet files under wal/bulk-<epoch>
                db.transact(frame([[":db/add", 100 + k, ":d/age", k] for k in range(6)]))
            if i == 2:
                db.query("[:find ?e :where [?e :d/name _]]", name="named", durable=True)
            if i in (3, 7):
                db.checkpoint()
    assert glob.glob(f"{transaction}/wal/bulk-*/*.parquet") and len(os.listdir(f"{transaction}/checkpoints")) == 2
    event = str(base / "event")
    with Engine(spark=spark, state_dir=event, config=CONFIG, time="event") as db:
        define(db)
        for i, tx in enumerate(valid_stream(seed=32, count=8, max_ops=5)):
            db.transact(tx, time=10 * (i + 1), source="feed", offset=i)
            if i in (2, 5):
                db.advance_to(10 * i + 5)
            if i == 3:
                db.checkpoint()
    return {"transaction": transaction, "event": event}


def summary(recovered) -> dict:
    """What a reading recovered, in comparable form."""
    facts = {}
    for aid, sources in recovered.facts.items():
        kind = kind_of_type(recovered.attributes[aid][1])
        counts: Counter = Counter()
        for source in sources:
            table = source.table if source.table is not None else read_tables(source.location, source.files, kind)
            for e, v, d in zip(*(table.column(c).to_pylist() for c in ("e", "v", "_diff"))):
                counts[(e, v)] += d
        if +counts:
            facts[aid] = +counts
    pending = [(t, o, table.num_rows) for t, o, table in recovered.pending]
    return {"epoch": recovered.epoch, "attributes": recovered.attributes, "rules": recovered.rules,
            "queries": recovered.queries, "offsets": recovered.offsets, "facts": facts,
            "frontier": recovered.frontier, "pending": pending}


def read_back(directory: str):
    store = StateStore(directory)
    try:
        return store.recover()
    finally:
        store.close()


def record_starts(path: str) -> list[int]:
    """The byte offsets at which the records of a log segment begin."""
    data = open(path, "rb").read()
    starts, position = [], _HEADER_SIZE
    frame_size = _FRAME[2].size
    while position + frame_size <= len(data):
        starts.append(position)
        position += frame_size + struct.unpack_from("<I", data, position)[0]
    return starts


def offsets_to_damage(path: str) -> tuple[list[int], list[int]]:
    """Where to flip a byte of ``path`` and where to cut it."""
    size = os.path.getsize(path)
    spread = {0, 1, size // 3, size // 2, 2 * size // 3, size - 2, size - 1}
    flips, cuts = set(spread), {0, size // 2, size - 1}
    if path.endswith(".log"):
        flips |= {6, 8, 16, 19}  # version, segment number, header checksum
        for start in record_starts(path):
            end = start + _FRAME[2].size + struct.unpack_from("<I", open(path, "rb").read(), start)[0]
            flips |= set(range(start, start + 13)) | {(start + end) // 2, end - 1}
            cuts |= {start, start + 1, start + 6, start + 12, (start + end) // 2, end - 1}
    return sorted(f for f in flips if 0 <= f < size), sorted(c for c in cuts if 0 <= c < size)


def damaged_files(directory: str) -> list[str]:
    return sorted(p for p in glob.glob(f"{directory}/**/*", recursive=True)
                  if os.path.isfile(p) and os.path.basename(p) != "LOCK" and "/indexes/" not in p)


def check_outcome(copy: str, relative: str, expected: dict, what: str) -> str:
    """Read ``copy`` back: the expected state exactly, or a refusal naming ``relative``."""
    try:
        found = summary(read_back(copy))
    except (CorruptStateError, StateVersionError) as exc:
        assert relative in str(exc), f"{what}: the refusal does not name {relative}: {exc}"
        return "refused"
    assert found == expected, f"{what}: recovered something else"
    return "recovered"


@pytest.mark.parametrize("time", ["transaction", "event"])
def test_one_damaged_byte_or_cut_anywhere_is_recovered_exactly_or_refused_by_name(directories, tmp_path, time):
    source = directories[time]
    expected = summary(read_back(_copy(source, tmp_path / "clean")))
    outcomes: Counter = Counter()
    for path in damaged_files(source):
        relative = os.path.relpath(path, source)
        flips, cuts = offsets_to_damage(path)
        for kind, at in [("flip", f) for f in flips] + [("cut", c) for c in cuts]:
            copy = _copy(source, tmp_path / "case")
            _damage(os.path.join(copy, relative), kind, at)
            outcomes[check_outcome(copy, relative, expected, f"{kind} at byte {at} of {relative}")] += 1
    assert outcomes["refused"] and outcomes["recovered"]  # both happen: old segments, the older checkpoint


@pytest.mark.parametrize("time", ["transaction", "event"])
def test_after_a_crash_only_the_unacknowledged_half_record_may_be_dropped(directories, tmp_path, time):
    """No clean close marker and half a record at the end of the newest segment: a flip
    anywhere in the segment, or a cut inside the half record, recovers the acknowledged
    state or is refused naming the segment."""
    crashed = _copy(directories[time], tmp_path / "crashed")
    os.remove(os.path.join(crashed, "wal", "closed.json"))
    segment = sorted(glob.glob(f"{crashed}/wal/*.log"))[-1]
    acknowledged = os.path.getsize(segment)
    expected = summary(read_back(_copy(crashed, tmp_path / "clean")))
    half = LogRecord({"type": "epoch", "epoch": 10_000, "offsets": {}, "changes": []}, [b"x" * 64]).encode()
    with open(segment, "ab") as handle:
        handle.write(half[:len(half) // 2])
    relative = os.path.relpath(segment, crashed)
    flips, _ = offsets_to_damage(segment)
    cuts = range(acknowledged, os.path.getsize(segment))
    outcomes: Counter = Counter()
    for kind, at in [("flip", f) for f in flips] + [("cut", c) for c in cuts]:
        copy = _copy(crashed, tmp_path / "case")
        _damage(os.path.join(copy, relative), kind, at)
        outcomes[check_outcome(copy, relative, expected, f"{kind} at byte {at} of {relative} after a crash")] += 1
    assert outcomes["refused"] and outcomes["recovered"]


def test_a_flip_in_the_newest_segment_is_refused_until_the_loss_is_accepted(spark, tmp_path):
    """The case found: 17 acknowledged epochs, one byte flipped in the middle of the newest
    segment. Opening refuses, naming the file, the byte and the epochs beyond, and changes
    nothing; ``accept_data_loss=True`` opens it with exactly the epochs before the damage
    and says which were dropped; the directory then opens normally and goes on."""
    stream = valid_stream(seed=33, count=19)
    directory = str(tmp_path / "state")
    with Engine(spark=spark, state_dir=directory, config=EngineConfig(checkpoint_interval=0)) as db:
        define(db)
        for tx in stream[:17]:
            db.transact(tx)
    segment = sorted(glob.glob(f"{directory}/wal/*.log"))[-1]
    starts = record_starts(segment)
    middle = starts[len(starts) // 2]
    _damage(segment, "flip", middle + 20)
    before = {p: open(p, "rb").read() for p in damaged_files(directory)}
    with pytest.raises(CorruptStateError) as refused:
        Engine(spark=spark, state_dir=directory)
    message = str(refused.value)
    assert f"{segment}: a record failing its checksum at byte {middle}" in message
    kept = int(message.split("ends at epoch ")[1].split(".")[0])
    assert 0 < kept < 17 and f"acknowledged epochs {kept + 1} to 17 lie beyond it" in message
    assert "accept_data_loss=True" in message and "factflow repair" in message
    assert {p: open(p, "rb").read() for p in damaged_files(directory)} == before  # nothing changed

    with Engine(spark=spark, state_dir=directory, accept_data_loss=True) as db:
        dropped = db.recovery.dropped
        assert db.epoch == kept and (dropped.kept_epoch, dropped.epochs) == (kept, list(range(kept + 1, 18)))
        assert segment in dropped.damage
        check_queries(db, oracle_after(stream[:kept]), LIGHT)
        assert db.transact(stream[kept]) == kept + 1
    with Engine(spark=spark, state_dir=directory) as db:
        assert db.epoch == kept + 1 and db.recovery.dropped is None
        check_queries(db, oracle_after(stream[:kept + 1]), LIGHT)


def test_factflow_repair_reports_then_cuts_with_consent(spark, tmp_path, capsys):
    stream = valid_stream(seed=34, count=6)
    directory = str(tmp_path / "state")
    with Engine(spark=spark, state_dir=directory, config=EngineConfig(checkpoint_interval=0)) as db:
        define(db)
        for tx in stream:
            db.transact(tx)
    assert cli(["repair", directory]) == 0
    assert f"{directory}: epoch 6" in capsys.readouterr().out
    segment = sorted(glob.glob(f"{directory}/wal/*.log"))[-1]
    with open(segment, "r+b") as handle:  # cut after the clean close
        handle.truncate(os.path.getsize(segment) - 30)
    assert cli(["repair", directory]) == 1
    err = capsys.readouterr().err
    assert "cut after it was closed" in err and "up to 6 are missing" in err
    assert cli(["repair", directory, "--accept-data-loss"]) == 0
    out = capsys.readouterr().out
    assert "the state before the cut ends at epoch 5" in out and f"{directory}: epoch 5" in out
    with Engine(spark=spark, state_dir=directory) as db:
        assert db.epoch == 5 and db.recovery.dropped is None
        check_queries(db, oracle_after(stream[:5]), LIGHT)


def _copy(source: str, target) -> str:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    return str(target)


def _damage(path: str, kind: str, at: int) -> None:
    with open(path, "r+b") as handle:
        if kind == "cut":
            handle.truncate(at)
            return
        handle.seek(at)
        byte = handle.read(1)[0]
        handle.seek(at)
        handle.write(bytes([byte ^ (1 << (at % 8))]))
