"""The write-ahead log: checksummed records appended to numbered segment files.

The log is a sequence of segment files ``wal/<number>.log`` (numbers from 1, without
gaps). A segment starts with a 20-byte header: the magic ``FFWAL\\0``, the format version
(u16), the segment number (u64) and the CRC32 of those 16 bytes. Records follow, each
framed as::

    u32 length of the payload | u32 CRC32 of the payload | u32 CRC32 of those 8 bytes | payload

(little-endian; segments of format version 1 have no third field). A payload is a JSON
object (``meta``, its length first as a u32) followed by the binary blobs its
``"blobs"`` entry gives the sizes of (Arrow IPC streams).

:meth:`WriteAheadLog.append` writes one record with one ``write`` and makes it durable
with ``fdatasync`` before returning; a new segment is fsync'd with its directory.

**Torn writes and damage.** A crash may leave the last record of the last segment
incomplete: that record was never acknowledged, and :meth:`WriteAheadLog.open_for_append`
cuts it off (listed in :attr:`WriteAheadLog.torn`). Only the end of the last write can be
torn, so a record is taken as torn only when all of these hold:

* it is in the last segment and nothing that passes its checksums follows it;
* the file ends inside it (its header or its payload cut short), or everything from its
  start to the end of the file is zeros (space the file system allocated but the write
  never reached).

A whole record that fails its checksum is never taken as torn, even at the very end: a
write that ``fdatasync`` completed cannot be partial, so it is a flipped bit of an
acknowledged record (payloads hold Arrow buffers with long runs of zeros, so "a zeroed
sector" is no sign of a torn write here). Anything else that fails a check (a frame header failing its own checksum, a whole
record failing its checksum, a record that does not decode, damage in a segment that is
not the last, a missing segment) is *damage*: the log holds acknowledged records that
cannot be read. Reading raises :class:`LogDamage` naming the file, the byte offset, and
the records still readable beyond it (so the caller can say which acknowledged epochs
would be lost). Nothing is truncated unless the caller asks, with
:meth:`WriteAheadLog.truncate` (an engine's ``accept_data_loss=True``, ``factflow
repair``).

**A cleanly closed log.** :meth:`WriteAheadLog.close` writes ``wal/closed.json`` (sealed
JSON: the last segment, its size, and what the caller says it ends with, such as the last
epoch), and the next :meth:`open_for_append` removes it before appending. While it is
there, a log that ends before the size it names was cut after it was closed (a
truncation cannot be told from a torn write otherwise): that too is :class:`LogDamage`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator

from factflow.errors import CorruptStateError, StateVersionError, StorageError
from factflow.storage.files import sealed_json, unseal
from factflow.storage.location import Location
from factflow.text import plural

__all__ = ["LogRecord", "LogDamage", "WriteAheadLog", "FORMAT_VERSION"]

log = logging.getLogger("factflow.storage")

FORMAT_VERSION = 2
_MAGIC = b"FFWAL\x00"
_HEADER = struct.Struct("<6sHQ")
_HEADER_SIZE = _HEADER.size + 4
_CRC = struct.Struct("<I")
_FRAME = {1: struct.Struct("<II"), 2: struct.Struct("<III")}  # per segment format version
_META = struct.Struct("<I")
_NAME = re.compile(r"^(\d{12})\.log$")
_CLOSED = "closed.json"
_MAX_RECORD = (1 << 32) - 1
_FETCH_AHEAD = 8  # log objects read ahead at recovery


@dataclass
class LogRecord:
    """One record: a JSON object and binary blobs."""

    meta: dict
    blobs: list[bytes] = field(default_factory=list)

    def encode(self) -> bytes:
        """The framed record (length and checksum, their checksum, payload)."""
        meta = dict(self.meta, blobs=[len(b) for b in self.blobs])
        text = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
        payload = b"".join([_META.pack(len(text)), text, *self.blobs])
        if len(payload) > _MAX_RECORD:
            raise StorageError(f"a log record of {plural(len(payload), 'byte')} is larger than the log's 4 GiB limit")
        head = _FRAME[1].pack(len(payload), zlib.crc32(payload))
        return head + _CRC.pack(zlib.crc32(head)) + payload

    @classmethod
    def decode(cls, payload: bytes) -> "LogRecord":
        """A record from its checksummed payload (ValueError if malformed)."""
        (size,) = _META.unpack_from(payload, 0)
        meta = json.loads(payload[_META.size:_META.size + size])
        if not isinstance(meta, dict):
            raise ValueError("the record's meta is not a JSON object")
        blobs, position = [], _META.size + size
        for length in meta.pop("blobs", []):
            blobs.append(payload[position:position + length])
            position += length
        if position != len(payload):
            raise ValueError("blob sizes do not add up to the payload")
        return cls(meta, blobs)


class LogDamage(CorruptStateError):
    """Acknowledged records of the log cannot be read: ``path`` (segment ``segment``) is
    damaged at byte ``offset`` for ``reason``. ``beyond``: the metas of the records still
    readable after the damage (in that segment and later ones); ``closed``: what the
    clean close marker said the log ended with, when the damage is a log cut short."""

    def __init__(self, path: str, segment: int, offset: int, reason: str, beyond: list[dict],
                 closed: dict | None = None):
        self.path, self.segment, self.offset, self.reason = path, segment, offset, reason
        self.beyond, self.closed = beyond, closed
        super().__init__(f"{path} {reason}" if reason.startswith("is missing") else f"{path}: {reason} at byte {offset}")


@dataclass
class _Damage:
    """What reading one segment stopped at: the offset, why, and whether it is a torn write."""

    offset: int
    reason: str
    torn: bool
    resume: int | None = None  # where a readable record starts again after it (damage only)


class WriteAheadLog:
    """The log under a :class:`~factflow.storage.location.Location`: scanned once at
    recovery, then appended to. On a local path (a shared mount included) it is segment
    files appended to and ``fdatasync``'d; on an object store, which cannot append, every
    append is an object of its own (a segment holding one record), created only if absent,
    so that a second writer fails instead of overwriting (see the module docstring)."""

    def __init__(self, location: Location | str):
        location = location if isinstance(location, Location) else Location(location)
        self.location = location
        self.directory = location.uri
        location.makedirs()
        self.objects = not location.is_local  # one object per append; no torn writes
        self._fd: int | None = None
        self._appending = False   # opened for appending, not closed yet
        self.segment = 0          # the segment appended to (objects: the last written)
        self._size = 0            # bytes in it
        self.bytes_since_rotation = 0
        self.failed: BaseException | None = None
        self.torn: list[str] = []  # what scanning found torn and truncation removed
        self._valid: tuple[int, int, str | None] | None = None  # last segment scanned: valid bytes, torn tail

    # ------------------------------------------------------------ reading
    def segments(self) -> list[int]:
        """Numbers of the segment files present, ascending."""
        return sorted(int(m.group(1)) for m in map(_NAME.match, self.location.list()) if m)

    def path(self, number: int) -> str:
        """The file of segment ``number`` (for messages)."""
        return self.location.file(_name(number))

    @property
    def closed_marker(self) -> str:
        """The file a clean close writes (see the module docstring)."""
        return self.location.file(_CLOSED)

    def scan(self, first: int, skip_damaged_marker: bool = False) -> Iterator[tuple[int, int, LogRecord]]:
        """Every record of segments ``first`` onwards, in order, with its segment number and
        byte offset. Segments must be numbered without gaps from ``first``. Stops at a torn
        tail of the last segment (remembered for :meth:`open_for_append`); damage raises
        :class:`LogDamage`, and so does a log that ends before a clean close said it did. A
        damaged close marker is refused too (:class:`CorruptStateError`), or passed over
        with ``skip_damaged_marker``."""
        try:
            closed = self._closed()
        except CorruptStateError:
            if not skip_damaged_marker:
                raise
            log.error("write-ahead log: the clean close marker %s is damaged; passed over", self.closed_marker)
            closed = None
        numbers = [n for n in self.segments() if n >= first]
        if numbers and numbers[0] != first:
            raise LogDamage(self.path(first), first, 0, f"is missing (the log continues with {self.path(numbers[0])})",
                            self.records_after(numbers[0] - 1, 0))
        contents = self._contents(numbers)
        for i, number in enumerate(numbers):
            if i and number != numbers[i - 1] + 1:
                missing = numbers[i - 1] + 1
                raise LogDamage(self.path(missing), missing, 0, "is missing: the log has a gap",
                                self.records_after(missing, 0))
            data = next(contents)
            yield from ((number, offset, r) for offset, r in self._read(number, data, i == len(numbers) - 1))
        if closed is not None:
            self._check_closed(closed, numbers)

    def _contents(self, numbers: list[int]) -> Iterator[bytes]:
        """The bytes of segments ``numbers`` in order; objects are fetched a few at a time ahead."""
        if not self.objects:
            for number in numbers:
                yield self.location.read(_name(number))
            return
        with ThreadPoolExecutor(max_workers=_FETCH_AHEAD) as pool:
            pending = [pool.submit(self.location.read, _name(n)) for n in numbers[:_FETCH_AHEAD]]
            for i in range(len(numbers)):
                if i + _FETCH_AHEAD < len(numbers):
                    pending.append(pool.submit(self.location.read, _name(numbers[i + _FETCH_AHEAD])))
                yield pending[i].result()
                pending[i] = None

    def _closed(self) -> dict | None:
        try:
            data = self.location.read(_CLOSED)
        except FileNotFoundError:
            return None
        return unseal(data, self.closed_marker)

    def _check_closed(self, closed: dict, numbers: list[int]) -> None:
        """Damage unless the log reaches at least where its clean close said it ended."""
        segment, size = closed.get("segment"), closed.get("size")
        if not isinstance(segment, int) or not isinstance(size, int):
            raise CorruptStateError(f"{self.closed_marker} does not say where the log ended")
        last = numbers[-1] if numbers else None
        end = self._valid[1] if self._valid and self._valid[0] == last else None
        if segment == 0 or (last is not None and (last, end) >= (segment, size)):
            return  # (segment 0: an object log closed before its first record)
        where = self.path(last) if last is not None else self.path(segment)
        at = end if end is not None else 0
        self._valid = None
        raise LogDamage(where, last or segment, at,
                        f"the log ends here, but the engine that closed it had written {plural(size, 'byte')} of "
                        f"{self.path(segment)} (the log was cut after it was closed)", [], closed)

    def _read(self, number: int, data: bytes, last: bool) -> Iterator[tuple[int, LogRecord]]:
        path = self.path(number)
        problem = _header_problem(data[:_HEADER_SIZE], number)
        if problem is not None:
            if last and not self.objects and (len(data) <= _HEADER_SIZE or not any(data)):
                self._valid = (number, 0, f"{path}: torn segment header ({plural(len(data), 'byte')}) rewritten")
                return
            if problem.startswith("version"):
                raise StateVersionError(f"{path}: {problem}")
            raise LogDamage(path, number, 0, problem, self.records_after(number, 0))
        version = _HEADER.unpack_from(data)[1]
        position = _HEADER_SIZE
        while position < len(data):
            record, end, damage = _next_record(data, position, version)
            if damage is None:
                yield position, record
                position = end
                continue
            if damage.torn and last and not self.objects:
                self._valid = (number, position, f"{path}: torn tail ({damage.reason} at byte {position}, "
                                                 f"{plural(len(data) - position, 'byte')} dropped)")
                return
            raise LogDamage(path, number, position, damage.reason + (" (not the end of the log)" if not last else ""),
                            self.records_after(number, position))
        if last:
            self._valid = (number, position, None)

    def records_after(self, segment: int, offset: int) -> list[dict]:
        """The metas of the records readable in ``segment`` after byte ``offset`` (damage
        skipped) and in every later segment: what lies beyond damage at ``offset``."""
        metas = self._readable(segment, offset + 1)
        return metas + [m for n in self.segments() if n > segment for m in self._readable(n, _HEADER_SIZE)]

    def _readable(self, number: int, start: int) -> list[dict]:
        """The metas of the records of segment ``number`` readable from ``start`` on, skipping damage."""
        try:
            data = self.location.read(_name(number))
        except (OSError, StorageError):
            return []
        if _header_problem(data[:_HEADER_SIZE], number) is not None:
            return []
        version = _HEADER.unpack_from(data)[1]
        metas, position = [], max(start, _HEADER_SIZE)
        while position is not None and position < len(data):
            record, end, damage = _next_record(data, position, version)
            if damage is None:
                metas.append(record.meta)
                position = end
            else:
                position = damage.resume
        return metas

    # ------------------------------------------------------------ writing
    def open_for_append(self, first: int) -> None:
        """Continue the last segment (its torn tail, found by :meth:`scan`, cut off) or, when
        there is none, start segment ``first``. Call after scanning. Removes the clean
        close marker first: from now on the log may grow past it."""
        if self.location.exists(_CLOSED):
            self.location.remove(_CLOSED)
            self.location.sync()
        numbers = [n for n in self.segments() if n >= first]
        self._appending = True
        if self.objects:
            self.segment = numbers[-1] if numbers else first - 1
            self._size = self._valid[1] if self._valid and self._valid[0] == self.segment else 0
            return
        if not numbers:
            self._create(first)
            return
        number = numbers[-1]
        scanned, valid, torn = self._valid or (number, None, None)
        if scanned != number:
            valid, torn = None, None
        path = self.path(number)
        fd = os.open(path, os.O_RDWR)
        if valid is None:
            valid = os.fstat(fd).st_size
        if valid == 0:
            os.ftruncate(fd, 0)
            os.pwrite(fd, _header(number), 0)
            valid = _HEADER_SIZE
            os.fsync(fd)
        elif os.fstat(fd).st_size > valid:
            os.ftruncate(fd, valid)
            os.fsync(fd)
        if torn:
            log.warning("write-ahead log: %s", torn)
            self.torn.append(torn)
        os.lseek(fd, valid, os.SEEK_SET)
        self._fd, self.segment, self._size = fd, number, valid
        if _HEADER.unpack_from(os.pread(fd, _HEADER_SIZE, 0))[1] != FORMAT_VERSION:
            self._create(number + 1)  # records of this format go into a segment of this format

    def truncate(self, segment: int, offset: int) -> list[int]:
        """Give up everything from byte ``offset`` of ``segment`` on: that segment is cut
        there (removed if nothing of it remains, and always on an object store, where a
        segment is one record) and every later segment removed; returns the segments
        removed. Only for accepting damage the caller has reported."""
        whole = self.objects or offset <= _HEADER_SIZE
        removed = [n for n in self.segments() if n > segment or (n == segment and whole)]
        for n in removed:
            self.location.remove(_name(n))
        if segment not in removed and self.location.exists(_name(segment)):
            fd = os.open(self.path(segment), os.O_RDWR)
            try:
                os.ftruncate(fd, offset)
                os.fsync(fd)
            finally:
                os.close(fd)
        self.location.remove(_CLOSED)
        self.location.sync()
        self._valid = None
        return removed

    def _create(self, number: int) -> None:
        path = self.path(number)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, _header(number))
        os.fsync(fd)
        self.location.sync()
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self.segment, self._size = fd, number, _HEADER_SIZE

    def append(self, record: LogRecord) -> None:
        """Write ``record`` durably before returning: at the end of the current segment
        (``fdatasync``), or as the next object, created only if absent.

        If a local write fails, the segment is cut back to where the record began, so a
        failed record is never followed by others; if even that fails, the log refuses
        every later append (:class:`StorageError`) until the engine is reopened. An object
        that exists already means another engine writes this log: every later append is
        refused."""
        if self.failed is not None:
            raise StorageError(f"the write-ahead log failed earlier ({self.failed}); reopen the engine")
        data = record.encode()
        if self.objects:
            self._append_object(data)
        else:
            self._append_local(data)
        self.bytes_since_rotation += len(data)

    def _append_object(self, data: bytes) -> None:
        number = self.segment + 1
        try:
            created = self.location.create(_name(number), _header(number) + data)
        except Exception as exc:  # noqa: BLE001 - the store's client errors, whatever they are
            raise StorageError(f"could not write the write-ahead log object {self.path(number)}: {exc}") from exc
        if not created:
            self.failed = StorageError(f"{self.path(number)} was written by another engine")
            raise StorageError(f"another engine writes the log of {self.directory}: {self.path(number)} exists "
                               "already; this engine stops logging (reopen the directory)")
        self.segment, self._size = number, _HEADER_SIZE + len(data)

    def _append_local(self, data: bytes) -> None:
        start = self._size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            _datasync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, start)
                os.lseek(self._fd, start, os.SEEK_SET)
                os.fsync(self._fd)
            except OSError as again:
                self.failed = again
            raise StorageError(f"could not write the write-ahead log {self.path(self.segment)}: {exc}") from exc
        self._size += len(data)

    def rotate(self) -> int:
        """Start the next segment; returns its number (records appended from now on go there;
        on an object store every record is a segment of its own, so nothing is written)."""
        if self.failed is not None:
            raise StorageError(f"the write-ahead log failed earlier ({self.failed}); reopen the engine")
        self.bytes_since_rotation = 0
        if self.objects:
            return self.segment + 1
        self._create(self.segment + 1)
        return self.segment

    def remove_before(self, number: int) -> list[int]:
        """Delete the segments numbered below ``number``; returns their numbers."""
        removed = [n for n in self.segments() if n < number]
        for n in removed:
            self.location.remove(_name(n))
        if removed:
            self.location.sync()
        return removed

    def close(self, ends_with: dict | None = None) -> None:
        """Close the segment appended to. A log that was opened for appending and never
        failed writes the clean close marker, saying where it ends and ``ends_with`` (what
        the caller wants a later reader to know was in it, such as the last epoch)."""
        if not self._appending:
            return
        self._appending = False
        try:
            if self.failed is None:
                self.location.write(_CLOSED, sealed_json({"segment": self.segment, "size": self._size,
                                                          **(ends_with or {})}))
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _name(number: int) -> str:
    return f"{number:012d}.log"


def _header(number: int) -> bytes:
    head = _HEADER.pack(_MAGIC, FORMAT_VERSION, number)
    return head + _CRC.pack(zlib.crc32(head))


def _header_problem(head: bytes, number: int) -> str | None:
    if len(head) < _HEADER_SIZE:
        return f"segment header cut short ({plural(len(head), 'byte')})"
    magic, version, found = _HEADER.unpack_from(head)
    if magic != _MAGIC or zlib.crc32(head[:_HEADER.size]) != _CRC.unpack_from(head, _HEADER.size)[0]:
        return "not a factflow log segment (bad magic or header checksum)"
    if version > FORMAT_VERSION:
        return f"version {version} is newer than this factflow reads ({FORMAT_VERSION})"
    if found != number:
        return f"header says segment {found}"
    return None


def _frame_at(data: bytes, position: int, version: int) -> tuple[LogRecord | None, int, str | None, bool]:
    """Parse the record framed at ``position`` of a segment's ``data``: the record and where
    the next one starts, or what is wrong and whether the file simply ends inside it."""
    frame = _FRAME[min(version, 2)]
    if len(data) - position < frame.size:
        return None, 0, "a record header cut short", True
    fields = frame.unpack_from(data, position)
    if version >= 2 and zlib.crc32(data[position:position + 8]) != fields[2]:
        return None, 0, "a record header failing its checksum", False
    start = position + frame.size
    end = start + fields[0]
    if end > len(data):
        return None, 0, f"a record of {plural(fields[0], 'byte')} cut short at {len(data) - start}", True
    payload = data[start:end]
    if zlib.crc32(payload) != fields[1]:
        return None, 0, "a record failing its checksum", False
    try:
        return LogRecord.decode(payload), end, None, False
    except (ValueError, struct.error) as exc:
        return None, 0, f"a malformed record ({exc})", False


def _next_record(data: bytes, position: int, version: int) -> tuple[LogRecord | None, int, _Damage | None]:
    """The record at ``position`` and where the next starts, or the damage there: torn
    only where the file ends inside the record, or is zeros from its start to the end, and
    no readable record follows (see the module docstring)."""
    record, end, reason, cut_short = _frame_at(data, position, version)
    if reason is None:
        return record, end, None
    following = _next_readable(data, position + 1, version)
    torn = following is None and (cut_short or not any(memoryview(data)[position:]))
    return None, 0, _Damage(position, reason, torn, following)


def _next_readable(data: bytes, start: int, version: int) -> int | None:
    """The offset of the first whole record at or after ``start`` that passes its checksums.

    Every payload begins with the u32 size of its JSON meta and then ``{"``, so only the
    offsets a frame and a u32 before such a pair need checking."""
    before = _FRAME[min(version, 2)].size + _META.size
    at = data.find(b'{"', start + before)
    while at != -1:
        if _frame_at(data, at - before, version)[0] is not None:
            return at - before
        at = data.find(b'{"', at + 1)
    return None


def _datasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)
