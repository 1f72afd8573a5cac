"""A durable engine's state directory: what is where, recovery, and the log and checkpoints written to it.

The directory is a :class:`~factflow.storage.location.Location`: a local path, a path every
machine shares, or an object store. Layout (docs/storage.md describes every file)::

    FORMAT                          sealed JSON: format name and version
    LOCK                            flock'd (or, on an object store, leased) by the engine that has it open
    wal/<segment>.log               the write-ahead log (:mod:`.wal`; on an object store one record each)
    wal/closed.json                 where the log ended when it was last closed cleanly
    wal/bulk-<epoch>/a<id>-part-<n>.parquet
                                    large changes of one epoch, referenced by its record
    checkpoints/<epoch>/a<id>-part-<n>.parquet
                                    each attribute's facts as of the checkpoint's epoch
    checkpoints/<epoch>/manifest.json
                                    sealed JSON, written last: catalog, offsets, files
    indexes/                        derived index files (:mod:`factflow.arrangement.index`),
                                    emptied at every open

:class:`StateStore` opens the directory (lock, format version, removal of what a crash
left half-written), reads it back (:meth:`StateStore.recover`: the newest checkpoint
whose files pass their checksums, falling back to older ones, plus the log after it),
appends log records, and writes checkpoints and removes what they make obsolete. It
knows files and records, not engines: :mod:`factflow.engine.durability` turns what it
reads into arrangements and what the engine does into records.
"""

from __future__ import annotations

import base64
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame

from factflow.errors import CorruptStateError, StateVersionError
from factflow.model.types import Kind
from factflow.storage.facts import from_ipc, to_ipc, verify, write_frame
from factflow.storage.files import sealed_json, unseal
from factflow.storage.location import Location
from factflow.storage.wal import FORMAT_VERSION, LogDamage, LogRecord, WriteAheadLog
from factflow.text import plural

__all__ = ["StateStore", "Recovered", "DroppedLog", "FactSource", "CheckpointFiles", "FORMAT_VERSION"]

log = logging.getLogger("factflow.storage")

_FORMAT_NAME = "factflow-state"
_CHECKPOINT = re.compile(r"^(\d{12})$")
_BULK = re.compile(r"^bulk-(\d{12})$")


@dataclass
class FactSource:
    """Rows ``(e, v, _diff)`` of one attribute read back from the directory: an Arrow table
    (from a log record) or Parquet files (their ``location`` and entries). Each source holds
    every ``(e, v)`` at most once (a checkpoint's facts, or one epoch's effective changes)."""

    rows: int
    table: pa.Table | None = None
    location: Location | None = None
    files: list[dict] = field(default_factory=list)


@dataclass
class Recovered:
    """What :meth:`StateStore.recover` read: the catalog, offsets and facts as of ``epoch``.

    ``attributes``: ``(name, type, semantics, settings)`` in id order (``settings``: the
    ``create_attribute`` keywords beyond those, e.g. ``index``, ``support`` and ``slack``; empty in
    directories written before them); ``rules``: registered rule
    texts in order; ``queries``: the definitions of durable queries by name, in install
    order (JSON objects, see :class:`factflow.engine.definition.QueryDefinition`); ``offsets``: per source the ``[offset, epoch]`` pairs retained;
    ``facts``: per attribute id, the sources whose rows sum to its facts (the checkpoint's
    files first, then the changes of every later epoch). ``checkpoint``: the epoch of the checkpoint
    used (None: the log from its start). ``refused``: damage found in newer checkpoints;
    ``torn``: what a torn log tail lost (never an acknowledged epoch); ``dropped``: what
    opening with ``accept_data_loss`` gave up at damaged log records (None when nothing
    was, see :class:`DroppedLog`). Event time:
    ``frontier`` (None: never logged) and ``pending``, the transactions buffered for open
    times as ``(time, offsets, operations table)`` in arrival order. ``unconfirmed``: the
    last record of the log when it is a guessed epoch's (see :meth:`StateStore.log_epoch`)
    as ``(epoch, offsets, operations table)``, not replayed: the engine applies those
    operations again as that epoch (``epoch`` stays the one before it).
    """

    epoch: int = 0
    attributes: list[tuple[str, str, str, dict]] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    queries: dict[str, dict] = field(default_factory=dict)
    offsets: dict[str, list[list[int]]] = field(default_factory=dict)
    facts: dict[int, list[FactSource]] = field(default_factory=dict)
    checkpoint: int | None = None
    log_records: int = 0
    log_epochs: int = 0
    refused: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    dropped: "DroppedLog | None" = None
    frontier: int | None = None
    pending: list[tuple[int, dict[str, int], pa.Table]] = field(default_factory=list)
    unconfirmed: tuple[int, dict[str, int], pa.Table] | None = None


@dataclass
class DroppedLog:
    """What accepting damage in the log gave up: the damage (``damage``, naming the file
    and byte offset), the last epoch kept, the acknowledged epochs dropped that the log
    still shows (``epochs``: those of the records readable beyond the damage and that of
    the damaged record, when a later record names it), the last epoch dropped
    (``last_epoch``; from the clean close marker when the log was cut short; None if
    unknown), how many records of other kinds (attributes, rules, durable query
    definitions, event-time buffers) went with them, and all of it in words."""

    damage: str
    kept_epoch: int
    epochs: list[int]
    last_epoch: int | None
    other_records: int
    description: str


@dataclass
class CheckpointFiles:
    """One attribute's facts in a checkpoint being written: its kind, and a function that
    writes its files into a location (with a name prefix) and returns their entries."""

    kind: Kind
    write: Callable[[Location, str], list[dict]]


class StateStore:
    """The state directory of one durable engine, opened exclusively."""

    def __init__(self, where: str | Location, storage_options: dict | None = None):
        self.location = where if isinstance(where, Location) else Location(where, storage_options)
        self.directory = self.location.uri
        self.location.makedirs()
        self._lock = self.location.lock()
        try:
            self._check_format()
            self.wal = WriteAheadLog(self.location.child("wal"))
            self.checkpoints = self.location.child("checkpoints")
            self.checkpoints.makedirs()
            self.location.sync()  # the names of wal/ and checkpoints/ are durable too
            self.location.remove_tree("indexes")
            self._remove_unfinished()
        except BaseException:
            self._lock.release()
            raise
        self.good: list[tuple[int, int]] = []  # (epoch, log segment) of the checkpoints known valid, oldest first

    # ------------------------------------------------------------ opening
    def _check_format(self) -> None:
        path = self.location.file("FORMAT")
        try:
            data = self.location.read("FORMAT")
        except FileNotFoundError:
            if self.location.list("wal"):
                raise CorruptStateError(f"{path} is missing, but {self.directory} holds a write-ahead log") from None
            self.location.write("FORMAT", sealed_json({"format": _FORMAT_NAME, "version": FORMAT_VERSION}))
            return
        body = unseal(data, path)
        if body.get("format") != _FORMAT_NAME:
            raise CorruptStateError(f"{path} does not describe a factflow state directory")
        _check_version(path, body)

    def _remove_unfinished(self) -> None:
        """Delete what a crash left half-written: checkpoints without a manifest, temporary files."""
        for name in self.checkpoints.list():
            if _CHECKPOINT.match(name) and not self.checkpoints.exists(f"{name}/manifest.json"):
                self.checkpoints.remove_tree(name)
            elif _CHECKPOINT.match(name):
                _remove_temporary(self.checkpoints.child(name))
            elif name.endswith(".tmp"):
                self.checkpoints.remove(name)
        _remove_temporary(self.wal.location)
        for name in self.wal.location.list():
            if _BULK.match(name):
                _remove_temporary(self.wal.location.child(name))

    # ------------------------------------------------------------ recovery
    def recover(self, accept_data_loss: bool = False) -> Recovered:
        """Read the state back: the newest checkpoint that passes its checksums (older ones
        when it does not, each refusal logged and listed) and the log after it, whose torn
        tail is cut off; then open the log for appending.

        Damage in the log (acknowledged records that cannot be read, see
        :mod:`factflow.storage.wal`) raises :class:`CorruptStateError` naming the file, the
        byte offset and the acknowledged epochs beyond it, and changes nothing; with
        ``accept_data_loss`` the log is cut there instead and ``Recovered.dropped`` says
        what was given up."""
        out = Recovered()
        first_segment = 1
        for epoch in sorted(self._checkpoint_epochs(), reverse=True):
            path = self._checkpoint(epoch)
            try:
                manifest = self._read_manifest(path)
            except CorruptStateError as exc:
                message = f"checkpoint {epoch} refused: {exc}"
                log.error("%s; falling back to an older checkpoint and the log", message)
                out.refused.append(message)
                continue
            out.epoch = out.checkpoint = manifest["epoch"]
            out.attributes = [(a[0], a[1], a[2], dict(a[3]) if len(a) > 3 else {}) for a in manifest["attributes"]]
            out.rules = list(manifest["rules"])
            out.queries = {q["name"]: q for q in manifest.get("queries", [])}  # absent before durable queries
            out.offsets = {s: [list(p) for p in pairs] for s, pairs in manifest["offsets"].items()}
            for entry in manifest["facts"]:
                if entry["rows"]:
                    out.facts[entry["attribute"]] = [FactSource(entry["rows"], location=path, files=entry["files"])]
            out.frontier = manifest.get("frontier")
            out.pending = [(p["time"], p["offsets"], from_ipc(base64.b64decode(p["ops"])))
                           for p in manifest.get("pending", [])]
            first_segment = manifest["log_segment"]
            self.good = [(out.epoch, first_segment)]
            break
        try:
            self._replay_log(first_segment, out, accept_data_loss)
        except CorruptStateError as exc:
            if out.refused:
                raise CorruptStateError(f"{exc}; and no checkpoint to fall back to: {'; '.join(out.refused)}") from None
            raise
        self.wal.open_for_append(first_segment)
        out.torn = list(self.wal.torn)
        self._remove_bulk(lambda epoch: epoch > out.epoch)  # written for epochs never logged
        return out

    def _replay_log(self, first_segment: int, out: Recovered, accept_data_loss: bool) -> None:
        """Replay the log from ``first_segment`` into ``out``; damage is refused, or with
        ``accept_data_loss`` cut off and described in ``out.dropped``.

        An epoch's record is held until the next one says what became of it: a ``void``
        record of its epoch drops it (the epoch failed after its record was written), an
        epoch record of the same epoch replaces it (a guessed epoch computed again), any
        other record confirms it. A guessed epoch's record that nothing follows is not
        replayed but handed back as ``out.unconfirmed``."""
        held: tuple[int, int, LogRecord] | None = None

        def settle(confirmed: bool) -> None:
            nonlocal held
            if held is None:
                return
            segment, offset, record = held
            held = None
            if confirmed or not record.meta.get("guessed"):
                self._replay_at(segment, offset, record, out)
                return
            out.log_records += 1
            meta = record.meta
            out.unconfirmed = (meta["epoch"], meta.get("offsets", {}), from_ipc(record.blobs[meta["ops"]]))
            out.pending = [p for p in out.pending if p[0] > meta["epoch"]]  # applied by it again

        try:
            for segment, offset, record in self.wal.scan(first_segment, skip_damaged_marker=accept_data_loss):
                kind, epoch = record.meta.get("type"), record.meta.get("epoch")
                follows_held = held is not None and held[2].meta["epoch"] == epoch
                if kind == "void":
                    if not follows_held:
                        raise LogDamage(self.wal.path(segment), segment, offset,
                                        f"a void record of epoch {epoch} follows no record of it",
                                        self.wal.records_after(segment, offset))
                    out.log_records += 2  # the record it voids, and itself
                    held = None
                    continue
                if kind == "epoch" and follows_held:
                    out.log_records += 1  # the record it replaces
                    held = None
                settle(True)
                if kind == "epoch":
                    held = (segment, offset, record)
                else:
                    self._replay_at(segment, offset, record, out)
            settle(False)
        except LogDamage as damage:
            settle(False)
            dropped = _dropped(damage, out)
            if not accept_data_loss:
                raise CorruptStateError(
                    f"{damage}: {dropped.description}. Nothing was changed. To open the directory anyway, "
                    f"giving that up, open it with Engine(state_dir=..., accept_data_loss=True) or run "
                    f"'factflow repair {self.directory}'") from None
            self.wal.truncate(damage.segment, damage.offset)
            log.error("write-ahead log cut at damage, as accept_data_loss asked: %s: %s", damage, dropped.description)
            out.dropped = dropped

    def _replay_at(self, segment: int, offset: int, record: LogRecord, out: Recovered) -> None:
        """Replay one record read at ``offset`` of ``segment``; one that reads but cannot be
        applied is damage there."""
        path = self.wal.path(segment)
        try:
            self._replay(record, out, path)
        except CorruptStateError as exc:
            raise LogDamage(path, segment, offset, f"a record that cannot be replayed ({exc})",
                            self.wal.records_after(segment, offset)) from None

    def _read_manifest(self, checkpoint: Location) -> dict:
        manifest_path = checkpoint.file("manifest.json")
        try:
            manifest = unseal(checkpoint.read("manifest.json"), manifest_path)
        except FileNotFoundError:
            raise CorruptStateError(f"{manifest_path} is missing") from None
        _check_version(manifest_path, manifest)
        for entry in manifest["facts"]:
            for f in entry["files"]:
                verify(checkpoint, f["name"], f["size"], f["crc32"])
        return manifest

    def _replay(self, record: LogRecord, out: Recovered, segment: str) -> None:
        meta = record.meta
        kind = meta.get("type")
        out.log_records += 1
        if kind == "attribute":
            if meta["id"] != len(out.attributes):
                raise CorruptStateError(f"{segment} defines attribute {meta['name']} with id {meta['id']}, "
                                        f"expected {len(out.attributes)}")
            out.attributes.append((meta["name"], meta["value_type"], meta["semantics"], meta.get("settings", {})))
        elif kind == "rules":
            out.rules.append(meta["text"])
        elif kind == "query":
            out.queries[meta["query"]["name"]] = meta["query"]
        elif kind == "query-dropped":
            out.queries.pop(meta["name"], None)
        elif kind == "epoch":
            epoch = meta["epoch"]
            if meta.get("after", epoch - 1) != out.epoch or epoch <= out.epoch:
                raise CorruptStateError(f"{segment} holds epoch {epoch} after epoch {out.epoch}")
            out.pending = [p for p in out.pending if p[0] > epoch]  # applied by this epoch
            for change in meta["changes"]:
                aid = change["attribute"]
                if "blob" in change:
                    source = FactSource(change["rows"], table=from_ipc(record.blobs[change["blob"]]))
                else:
                    directory = self.wal.location.child(change["dir"])
                    for f in change["files"]:
                        verify(directory, f["name"], f["size"], f["crc32"])
                    source = FactSource(change["rows"], location=directory, files=change["files"])
                out.facts.setdefault(aid, []).append(source)
            for source, offset in meta.get("offsets", {}).items():
                out.offsets.setdefault(source, []).append([offset, epoch])
            out.epoch = epoch
            out.log_epochs += 1
        elif kind == "pending":
            out.pending.append((meta["time"], meta["offsets"], from_ipc(record.blobs[0])))
            for source, offset in meta["offsets"].items():
                out.offsets.setdefault(source, []).append([offset, meta["time"]])
        elif kind == "frontier":
            out.frontier = max(out.frontier or 0, meta["frontier"])
        else:
            raise CorruptStateError(f"{segment} holds a record of unknown type {kind!r}")

    # ------------------------------------------------------------ the log
    def log_attribute(self, id: int, name: str, value_type: str, semantics: str,
                      settings: dict[str, str] | None = None) -> None:
        """Log a new attribute (durable on return); ``settings`` are its further
        ``create_attribute`` keywords (an optional field: older records have none)."""
        self.wal.append(LogRecord({"type": "attribute", "id": id, "name": name, "value_type": value_type,
                                   "semantics": semantics, "settings": dict(settings or {})}))
    def log_pending(self, time: int, offsets: dict[str, int], ops: pa.Table) -> None:
        """Log a transaction buffered for the open event ``time`` (durable on return)."""
        self.wal.append(LogRecord({"type": "pending", "time": time, "offsets": offsets}, [to_ipc(ops)]))

    def log_frontier(self, frontier: int) -> None:
        """Log that every event time before ``frontier`` is closed (durable on return)."""
        self.wal.append(LogRecord({"type": "frontier", "frontier": frontier}))

    def log_rules(self, text: str) -> None:
        """Log registered rules (durable on return)."""
        self.wal.append(LogRecord({"type": "rules", "text": text}))

    def log_query(self, definition: dict) -> None:
        """Log a durable query's definition (durable on return)."""
        self.wal.append(LogRecord({"type": "query", "query": definition}))

    def log_query_dropped(self, name: str) -> None:
        """Log that the durable query ``name`` was closed for good (durable on return)."""
        self.wal.append(LogRecord({"type": "query-dropped", "name": name}))

    def log_epoch(self, epoch: int, offsets: dict[str, int], small: Sequence[tuple[int, pa.Table]],
                  large: Sequence[tuple[int, Kind, DataFrame, int]], after: int | None = None,
                  guessed: pa.Table | None = None) -> None:
        """Log an epoch (durable on return): its offsets, its small changes per attribute id
        as Arrow tables inside the record, its large ones (Spark frames with their row
        counts) as Parquet files under ``wal/bulk-<epoch>`` written first. ``after``: the
        epoch before it, when that is not ``epoch - 1`` (event time).

        The record may be written while the epoch still computes, so the epoch may yet fail
        (:meth:`log_void` follows then) or, when its changes are a guess (``guessed``: the
        transaction's operations, kept in the record), be computed again (its record
        follows and replaces this one). A guessed record that nothing follows is not
        trusted at recovery: its operations are applied again (``Recovered.unconfirmed``)."""
        changes: list[dict] = []
        blobs: list[bytes] = []
        for aid, table in small:
            changes.append({"attribute": aid, "rows": table.num_rows, "blob": len(blobs)})
            blobs.append(to_ipc(table))
        if large:
            name = f"bulk-{epoch:012d}"
            directory = self.wal.location.child(name)
            directory.remove_tree()
            for aid, kind, frame, rows in large:
                files = write_frame(frame, directory, f"a{aid}-", kind)
                changes.append({"attribute": aid, "rows": rows, "dir": name, "files": files})
                self.wal.bytes_since_rotation += sum(f["size"] for f in files)
            self.wal.location.sync()
        meta = {"type": "epoch", "epoch": epoch, "offsets": offsets, "changes": changes}
        if after is not None:
            meta["after"] = after
        if guessed is not None:
            meta.update(guessed=True, ops=len(blobs))
            blobs.append(to_ipc(guessed))
        self.wal.append(LogRecord(meta, blobs))

    def log_void(self, epoch: int) -> None:
        """Log that ``epoch``, whose record was just written, failed and is not part of the
        state (durable on return)."""
        self.wal.append(LogRecord({"type": "void", "epoch": epoch}))

    # ------------------------------------------------------------ checkpoints
    def begin_checkpoint(self) -> int:
        """Start a new log segment for the records after the checkpoint about to be taken; returns it."""
        return self.wal.rotate()

    def write_checkpoint(self, epoch: int, log_segment: int, attributes: list[tuple[str, str, str, dict]],
                         rules: list[str], queries: list[dict], offsets: dict[str, list[list[int]]],
                         facts: dict[int, CheckpointFiles], frontier: int | None = None,
                         pending: Sequence[tuple[int, dict[str, int], pa.Table]] = ()) -> dict:
        """Write the checkpoint of ``epoch`` (files, checked by reading them back, then the
        manifest), then remove what it makes obsolete: checkpoints other than this one and
        the previous valid one, log segments before the previous one's, and the bulk files
        they referenced. Returns the manifest. Safe to run beside epochs being logged.
        An event-time engine's ``frontier`` and ``pending`` transactions go into the manifest."""
        path = self._checkpoint(epoch)
        path.remove_tree()
        path.makedirs()
        entries = []
        for aid in sorted(facts):
            files = facts[aid].write(path, f"a{aid}-")
            entries.append({"attribute": aid, "rows": sum(f["rows"] for f in files), "files": files})
        path.sync()
        for entry in entries:
            for f in entry["files"]:
                verify(path, f["name"], f["size"], f["crc32"])
        manifest = {"format": _FORMAT_NAME, "version": FORMAT_VERSION, "epoch": epoch, "log_segment": log_segment,
                    "written": time.time(), "attributes": [list(a) for a in attributes], "rules": list(rules),
                    "queries": list(queries), "offsets": offsets, "facts": entries}
        if frontier is not None:
            manifest["frontier"] = frontier
            manifest["pending"] = [{"time": t, "offsets": o, "ops": base64.b64encode(to_ipc(table)).decode()}
                                   for t, o, table in pending]
        path.write("manifest.json", sealed_json(manifest))
        self.checkpoints.sync()
        unseal(path.read("manifest.json"), path.file("manifest.json"))
        self.good = (self.good + [(epoch, log_segment)])[-2:]
        self._remove_obsolete()
        return manifest

    def _remove_obsolete(self) -> None:
        keep = {epoch for epoch, _ in self.good}
        for epoch in self._checkpoint_epochs():
            if epoch not in keep:  # the manifest first: a half-removed checkpoint is an unfinished one
                self._checkpoint(epoch).remove("manifest.json")
                self._checkpoint(epoch).remove_tree()
        if len(self.good) == 2:  # with one, the previous state is the empty one: the whole log stays
            oldest_epoch, oldest_segment = self.good[0]
            self.wal.remove_before(oldest_segment)
            self._remove_bulk(lambda epoch: epoch <= oldest_epoch)
        self.checkpoints.sync()

    def _remove_bulk(self, obsolete: Callable[[int], bool]) -> None:
        removed = False
        for name in self.wal.location.list():
            match = _BULK.match(name)
            if match and obsolete(int(match.group(1))):
                self.wal.location.remove_tree(name)
                removed = True
        if removed:
            self.wal.location.sync()

    def _checkpoint_epochs(self) -> list[int]:
        return sorted(int(m.group(1)) for m in map(_CHECKPOINT.match, self.checkpoints.list())
                      if m and self.checkpoints.exists(f"{m.group(0)}/manifest.json"))

    def _checkpoint(self, epoch: int) -> Location:
        return self.checkpoints.child(f"{epoch:012d}")

    # ------------------------------------------------------------ sizes and closing
    def sizes(self) -> dict[str, int]:
        """Bytes stored: ``log`` (segments and bulk files), ``checkpoints``."""
        return {"log": sum(size for _, size in self.wal.location.walk_sizes()),
                "checkpoints": sum(size for _, size in self.checkpoints.walk_sizes())}

    def close(self, epoch: int | None = None) -> None:
        """Close the log (recording, for a clean close, that it ends with ``epoch``) and give up the lock."""
        try:
            self.wal.close(None if epoch is None else {"epoch": epoch})
        finally:
            self._lock.release()


def _dropped(damage: LogDamage, out: Recovered) -> DroppedLog:
    """What giving up the log from ``damage`` on loses, given the state ``out`` replayed before it."""
    epochs, other, previous = [], 0, None
    for meta in damage.beyond:
        if meta.get("type") == "void":
            if epochs and epochs[-1] == meta.get("epoch"):
                epochs.pop()
        elif meta.get("type") == "epoch":
            if epochs and epochs[-1] == meta["epoch"]:
                continue  # a guessed epoch's record replaced
            epochs.append(meta["epoch"])
            if previous is None:
                previous = meta.get("after", meta["epoch"] - 1)
        else:
            other += 1
    if previous is not None and previous > out.epoch:
        epochs.insert(0, previous)  # the epoch the damaged record held
    closed = (damage.closed or {}).get("epoch")
    last = epochs[-1] if epochs else None
    if isinstance(closed, int) and closed > out.epoch and not epochs:  # a log cut short after a clean close
        last = closed
        description = (f"the engine that closed the log had logged up to epoch {closed}; the state before the cut "
                       f"ends at epoch {out.epoch}, so the acknowledged epochs after it up to {closed} are missing")
    elif epochs:
        span = f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]} to {epochs[-1]}"
        if len(epochs) > 1 and epochs[-1] - epochs[0] + 1 != len(epochs):
            span += f" ({', '.join(map(str, epochs))})"
        description = f"acknowledged {span} lie beyond it; the state before it ends at epoch {out.epoch}"
    else:
        description = (f"no readable record lies beyond it; the state before it ends at epoch {out.epoch}, and the "
                       "damaged record itself was acknowledged")
    if other:
        description += f" ({plural(other, 'other record')} too: attributes, rules, queries or buffered transactions)"
    return DroppedLog(str(damage), out.epoch, epochs, last, other, description)


def _check_version(path: str, body: dict) -> None:
    version = body.get("version")
    if not isinstance(version, int):
        raise CorruptStateError(f"{path} has no format version")
    if version > FORMAT_VERSION:
        raise StateVersionError(f"{path} was written in storage format version {version}, newer than this "
                                f"factflow reads ({FORMAT_VERSION}); open it with a newer factflow")


def _remove_temporary(directory: Location) -> None:
    """Delete the ``*.tmp`` files in ``directory`` (written, never renamed into place)."""
    for name in directory.list():
        if name.endswith(".tmp"):
            directory.remove(name)
