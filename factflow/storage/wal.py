"""The write-ahead log: checksummed records appended to numbered segment files.

The log is a sequence of segment files ``wal/<number>.log`` (numbers from 1, without
gaps). A segment starts with a 20-byte header: the magic ``FFWAL\\0``, the format version
(u16), the segment number (u64) and the CRC32 of those 16 bytes. Records follow, each
framed as::

    u32 length of the payload | u32 CRC32 of the payload | payload

(little-endian). A payload is a JSON object (``meta``, its length first as a u32) followed
by the binary blobs its ``"blobs"`` entry gives the sizes of (Arrow IPC streams, see
:mod:`factflow.storage.records`).

:meth:`WriteAheadLog.append` writes one record with one ``write`` and makes it durable
with ``fdatasync`` before returning; a new segment is fsync'd with its directory. After a
crash the last segment may end in a *torn* record (a length, checksum or payload cut
short, or bytes never written): :meth:`WriteAheadLog.scan` stops at the first record
that is incomplete or fails its checksum in the last segment, and
:meth:`WriteAheadLog.open_for_append` truncates the segment there. The same damage in
an earlier segment (which was complete when the next one was started) is corruption and
is refused with an error naming the file and offset.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Iterator

from factflow.errors import CorruptStateError, StateVersionError, StorageError
from factflow.storage.files import fsync_dir

__all__ = ["LogRecord", "WriteAheadLog", "FORMAT_VERSION"]

log = logging.getLogger("factflow.storage")

FORMAT_VERSION = 1
_MAGIC = b"FFWAL\x00"
_HEADER = struct.Struct("<6sHQ")
_HEADER_SIZE = _HEADER.size + 4
_FRAME = struct.Struct("<II")
_META = struct.Struct("<I")
_NAME = re.compile(r"^(\d{12})\.log$")
_MAX_RECORD = (1 << 32) - 1


@dataclass
class LogRecord:
    """One record: a JSON object and binary blobs."""

    meta: dict
    blobs: list[bytes] = field(default_factory=list)

    def encode(self) -> bytes:
        """The framed record (length, checksum, payload)."""
        meta = dict(self.meta, blobs=[len(b) for b in self.blobs])
        text = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
        payload = b"".join([_META.pack(len(text)), text, *self.blobs])
        if len(payload) > _MAX_RECORD:
            raise StorageError(f"a log record of {len(payload)} bytes is larger than the log's 4 GiB limit")
        return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload

    @classmethod
    def decode(cls, payload: bytes) -> "LogRecord":
        """A record from its checksummed payload (ValueError if malformed)."""
        (size,) = _META.unpack_from(payload, 0)
        meta = json.loads(payload[_META.size:_META.size + size])
        blobs, position = [], _META.size + size
        for length in meta.pop("blobs", []):
            blobs.append(payload[position:position + length])
            position += length
        if position != len(payload):
            raise ValueError("blob sizes do not add up to the payload")
        return cls(meta, blobs)


def _header(number: int) -> bytes:
    head = _HEADER.pack(_MAGIC, FORMAT_VERSION, number)
    return head + struct.pack("<I", zlib.crc32(head))


class WriteAheadLog:
    """The segments under ``directory``: scanned once at recovery, then appended to."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self._fd: int | None = None
        self.segment = 0          # the segment appended to
        self._size = 0            # bytes in it
        self.bytes_since_rotation = 0
        self.failed: BaseException | None = None
        self.torn: list[str] = []  # what scanning found torn and truncation removed
        self._valid: tuple[int, int, str | None] | None = None  # last segment scanned: valid bytes, damage

    # ------------------------------------------------------------ reading
    def segments(self) -> list[int]:
        """Numbers of the segment files present, ascending."""
        found = []
        for name in os.listdir(self.directory):
            match = _NAME.match(name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def path(self, number: int) -> str:
        """The file of segment ``number``."""
        return os.path.join(self.directory, f"{number:012d}.log")

    def scan(self, first: int) -> Iterator[tuple[int, LogRecord]]:
        """Every record of segments ``first`` onwards, in order, with its segment number.

        Segments must be numbered without gaps from ``first``. Stops at a torn tail of the
        last segment (remembered for :meth:`open_for_append`); damage anywhere else raises
        :class:`CorruptStateError`."""
        numbers = [n for n in self.segments() if n >= first]
        if numbers and numbers[0] != first:
            raise CorruptStateError(f"{self.path(first)} is missing (the log continues with {self.path(numbers[0])})")
        for i, number in enumerate(numbers):
            if i and number != numbers[i - 1] + 1:
                raise CorruptStateError(f"{self.path(numbers[i - 1] + 1)} is missing: the log has a gap")
            last = i == len(numbers) - 1
            yield from ((number, r) for r in self._read(number, last))

    def _read(self, number: int, last: bool) -> Iterator[LogRecord]:
        path = self.path(number)
        with open(path, "rb") as handle:
            data_size = os.fstat(handle.fileno()).st_size
            head = handle.read(_HEADER_SIZE)
            problem = self._header_problem(head, number)
            if problem is not None:
                if last and data_size <= _HEADER_SIZE:
                    self._valid = (number, 0, f"{path}: torn segment header ({data_size} bytes) rewritten")
                    return
                if problem.startswith("version"):
                    raise StateVersionError(f"{path}: {problem}")
                raise CorruptStateError(f"{path}: {problem}")
            position = _HEADER_SIZE
            while position < data_size:
                frame = handle.read(_FRAME.size)
                reason = None
                if len(frame) < _FRAME.size:
                    reason = "a record header cut short"
                else:
                    length, crc = _FRAME.unpack(frame)
                    payload = handle.read(length)
                    if len(payload) < length:
                        reason = f"a record of {length} bytes cut short at {len(payload)}"
                    elif zlib.crc32(payload) != crc:
                        reason = "a record failing its checksum"
                    else:
                        try:
                            record = LogRecord.decode(payload)
                        except (ValueError, struct.error) as exc:
                            reason = f"a malformed record ({exc})"
                if reason is not None:
                    if not last:
                        raise CorruptStateError(f"{path}: {reason} at byte {position} (not the end of the log)")
                    self._valid = (number, position,
                                   f"{path}: torn tail ({reason} at byte {position}, {data_size - position} bytes "
                                   f"dropped)")
                    return
                position += _FRAME.size + length
                yield record
            if last:
                self._valid = (number, position, None)

    @staticmethod
    def _header_problem(head: bytes, number: int) -> str | None:
        if len(head) < _HEADER_SIZE:
            return f"segment header cut short ({len(head)} bytes)"
        magic, version, found = _HEADER.unpack_from(head)
        if magic != _MAGIC or zlib.crc32(head[:_HEADER.size]) != struct.unpack_from("<I", head, _HEADER.size)[0]:
            return "not a factflow log segment (bad magic or header checksum)"
        if version > FORMAT_VERSION:
            return f"version {version} is newer than this factflow reads ({FORMAT_VERSION})"
        if found != number:
            return f"header says segment {found}"
        return None

    # ------------------------------------------------------------ writing
    def open_for_append(self, first: int) -> None:
        """Continue the last segment (its torn tail, found by :meth:`scan`, cut off) or, when
        there is none, start segment ``first``. Call after scanning."""
        numbers = [n for n in self.segments() if n >= first]
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

    def _create(self, number: int) -> None:
        path = self.path(number)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, _header(number))
        os.fsync(fd)
        fsync_dir(self.directory)
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self.segment, self._size = fd, number, _HEADER_SIZE

    def append(self, record: LogRecord) -> None:
        """Write ``record`` durably (``fdatasync``) at the end of the current segment.

        If the write fails, the segment is cut back to where the record began, so a failed
        record is never followed by others; if even that fails, the log refuses every later
        append (:class:`StorageError`) until the engine is reopened."""
        if self.failed is not None:
            raise StorageError(f"the write-ahead log failed earlier ({self.failed}); reopen the engine")
        data = record.encode()
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
        self.bytes_since_rotation += len(data)

    def rotate(self) -> int:
        """Start the next segment; returns its number (records appended from now on go there)."""
        if self.failed is not None:
            raise StorageError(f"the write-ahead log failed earlier ({self.failed}); reopen the engine")
        self._create(self.segment + 1)
        self.bytes_since_rotation = 0
        return self.segment

    def remove_before(self, number: int) -> list[int]:
        """Delete the segments numbered below ``number``; returns their numbers."""
        removed = [n for n in self.segments() if n < number]
        for n in removed:
            os.remove(self.path(n))
        if removed:
            fsync_dir(self.directory)
        return removed

    def close(self) -> None:
        """Close the segment appended to."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _datasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)
