"""Files that survive a crash: fsync, atomic replacement, checksums, the directory lock.

A write reaches the disk only when the file is fsync'd, and a new name (a created or
renamed file) only when its directory is fsync'd too; every function here that creates a
name does both. Checksums are CRC32 (``zlib.crc32``): they catch torn writes and flipped
bits, not tampering.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import zlib

from factflow.errors import CorruptStateError, StateLockedError
from factflow.text import plural

__all__ = ["fsync_dir", "fsync_file", "write_atomic", "file_crc32", "verify_file", "DirectoryLock",
           "canonical_json", "sealed_json", "open_sealed_json", "unseal"]

_CHUNK = 1 << 20


def fsync_dir(path: str) -> None:
    """Make the names in directory ``path`` (files created, renamed or removed) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    """Make the contents of the file ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` as the file ``path`` all at once: a temporary file, fsync'd, renamed
    over ``path``, and the directory fsync'd. After a crash ``path`` is the old or the new
    file, never a mix."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def file_crc32(path: str) -> tuple[int, int]:
    """The CRC32 and size of the file ``path``."""
    crc, size = 0, 0
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(_CHUNK)
            if not chunk:
                return crc, size
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)


def verify_file(path: str, size: int, crc32: int) -> None:
    """Raise :class:`CorruptStateError` naming ``path`` unless it has ``size`` bytes and checksum ``crc32``."""
    try:
        found_crc, found_size = file_crc32(path)
    except FileNotFoundError:
        raise CorruptStateError(f"{path} is missing") from None
    if found_size != size:
        raise CorruptStateError(f"{path} has {plural(found_size, 'byte')} where {size:,} were written")
    if found_crc != crc32:
        raise CorruptStateError(f"{path} fails its checksum (CRC32 {found_crc:08x}, written {crc32:08x})")


def canonical_json(value: object) -> bytes:
    """``value`` as JSON with sorted keys and no spaces (the form checksums are taken of)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sealed_json(body: dict) -> bytes:
    """A JSON document ``{"body": body, "crc32": ...}`` whose checksum covers the canonical body."""
    return canonical_json({"body": body, "crc32": zlib.crc32(canonical_json(body))}) + b"\n"


def open_sealed_json(path: str) -> dict:
    """The body of a local file written with :func:`sealed_json`; :class:`CorruptStateError`
    naming the file if it is unreadable or fails its checksum."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise CorruptStateError(f"{path} is not a readable factflow file: {exc}") from None
    return unseal(data, path)


def unseal(data: bytes, path: str) -> dict:
    """The body of the contents ``data`` of a file written with :func:`sealed_json`;
    :class:`CorruptStateError` naming ``path`` if they do not parse or fail the checksum."""
    try:
        document = json.loads(data)
        body, crc = document["body"], document["crc32"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptStateError(f"{path} is not a readable factflow file: {exc}") from None
    if zlib.crc32(canonical_json(body)) != crc:
        raise CorruptStateError(f"{path} fails its checksum")
    return body


class DirectoryLock:
    """An exclusive advisory lock (``fcntl.flock``) on ``<directory>/LOCK``, held until
    :meth:`release` or the process ends (the kernel drops it with the process, so a killed
    engine never leaves a stale lock). A second opener, in this process or another, fails
    at once with :class:`StateLockedError`."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, "LOCK")
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = self._holder()
            os.close(self._fd)
            self._fd = None
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StateLockedError(f"the state directory {directory} is in use by another engine"
                                       f"{holder}; close it first (one engine per state directory)") from None
            raise
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def _holder(self) -> str:
        try:
            text = os.pread(self._fd, 32, 0).decode().strip()
        except OSError:
            return ""
        return f" (process {text})" if text.isdigit() else ""

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def bytes_under(path: str) -> int:
    """The total size of the files under ``path`` (files that vanish meanwhile count 0)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
