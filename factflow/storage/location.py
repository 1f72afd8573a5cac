"""Where factflow keeps its own files: a local path, a path every machine shares, or an object store.

Everything factflow itself writes and reads (the write-ahead log, checkpoints, the
catalog and offsets inside them, the index files of stored batches) goes through a
:class:`Location`: a directory named by a path or a URI, with the options its client
needs. The driver and Spark tasks use the same class (a Location pickles to its URI and
options; each process opens its own client), so a task writing an index file and the
driver reading a checkpoint manifest do the same thing.

* **Local paths** (and shared mounts such as NFS, which look local): ``os`` calls, so that
  every write can be made durable (``fsync`` of the file and of its directory), files can
  be appended to and renamed, and a directory can be locked (``flock``).
* **Object stores and HDFS** (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``): Apache Arrow's
  file systems (``pyarrow.fs``), which need no JVM connector. Objects are written whole
  (a write is visible entirely or not at all) and never appended to or renamed. Where the
  write-ahead log needs *create-only* writes (a second writer must fail, not overwrite),
  the store's own client does a conditional create: S3's ``If-None-Match: *`` through
  ``boto3``, GCS's ``ifGenerationMatch=0`` through ``google-cloud-storage``, Azure's
  ``If-None-Match: *`` through ``azure-storage-blob``; HDFS refuses to rename onto an
  existing file. Only S3 is tested (against moto's S3 server).

``storage_options`` are the constructor arguments of the store's Arrow file system
(for S3: ``access_key``, ``secret_key``, ``session_token``, ``region``, ``endpoint_override``,
``scheme``, ...), or ``endpoint_url`` as boto3 spells it. Each store's standard environment
works too, in every process that opens the location: for S3 ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` and ``AWS_ENDPOINT_URL``
(executors get environment variables through ``spark.executorEnv.*``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Mapping
from urllib.parse import urlparse

from factflow.errors import StateLockedError, StorageError
from factflow.storage.files import DirectoryLock, fsync_dir, write_atomic

__all__ = ["Location", "ObjectLock"]

_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "abfs": "azure", "abfss": "azure", "az": "azure",
            "hdfs": "hdfs", "viewfs": "hdfs"}
_CLIENTS: dict[tuple, Any] = {}  # per process: (uri root, options) -> file system or store client
_CLIENTS_LOCK = threading.Lock()


class Location:
    """A directory for factflow's files (see the module docstring). Names passed to its
    methods are paths relative to it, with ``/`` between parts."""

    def __init__(self, where: str | os.PathLike, storage_options: Mapping[str, Any] | None = None):
        text = os.fspath(where)
        scheme = urlparse(text).scheme.lower() if "://" in text else ""
        if scheme in ("", "file"):
            path = urlparse(text).path if scheme == "file" else text
            self.store, self.path = "local", os.path.abspath(os.path.expanduser(path))
            self.uri = self.path
        elif scheme in _SCHEMES:
            parsed = urlparse(text)
            self.store = _SCHEMES[scheme]
            self.path = (parsed.netloc + parsed.path).rstrip("/")
            if not parsed.netloc:
                raise StorageError(f"{text}: an object store location needs a bucket or container, as in "
                                   f"{scheme}://BUCKET/PATH")
            self.uri = f"{scheme}://{self.path}"
        else:
            raise StorageError(f"{text}: unknown storage scheme {scheme!r}; use a local path or an s3://, gs://, "
                               "abfs:// or hdfs:// URI")
        self.options = dict(storage_options or {})

    # ------------------------------------------------------------ naming
    @property
    def is_local(self) -> bool:
        """Whether this is a POSIX path (local disk or a shared mount)."""
        return self.store == "local"

    def child(self, *parts: str) -> "Location":
        """The location ``parts`` below this one (same store and options)."""
        child = object.__new__(Location)
        child.store, child.options = self.store, self.options
        child.path = self._join(*parts)
        child.uri = child.path if self.is_local else f"{self.uri.split('://')[0]}://{child.path}"
        return child

    def file(self, name: str) -> str:
        """The full path of ``name`` (an OS path, or a path inside the store), for messages and clients."""
        return self._join(name) if self.is_local else f"{self.uri}/{name}"

    def _join(self, *parts: str) -> str:
        clean = [p.strip("/") for p in parts if p and p.strip("/")]
        return os.path.join(self.path, *clean) if self.is_local else "/".join([self.path, *clean])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and (self.uri, self.options) == (other.uri, other.options)

    def __hash__(self) -> int:
        return hash(self.uri)

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def __str__(self) -> str:
        return self.uri

    def __getstate__(self) -> dict:
        return {"store": self.store, "path": self.path, "uri": self.uri, "options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    # ------------------------------------------------------------ clients
    def filesystem(self):
        """The ``pyarrow.fs`` file system of a remote location (one per process and options)."""
        if self.is_local:
            from pyarrow import fs

            return fs.LocalFileSystem()
        key = (self.store, self.path.split("/")[0], tuple(sorted(self.options.items())))
        with _CLIENTS_LOCK:
            found = _CLIENTS.get(("fs",) + key)
            if found is None:
                found = _CLIENTS[("fs",) + key] = _filesystem(self.store, self.path, self.options)
            return found

    # ------------------------------------------------------------ reading
    def exists(self, name: str = "") -> bool:
        """Whether ``name`` (a file or directory) exists."""
        if self.is_local:
            return os.path.exists(self._join(name))
        from pyarrow import fs

        return self.filesystem().get_file_info(self._join(name)).type != fs.FileType.NotFound

    def read(self, name: str) -> bytes:
        """The contents of the file ``name`` (FileNotFoundError if it does not exist)."""
        if self.is_local:
            with open(self._join(name), "rb") as handle:
                return handle.read()
        try:
            with self.filesystem().open_input_stream(self._join(name)) as stream:
                return stream.read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            if _not_found(exc):
                raise FileNotFoundError(errno.ENOENT, f"{self.file(name)} does not exist") from None
            raise

    def size(self, name: str) -> int:
        """The size of the file ``name`` in bytes."""
        if self.is_local:
            return os.path.getsize(self._join(name))
        info = self.filesystem().get_file_info(self._join(name))
        if info.size is None:
            raise FileNotFoundError(errno.ENOENT, f"{self.file(name)} does not exist")
        return info.size

    def list(self, name: str = "") -> list[str]:
        """The names directly under ``name`` (files and directories; empty if it does not exist)."""
        if self.is_local:
            try:
                return sorted(os.listdir(self._join(name)))
            except (FileNotFoundError, NotADirectoryError):
                return []
        from pyarrow import fs

        selector = fs.FileSelector(self._join(name), allow_not_found=True, recursive=False)
        return sorted(info.base_name for info in self.filesystem().get_file_info(selector))

    def walk_sizes(self, name: str = "") -> Iterator[tuple[str, int]]:
        """Every file under ``name``, recursively, with its size."""
        if self.is_local:
            for root, _, files in os.walk(self._join(name)):
                for file in files:
                    try:
                        yield os.path.join(root, file), os.path.getsize(os.path.join(root, file))
                    except OSError:
                        pass
            return
        from pyarrow import fs

        selector = fs.FileSelector(self._join(name), allow_not_found=True, recursive=True)
        for info in self.filesystem().get_file_info(selector):
            if info.type == fs.FileType.File:
                yield info.path, info.size

    # ------------------------------------------------------------ writing
    def makedirs(self, name: str = "") -> None:
        """Create the directory ``name`` and its parents (durably on a local disk); nothing on
        an object store, where directories are prefixes."""
        if self.is_local:
            path = self._join(name)
            if not os.path.isdir(path):
                os.makedirs(path, exist_ok=True)
                fsync_dir(os.path.dirname(path))
        elif self.store == "hdfs":
            self.filesystem().create_dir(self._join(name), recursive=True)

    def write(self, name: str, data: bytes) -> None:
        """Write the file ``name`` whole, replacing any: durable on return, and never seen
        half-written (locally a temporary file, fsync'd, renamed, the directory fsync'd;
        an object store's write is atomic)."""
        if self.is_local:
            write_atomic(self._join(name), data)
            return
        with self.filesystem().open_output_stream(self._join(name)) as stream:
            stream.write(data)

    @contextmanager
    def open_output(self, name: str) -> Iterator[Any]:
        """A stream writing the file ``name`` whole, seen only once the ``with`` block ends
        without error (locally a temporary file renamed into place, not fsync'd: for derived
        files such as index files, which a crash may lose)."""
        if self.is_local:
            from pyarrow import OSFile

            path = self._join(name)
            temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                with OSFile(temporary, "wb") as stream:
                    yield stream
                os.replace(temporary, path)
            finally:
                if os.path.exists(temporary):
                    os.remove(temporary)
            return
        with self.filesystem().open_output_stream(self._join(name)) as stream:
            yield stream

    def download(self, name: str, target: str) -> None:
        """Copy the file ``name`` to the local path ``target`` (written under a temporary name, then renamed)."""
        temporary = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with self.filesystem().open_input_stream(self._join(name)) as source, open(temporary, "wb") as out:
                while True:
                    chunk = source.read(1 << 22)
                    if not chunk:
                        break
                    out.write(chunk)
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)

    def create(self, name: str, data: bytes) -> bool:
        """Write the file ``name`` only if it does not exist yet (atomically and durably);
        returns False, writing nothing, if it does."""
        if self.is_local:
            return _create_local(self._join(name), data)
        return _create_remote(self, name, data)

    def remove(self, name: str) -> None:
        """Delete the file ``name`` (nothing if it does not exist)."""
        if self.is_local:
            try:
                os.remove(self._join(name))
            except FileNotFoundError:
                pass
            return
        try:
            self.filesystem().delete_file(self._join(name))
        except OSError as exc:
            if not _not_found(exc):
                raise

    def remove_tree(self, name: str = "") -> None:
        """Delete the directory ``name`` and everything under it (nothing if absent)."""
        if self.is_local:
            shutil.rmtree(self._join(name), ignore_errors=True)
            return
        try:
            self.filesystem().delete_dir(self._join(name))
        except OSError as exc:
            if not _not_found(exc):
                raise

    def lock(self) -> "DirectoryLock | ObjectLock":
        """Hold this location exclusively (:class:`StateLockedError` if another engine does):
        ``flock`` on ``LOCK`` for a local path, a leased ``LOCK`` object on a store."""
        return DirectoryLock(self.path) if self.is_local else ObjectLock(self)

    def sync(self, name: str = "") -> None:
        """Make the names in the directory ``name`` durable (files created, renamed or removed
        there): ``fsync`` of a local directory; nothing for a store, whose writes are."""
        if self.is_local:
            fsync_dir(self._join(name))


def _not_found(exc: OSError) -> bool:
    return isinstance(exc, FileNotFoundError) or "not found" in str(exc).lower() or "nosuchkey" in str(exc).lower() \
        or "does not exist" in str(exc).lower()


def _create_local(path: str, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.remove(path)
        raise
    os.close(fd)
    fsync_dir(os.path.dirname(path))
    return True


def _s3_endpoint(options: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The endpoint (host[:port]) and scheme S3 clients should use: the options', else ``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL`` from the environment (None: AWS itself)."""
    url = options.get("endpoint_url") or options.get("endpoint_override")
    if url is None:
        url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        return None, options.get("scheme")
    if "://" in url:
        parsed = urlparse(url)
        return parsed.netloc, options.get("scheme", parsed.scheme)
    return url, options.get("scheme")


def _filesystem(store: str, path: str, options: Mapping[str, Any]):
    from pyarrow import fs

    if store == "s3":
        settings = {k: v for k, v in options.items() if k not in ("endpoint_url",)}
        endpoint, scheme = _s3_endpoint(options)
        if endpoint:
            settings["endpoint_override"] = endpoint
        if scheme:
            settings["scheme"] = scheme
        settings.setdefault("region", os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                            or "us-east-1")
        return fs.S3FileSystem(**settings)
    if store == "gcs":
        return fs.GcsFileSystem(**options)
    if store == "azure":
        account = path.split("/")[0].split("@")[-1].split(".")[0]
        return fs.AzureFileSystem(**{"account_name": account, **options})
    return fs.HadoopFileSystem(**{"host": "default", **options})


def _create_remote(location: Location, name: str, data: bytes) -> bool:
    """Create-only write of ``name`` on a remote store (see the module docstring)."""
    bucket, _, key = location._join(name).partition("/")
    if location.store == "s3":
        client = _s3_client(location)
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except Exception as exc:  # noqa: BLE001 - botocore's ClientError, imported lazily
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
                return False
            raise
        return True
    if location.store == "gcs":
        from google.api_core.exceptions import PreconditionFailed
        from google.cloud import storage

        blob = storage.Client(**location.options.get("client_options", {})).bucket(bucket).blob(key)
        try:
            blob.upload_from_string(data, if_generation_match=0)
        except PreconditionFailed:
            return False
        return True
    if location.store == "azure":
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        account = location.options.get("account_name") or bucket.split("@")[-1]
        container = bucket.split("@")[0]
        service = BlobServiceClient(f"https://{account}.blob.core.windows.net",
                                    credential=location.options.get("account_key"))
        try:
            service.get_blob_client(container, key).upload_blob(data, overwrite=False)
        except ResourceExistsError:
            return False
        return True
    filesystem = location.filesystem()  # HDFS: a rename onto an existing name fails
    temporary = location._join(name) + f".{os.getpid()}.tmp"
    with filesystem.open_output_stream(temporary) as stream:
        stream.write(data)
    try:
        if filesystem.get_file_info(location._join(name)).size is not None:
            return False
        filesystem.move(temporary, location._join(name))
        return True
    finally:
        try:
            filesystem.delete_file(temporary)
        except OSError:
            pass


def _s3_client(location: Location):
    """A boto3 S3 client for ``location``'s options and environment (one per process)."""
    key = ("boto3", tuple(sorted(location.options.items())))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            try:
                import boto3
            except ImportError:
                raise StorageError(f"{location}: a state directory on S3 needs boto3 on the driver for its "
                                   "create-only log writes (pip install boto3)") from None
            options = location.options
            endpoint, scheme = _s3_endpoint(options)
            client = boto3.client(
                "s3", endpoint_url=f"{scheme or 'https'}://{endpoint}" if endpoint else None,
                aws_access_key_id=options.get("access_key"), aws_secret_access_key=options.get("secret_key"),
                aws_session_token=options.get("session_token"),
                region_name=options.get("region") or os.environ.get("AWS_REGION") or "us-east-1")
            _CLIENTS[key] = client
        return client


class ObjectLock:
    """An engine's hold on a location in an object store: a ``LOCK`` object created only if
    absent, naming its holder, and rewritten every ``lease / 3`` seconds while held.

    A second opener finds the object and is refused (:class:`StateLockedError` naming the
    holder) while the holder's last write is younger than ``lease`` seconds (held by a live
    engine); an older one was left by an engine that died, and is taken over. Object
    stores have no locks, so this rests on the hosts' clocks and on the holder writing in
    time; what makes two writers harmless even if it fails is the write-ahead log, whose
    objects are created only if absent (see :mod:`factflow.storage.wal`)."""

    NAME = "LOCK"

    def __init__(self, location: Location, lease: float | None = None):
        self.location = location
        self.lease = float(lease or os.environ.get("FACTFLOW_LOCK_LEASE", 60))
        self.owner = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid()}
        self._stop = threading.Event()
        if not location.create(self.NAME, self._document()):
            self._take_over_or_refuse()
        self._thread = threading.Thread(target=self._renew, name="factflow-lock", daemon=True)
        self._thread.start()

    def _document(self) -> bytes:
        return json.dumps(dict(self.owner, written=time.time())).encode()

    def _take_over_or_refuse(self) -> None:
        try:
            held = json.loads(self.location.read(self.NAME))
            age = time.time() - float(held["written"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            held, age = {}, float("inf")  # vanished or unreadable: nobody holds it properly
        if age < self.lease:
            raise StateLockedError(f"the state directory {self.location} is in use by another engine (process "
                                   f"{held.get('pid')} on {held.get('host')}, its lock renewed {age:.0f} s ago); "
                                   f"close it first (one engine per state directory; a lock not renewed for "
                                   f"{self.lease:.0f} s is taken over)")
        self.location.remove(self.NAME)
        if not self.location.create(self.NAME, self._document()):
            raise StateLockedError(f"the state directory {self.location} was taken by another engine just now")

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                self.location.write(self.NAME, self._document())
            except Exception:  # noqa: BLE001 - the next renewal tries again; the log fences writers
                pass

    def release(self) -> None:
        """Give the lock up (idempotent): stop renewing and remove the object if still ours."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        try:
            if json.loads(self.location.read(self.NAME)).get("owner") == self.owner["owner"]:
                self.location.remove(self.NAME)
        except (FileNotFoundError, ValueError):
            pass
