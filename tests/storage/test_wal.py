"""The write-ahead log, the sealed files and the offsets, without Spark.

A log cut at any byte keeps exactly the records written whole before the cut; damage in
a segment that is not the last is refused with its file named; a failed append leaves
nothing of itself behind.
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factflow.engine.offsets import SourceOffsets, check_offset
from factflow.errors import CorruptStateError, StateLockedError, StateVersionError, StorageError, TransactionError
from factflow.storage import wal as wal_module
from factflow.storage.files import DirectoryLock, open_sealed_json, sealed_json, write_atomic
from factflow.storage.wal import LogRecord, WriteAheadLog


def records(n: int) -> list[LogRecord]:
    return [LogRecord({"type": "epoch", "epoch": i + 1, "text": "x" * (i * 7)}, [bytes([i]) * (i * 3)])
            for i in range(n)]


def write_log(directory, items: list[LogRecord], rotate_after: int | None = None) -> WriteAheadLog:
    log = WriteAheadLog(str(directory))
    list(log.scan(1))
    log.open_for_append(1)
    for i, record in enumerate(items):
        log.append(record)
        if rotate_after is not None and i + 1 == rotate_after:
            log.rotate()
    log.close()
    return log


def read_back(directory) -> tuple[list[LogRecord], WriteAheadLog]:
    log = WriteAheadLog(str(directory))
    found = [r for _, r in log.scan(1)]
    log.open_for_append(1)
    return found, log


def test_records_round_trip(tmp_path):
    written = records(5)
    write_log(tmp_path, written, rotate_after=2)
    found, log = read_back(tmp_path)
    assert found == written
    assert log.segments() == [1, 2] and log.torn == []


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_log_cut_anywhere_keeps_the_whole_records_before_the_cut(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("wal")
    written = records(4)
    write_log(directory, written)
    path = os.path.join(directory, "000000000001.log")
    size = os.path.getsize(path)
    cut = data.draw(st.integers(0, size - 1), label="cut")
    with open(path, "r+b") as handle:
        handle.truncate(cut)
    found, log = read_back(directory)
    ends = []
    position = 20
    for record in written:
        position += len(record.encode())
        ends.append(position)
    assert found == [r for r, end in zip(written, ends) if end <= cut]
    log.append(LogRecord({"type": "epoch", "epoch": 99}))  # appending continues after what was kept
    log.close()
    again, _ = read_back(directory)
    assert again == found + [LogRecord({"type": "epoch", "epoch": 99})]


def test_a_flipped_byte_in_the_last_segment_ends_the_log_there(tmp_path):
    written = records(4)
    write_log(tmp_path, written)
    path = os.path.join(tmp_path, "000000000001.log")
    third = 20 + sum(len(r.encode()) for r in written[:2])
    with open(path, "r+b") as handle:
        handle.seek(third + 12)
        byte = handle.read(1)
        handle.seek(third + 12)
        handle.write(bytes([byte[0] ^ 0x40]))
    found, log = read_back(tmp_path)
    assert found == written[:2]
    assert "failing its checksum" in log.torn[0] and path in log.torn[0]
    assert os.path.getsize(path) == third


def test_damage_before_the_last_segment_is_refused_naming_the_file(tmp_path):
    write_log(tmp_path, records(4), rotate_after=2)
    path = os.path.join(tmp_path, "000000000001.log")
    with open(path, "r+b") as handle:
        handle.seek(30)
        handle.write(b"\xff")
    with pytest.raises(CorruptStateError, match="000000000001.log"):
        read_back(tmp_path)


def test_a_missing_segment_is_refused(tmp_path):
    write_log(tmp_path, records(6), rotate_after=2)
    os.remove(os.path.join(tmp_path, "000000000001.log"))
    with pytest.raises(CorruptStateError, match="000000000001.log is missing"):
        list(WriteAheadLog(str(tmp_path)).scan(1))


def test_a_newer_segment_version_is_refused(tmp_path):
    write_log(tmp_path, records(1))
    path = os.path.join(tmp_path, "000000000001.log")
    with open(path, "r+b") as handle:
        head = struct.pack("<6sHQ", b"FFWAL\x00", 2, 1)
        handle.write(head + struct.pack("<I", __import__("zlib").crc32(head)))
    with pytest.raises(StateVersionError, match="version 2"):
        list(WriteAheadLog(str(tmp_path)).scan(1))


def test_a_failed_append_leaves_nothing_behind(tmp_path, monkeypatch):
    log = WriteAheadLog(str(tmp_path))
    list(log.scan(1))
    log.open_for_append(1)
    log.append(records(1)[0])

    def half_then_fail(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    real_write = os.write
    monkeypatch.setattr(wal_module.os, "write", half_then_fail)
    with pytest.raises(StorageError, match="No space left"):
        log.append(records(3)[2])
    monkeypatch.setattr(wal_module.os, "write", real_write)
    log.append(records(2)[1])
    log.close()
    found, _ = read_back(tmp_path)
    assert found == records(2)


def test_sealed_files_detect_changes(tmp_path):
    path = str(tmp_path / "doc.json")
    write_atomic(path, sealed_json({"version": 1, "epoch": 7}))
    assert open_sealed_json(path) == {"version": 1, "epoch": 7}
    text = open(path).read().replace('"epoch":7', '"epoch":8')
    open(path, "w").write(text)
    with pytest.raises(CorruptStateError, match="doc.json fails its checksum"):
        open_sealed_json(path)


def test_the_directory_lock_admits_one_holder(tmp_path):
    first = DirectoryLock(str(tmp_path))
    with pytest.raises(StateLockedError, match=f"process {os.getpid()}"):
        DirectoryLock(str(tmp_path))
    first.release()
    DirectoryLock(str(tmp_path)).release()


def test_offsets_answer_with_the_epoch_that_includes_them():
    offsets = SourceOffsets(history=3)
    assert offsets.applied("s", 0) is None
    offsets.record({"s": 2}, 10)
    offsets.record({"s": 5, "t": 1}, 11)
    assert offsets.latest() == {"s": 5, "t": 1}
    assert offsets.applied("s", 2) == 10
    assert offsets.applied("s", 3) == 11   # skipped over: the state of 11 includes it
    assert offsets.applied("s", 6) is None
    offsets.record({"s": 7}, 12)
    offsets.record({"s": 9}, 13)
    assert offsets.applied("s", 1) == 11   # older than the history kept: the oldest epoch kept
    copy = SourceOffsets(history=3)
    copy.load(offsets.to_json())
    assert copy.to_json() == offsets.to_json()


def test_offsets_are_checked():
    assert check_offset(None, None) is None
    assert check_offset("s", 3) == ("s", 3)
    for source, offset in [("s", None), (None, 3), ("", 1), ("s", True), ("s", 1.5), ("s", 2**63)]:
        with pytest.raises(TransactionError):
            check_offset(source, offset)
