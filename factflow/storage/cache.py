"""Local copies of immutable files from remote storage, kept by each executor.

Index files (:mod:`factflow.arrangement.index`) are written once and never changed, and
probes memory-map them. When they live in an object store, each executor keeps a copy of
the files its probes open on its local disk, under the Spark work directory of its
application (``SparkFiles.getRootDirectory()``, inside Spark's local directories), so a
file is fetched once per executor rather than once per probe. The cache is bounded in
bytes: after each fetch the least recently used copies (by modification time, which a
hit refreshes) are deleted until it fits again. Worker processes of one executor share
the directory; a copy is fetched under a temporary name and renamed into place, and one
deleted while another process has it mapped stays readable to that process. Files on a
local path (a shared mount included) are opened where they are.
"""

from __future__ import annotations

import hashlib
import os
import threading

from factflow.storage.location import Location

__all__ = ["FileCache", "local_file"]

_CACHES: dict[tuple[str, int], "FileCache"] = {}
_CACHES_LOCK = threading.Lock()


class FileCache:
    """Copies of remote files under ``directory``, at most ``max_bytes`` of them (see the module docstring)."""

    def __init__(self, directory: str, max_bytes: int):
        self.directory = directory
        self.max_bytes = max_bytes
        self.fetched = 0  # files this process fetched (the rest were hits)
        os.makedirs(directory, exist_ok=True)

    def path(self, location: Location, name: str) -> str:
        """A local path holding the file ``name`` of ``location``, fetched if not cached."""
        target = os.path.join(self.directory, hashlib.sha256(location.file(name).encode()).hexdigest()[:40])
        try:
            os.utime(target)
            return target
        except FileNotFoundError:
            pass
        location.download(name, target)
        self.fetched += 1
        self._evict(keep=target)
        return target

    def _evict(self, keep: str) -> None:
        copies = []
        for entry in os.scandir(self.directory):
            if entry.is_file() and not entry.name.endswith(".tmp"):
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                copies.append((stat.st_mtime, stat.st_size, entry.path))
        total = sum(size for _, size, _ in copies)
        for _, size, path in sorted(copies):
            if total <= self.max_bytes:
                break
            if path != keep:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
                total -= size


def local_file(location: Location, name: str, max_bytes: int) -> str:
    """The local path to open the file ``name`` of ``location`` at: where it is on a local
    path, else its copy in this executor's :class:`FileCache` (bounded at ``max_bytes``)."""
    if location.is_local:
        return location.file(name)
    from pyspark import SparkFiles

    try:
        root = SparkFiles.getRootDirectory()
    except Exception:  # noqa: BLE001 - outside a Spark process (a test, the driver without a context)
        root = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"factflow-{os.getuid()}")
    directory = os.path.join(root, "factflow-file-cache")
    with _CACHES_LOCK:
        cache = _CACHES.get((directory, max_bytes))
        if cache is None:
            cache = _CACHES[(directory, max_bytes)] = FileCache(directory, max_bytes)
    return cache.path(location, name)
