"""The write-ahead log, the sealed files and the offsets, without Spark.

After a crash, a log cut at any byte keeps exactly the records written whole before the
cut; after a clean close, a cut is refused. A flipped byte anywhere is refused with the
file, the offset and the records beyond named, unless what it hits is a torn final
write; damage in a segment that is not the last is refused with its file named; a failed
append leaves nothing of itself behind.
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
from factflow.storage.wal import LogDamage, LogRecord, WriteAheadLog


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
    found = [r for _, _, r in log.scan(1)]
    log.open_for_append(1)
    return found, log


def crash(directory) -> None:
    """What a killed engine leaves: no clean close marker."""
    os.remove(os.path.join(directory, "closed.json"))


def ends(items: list[LogRecord]) -> list[int]:
    """The byte offset at which each record of a one-segment log ends."""
    out, position = [], 20
    for record in items:
        position += len(record.encode())
        out.append(position)
    return out


def test_records_round_trip(tmp_path):
    written = records(5)
    write_log(tmp_path, written, rotate_after=2)
    found, log = read_back(tmp_path)
    assert found == written
    assert log.segments() == [1, 2] and log.torn == []


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_after_a_crash_a_log_cut_anywhere_keeps_the_whole_records_before_the_cut(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("wal")
    written = records(4)
    write_log(directory, written)
    crash(directory)
    path = os.path.join(directory, "000000000001.log")
    size = os.path.getsize(path)
    cut = data.draw(st.integers(0, size - 1), label="cut")
    with open(path, "r+b") as handle:
        handle.truncate(cut)
    found, log = read_back(directory)
    assert found == [r for r, end in zip(written, ends(written)) if end <= cut]
    log.append(LogRecord({"type": "epoch", "epoch": 99}))  # appending continues after what was kept
    log.close()
    again, _ = read_back(directory)
    assert again == found + [LogRecord({"type": "epoch", "epoch": 99})]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_after_a_clean_close_a_cut_log_is_refused(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("wal")
    write_log(directory, records(4))
    path = os.path.join(directory, "000000000001.log")
    cut = data.draw(st.integers(0, os.path.getsize(path) - 1), label="cut")
    with open(path, "r+b") as handle:
        handle.truncate(cut)
    with pytest.raises(LogDamage, match="cut after it was closed") as refused:
        read_back(directory)
    assert refused.value.path == path
    assert os.path.getsize(path) == cut  # nothing was changed
    assert os.path.exists(os.path.join(directory, "closed.json"))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_flipped_byte_is_refused_unless_it_is_in_a_torn_final_write(tmp_path_factory, data):
    """A crash left half a record at the end (never acknowledged); then one byte anywhere
    is flipped. Reading gives every acknowledged record (the torn one dropped), or refuses
    naming the segment, the offset of the damaged record and the records beyond it (a
    flip in the torn record's header is refused too: a header failing its checksum is
    never taken for a torn write)."""
    directory = tmp_path_factory.mktemp("wal")
    written = records(4)
    write_log(directory, written)
    crash(directory)
    path = os.path.join(directory, "000000000001.log")
    unacknowledged = LogRecord({"type": "epoch", "epoch": 5}, [b"z" * 40]).encode()
    with open(path, "ab") as handle:
        handle.write(unacknowledged[:len(unacknowledged) // 2])
    size = os.path.getsize(path)
    at = data.draw(st.integers(20, size - 1), label="offset")
    with open(path, "r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)[0]
        handle.seek(at)
        handle.write(bytes([byte ^ (1 << data.draw(st.integers(0, 7), label="bit"))]))
    bounds = [20] + ends(written)
    try:
        found, log = read_back(directory)
    except LogDamage as damage:
        hit = max(i for i, start in enumerate(bounds) if start <= at)  # the record the flip is in (or the torn one)
        assert (damage.path, damage.offset) == (path, bounds[hit])
        assert [m["epoch"] for m in damage.beyond] == [r.meta["epoch"] for r in written[hit + 1:]]
        return
    assert found == written and at >= bounds[-1], f"flip at {at} was not detected"
    assert log.torn and "torn tail" in log.torn[0]


def test_a_flipped_byte_in_the_newest_segment_is_refused_with_the_records_beyond(tmp_path):
    """The case fault injection found: a flip in the middle of the newest segment was taken
    for a torn tail, and every acknowledged record after it silently dropped."""
    written = records(17)
    write_log(tmp_path, written, rotate_after=5)
    path = os.path.join(tmp_path, "000000000002.log")
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) // 2)
        byte = handle.read(1)[0]
        handle.seek(os.path.getsize(path) // 2)
        handle.write(bytes([byte ^ 1]))
    with pytest.raises(LogDamage, match="000000000002.log: a record failing its checksum at byte") as refused:
        read_back(tmp_path)
    beyond = [m["epoch"] for m in refused.value.beyond]
    assert beyond and beyond == list(range(beyond[0], 18))
    log = WriteAheadLog(str(tmp_path))
    assert log.truncate(2, refused.value.offset) == []  # accepting the loss: cut there
    found, _ = read_back(tmp_path)
    assert found == written[:beyond[0] - 2]


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
        head = struct.pack("<6sHQ", b"FFWAL\x00", 3, 1)
        handle.write(head + struct.pack("<I", __import__("zlib").crc32(head)))
    with pytest.raises(StateVersionError, match="version 3"):
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


def test_segments_of_format_version_1_are_still_read(tmp_path):
    """Segments written before frames carried their own checksum (format 1) read as before,
    and the log continues in them with format 2 frames."""
    import zlib

    written = records(3)
    head = struct.pack("<6sHQ", b"FFWAL\x00", 1, 1)
    data = head + struct.pack("<I", zlib.crc32(head))
    for record in written:
        framed = record.encode()
        payload = framed[12:]
        data += struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    (tmp_path / "000000000001.log").write_bytes(data + b"\x07\x00")  # and a torn tail
    found, log = read_back(tmp_path)
    assert found == written and "torn tail" in log.torn[0]
    log.append(LogRecord({"type": "epoch", "epoch": 4}))
    log.close()
    assert log.segments() == [1, 2]  # the new format in a segment of its own
    again, _ = read_back(tmp_path)
    assert again == written + [LogRecord({"type": "epoch", "epoch": 4})]
