"""Durable engines: the write-ahead log of every change, background checkpoints, recovery.

``Engine(state_dir=PATH)`` keeps its state in ``PATH`` (:mod:`factflow.storage` writes the
files; docs/storage.md describes them). What is logged is what the arrangements need and
nothing else:

* *catalog records*, written before ``create_attribute`` or ``register`` returns: a new
  attribute with its type, semantics and settings (``index``, ``support``), the EDN text
  of rules that added something;
* one *epoch record* per committed epoch, written before it commits (so before any
  subscriber, and before ``transact`` returns): the epoch's **effective changes** per
  attribute (what it appended to each forward index, after validation and set/one/raw
  semantics), and the offsets it applied per source. Replaying effective changes is
  deterministic and needs no validation. Small changes travel inside the record as Arrow
  IPC, and the record is written by a thread of its own while the epoch's queries are
  evaluated (on an object store a PUT, on a disk an ``fdatasync``: either would otherwise
  add its latency to every small epoch); large ones (a stored batch) are written as
  Parquet files by Spark tasks after the queries, and the record references them with
  checksums. An epoch whose record cannot be written is rolled back, so every
  acknowledged epoch is in the log. An epoch that fails after its record was written is
  followed by a *void record*. A small epoch whose changes are guessed
  (:mod:`factflow.engine.speculation`) logs the guess with the transaction's operations:
  a wrong guess computes the epoch again, and its record replaces the guessed one; a
  guessed record that is the last of the log (the process died before the guess was
  checked) is not trusted, and opening the directory applies its operations again as that
  epoch (``RecoveryReport.unconfirmed``). The facts of
  reserved (introspection) attributes are neither logged nor checkpointed: they describe
  the process that made them (:mod:`factflow.engine.introspection`).
* in event time (:mod:`factflow.engine.clock`), a *pending record* per transaction
  buffered for an open time (its checked operations as Arrow IPC, its time and offsets),
  written before ``transact`` returns, and a *frontier record* when ``advance_to`` moves
  the frontier past the last time it applied. Recovery buffers again the pending
  transactions no later epoch record applied (an epoch applies every time up to its own).

A *checkpoint* is every attribute's facts as of an epoch ``E`` (the forward index
consolidated: each fact once, with its multiplicity), the catalog and the offsets. It
is taken after an epoch's delivery and the start of its maintenance (see
:mod:`factflow.engine.maintenance`), once
``EngineConfig.checkpoint_interval`` epochs or ``checkpoint_log_bytes`` of log have
accumulated: under the engine lock the log moves to a new segment and the forward
batches as of ``E`` are pinned (:meth:`factflow.arrangement.batch.Batch.pin`: merges may
retire them meanwhile, their rows stay readable); a background thread then consolidates
and writes them (Spark for stored batches, pyarrow on the driver for small ones),
verifies the files, writes the manifest atomically, and removes what is obsolete: the
checkpoints other than this one and the previous one, and the log before the previous
one (so a checkpoint that fails its checksums later still has a predecessor and the log
after it). Epochs continue meanwhile.

Recovery reads the newest checkpoint that passes its checksums and the log after it,
sums every attribute's checkpointed facts and logged changes into one consolidated batch
as of the last logged epoch (:meth:`factflow.arrangement.attribute.AttributeArrangement.load`;
a Spark job for large attributes, the driver for small ones), recreates attributes and
rules in their order, and sets the epoch counter and the offsets. Queries installed
afterwards read those arrangements like any others; the reverse and count indexes are
built from them when first needed, and index files are written again.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Callable

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from factflow.arrangement.attribute import AttributeArrangement
from factflow.arrangement.batch import DIFF, Batch
from factflow.engine.clock import Buffered
from factflow.engine.definition import QueryDefinition
from factflow.engine.history import History
from factflow.engine.session import label_jobs
from factflow.engine.transaction import SLOT, WideOps
from factflow.errors import StorageError
from factflow.lang.rules import RuleStore
from factflow.model.frames import consolidated, spark_frame
from factflow.model.schema import Attribute
from factflow.model.types import Kind, spark_type
from factflow.storage.facts import (
    as_pandas, facts_schema, from_pandas, read_frame, read_tables, write_frame, write_table,
)
from factflow.storage.location import Location
from factflow.storage.store import CheckpointFiles, DroppedLog, FactSource, StateStore
from factflow.text import plural

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.config import EngineConfig
    from factflow.engine.state import EngineState

__all__ = ["Durability", "RecoveryReport", "CheckpointReport", "LogWrite"]

log = logging.getLogger("factflow.engine")


@dataclass
class RecoveryReport:
    """What opening a state directory found: the epoch recovered, the checkpoint it started
    from (None: the log from its start) and the log records and epochs replayed after it,
    checkpoints refused for damage (each message names the file; also durable queries that
    could not be installed again), torn log tails cut off, the seconds it took (``phases``:
    reading files, loading arrangements), the durable queries installed again, and what
    opening with ``accept_data_loss=True`` gave up at damage in the log (``dropped``: the
    damage, the last epoch kept, the acknowledged epochs dropped; None when nothing was),
    and what became of a guessed epoch's record the log ended with (``unconfirmed``, see
    the module docstring; None when it ended otherwise)."""

    epoch: int
    checkpoint: int | None
    log_records: int
    log_epochs: int
    facts: int
    refused: list[str]
    torn: list[str]
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)
    dropped: DroppedLog | None = None
    unconfirmed: str | None = None


@dataclass
class CheckpointReport:
    """One checkpoint written: its epoch, facts, files and bytes, and seconds (``pause``:
    under the engine lock; ``seconds``: in all)."""

    epoch: int
    facts: int
    files: int
    bytes: int
    seconds: float
    pause: float


class LogWrite:
    """An epoch's record on its way to the log (:meth:`Durability.log_epoch`): written by
    the log's thread while the epoch computes, or, for large changes, when waited for."""

    def __init__(self, durability: "Durability", epoch: int, future: Future | None = None,
                 write: Callable[[], None] | None = None):
        self._durability, self._epoch, self._future, self._write = durability, epoch, future, write
        self._done = False

    def wait(self) -> None:
        """Return once the record is durable; raise what writing it raised."""
        if self._future is not None:
            self._future.result()
        elif self._write is not None:
            write, self._write = self._write, None
            write()
        if not self._done:
            self._done = True
            self._durability.epochs_logged += 1

    def settle(self) -> None:
        """Wait for a record the epoch's next record replaces, whatever became of it (a
        failure to write it surfaces when the next one is written)."""
        if self._future is not None:
            self._future.exception()

    def void(self) -> None:
        """The epoch failed: once its record is written (if it ever is), log that it is
        void. A failure to do so is logged; the log then refuses further records."""
        if self._future is None or self._future.exception() is not None:
            return  # nothing was written (or the failure left no record)
        wal = self._durability.store.wal
        try:
            self._durability.store.log_void(self._epoch)
        except Exception as exc:  # the epoch's own failure is what the caller raises
            wal.failed = wal.failed or exc  # a record after it would confirm the failed epoch
            log.exception("could not log that epoch %d failed; its record stays in the log", self._epoch)


@dataclass
class _Snapshot:
    epoch: int
    segment: int
    attributes: list[tuple[str, str, str, dict[str, object]]]
    rules: list[str]
    queries: list[dict]
    offsets: dict[str, list[list[int]]]
    batches: dict[int, tuple[Kind, list[Batch]]]
    pause: float = 0.0
    logged: int = 0
    frontier: int | None = None
    pending: list[tuple[int, dict[str, int], pa.Table]] = field(default_factory=list)


class Durability:
    """The state directory of one engine: its log, its checkpoints, its recovery."""

    def __init__(self, store: StateStore, state: "EngineState", rules: RuleStore, config: "EngineConfig",
                 engine_id: int):
        self.store = store
        self.state = state
        self.rules = rules
        self.config = config
        self._group = f"factflow-{engine_id}-checkpoint"
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()  # clear while a checkpoint is being written
        self._idle.set()
        self.checkpointed = 0  # the epoch of the newest checkpoint (0: none)
        self.last_checkpoint: CheckpointReport | None = None
        self.last_error: BaseException | None = None
        self.recovery: RecoveryReport | None = None
        self.recovered_queries: list[QueryDefinition] = []
        self.epochs_logged = 0  # epoch records written or replayed since opening (event times are not consecutive)
        self._log_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"factflow-{engine_id}-log")
        #: a guessed epoch the log ended with, to apply again: (epoch, offsets, operations)
        self.unconfirmed: tuple[int, dict[str, int], WideOps] | None = None
        self._epochs_checkpointed = 0  # epochs_logged when the newest checkpoint's snapshot was taken

    # ------------------------------------------------------------ opening
    @classmethod
    def open(cls, directory: Location, state: "EngineState", rules: RuleStore, config: "EngineConfig",
             engine_id: int, accept_data_loss: bool = False) -> "Durability":
        """Open ``directory`` (exclusively) and recover its state into ``state`` and ``rules``;
        damage in the log is refused unless ``accept_data_loss`` (see :meth:`StateStore.recover`)."""
        started = time.perf_counter()
        store = StateStore(directory)
        try:
            recovered = store.recover(accept_data_loss)
            read = time.perf_counter() - started
            durability = cls(store, state, rules, config, engine_id)
            for name, value_type, semantics, settings in recovered.attributes:
                state.schema.create(name, value_type, semantics, reserved=True, **settings)
            for text in recovered.rules:
                rules.restore(text)
            state.offsets.load(recovered.offsets)
            state.epoch = recovered.epoch
            state.history = History(recovered.epoch)
            durability._restore_clock(recovered.frontier, recovered.pending)
            if recovered.unconfirmed is not None:
                epoch, offsets, ops = recovered.unconfirmed
                durability.unconfirmed = (epoch, offsets, _ops_from_table(ops, state.schema))
            durability.epochs_logged = recovered.log_epochs
            mark = time.perf_counter()
            facts = 0
            for attribute in state.schema:
                state.arrange(attribute)
                sources = recovered.facts.get(attribute.id)
                if sources:
                    facts += durability._load(state.arrangement_of(attribute), sources, recovered.epoch)
        except BaseException:
            store.close()
            raise
        durability.checkpointed = recovered.checkpoint or 0
        durability.recovered_queries = [QueryDefinition.from_json(q) for q in recovered.queries.values()]
        durability.recovery = RecoveryReport(
            recovered.epoch, recovered.checkpoint, recovered.log_records, recovered.log_epochs, facts,
            recovered.refused, recovered.torn, time.perf_counter() - started,
            {"read": round(read, 4), "load": round(time.perf_counter() - mark, 4)}, dropped=recovered.dropped)
        if recovered.epoch or recovered.attributes:
            log.info("recovered %s: epoch %d from checkpoint %s and %d log records (%d facts, %.2fs)", directory,
                     recovered.epoch, recovered.checkpoint, recovered.log_records, facts,
                     durability.recovery.seconds)
        return durability

    def _restore_clock(self, frontier: int | None, pending: list[tuple[int, dict[str, int], pa.Table]]) -> None:
        """Give an event-time engine its frontier and buffered transactions back; a
        transaction-time engine refuses a directory holding buffered transactions."""
        clock = self.state.clock
        if clock is None:
            if pending:
                raise StorageError(f"{self.store.directory} holds {plural(len(pending), 'transaction')} buffered for open event "
                                   "times: open it with Engine(time='event', state_dir=...)")
            return
        clock.frontier = max(frontier or 1, self.state.epoch + 1)
        for time_, offsets, table in pending:
            clock.add(time_, Buffered(_ops_from_table(table, self.state.schema), offsets))

    def _load(self, arrangement: AttributeArrangement, sources: list[FactSource], epoch: int) -> int:
        """Load an attribute's facts, the sum of ``sources``, into its new arrangement; returns their rows."""
        kind = arrangement.attribute.kind
        rows = sum(s.rows for s in sources)
        unique = len(sources) == 1  # one source holds each (e, v) once
        spark = self.state.spark
        if rows <= self.config.local_limit:
            tables = [s.table if s.table is not None else read_tables(s.location, s.files, kind) for s in sources]
            frame = as_pandas(pa.concat_tables(tables))
            if not unique:
                frame = consolidated(frame, ["e", "v"], DIFF)
            arrangement.load(frame, epoch)
            return len(frame)
        frames = [read_frame(spark, s.location, s.files, kind) for s in sources if s.table is None]
        inline = [s.table for s in sources if s.table is not None]
        if inline:
            frames.append(spark_frame(spark, as_pandas(pa.concat_tables(inline)), _facts_struct(kind)))
        facts = reduce(DataFrame.unionAll, frames)
        if not unique:
            facts = facts.groupBy("e", "v").agg(F.sum(DIFF).alias(DIFF)).where(F.col(DIFF) != 0)
        spark.sparkContext.setJobDescription(f"recover {arrangement.attribute.name}")
        arrangement.load(facts, epoch)
        if arrangement.policy.directory is not None:
            arrangement.forward.index_stored()
        return arrangement.forward.tuples

    # ------------------------------------------------------------ the log
    def log_attribute(self, attribute: Attribute) -> None:
        """Log a new attribute (before it is added)."""
        self.store.log_attribute(attribute.id, str.__str__(attribute.name), attribute.value_type, attribute.semantics,
                                 attribute.settings)

    def log_rules(self, text: str) -> None:
        """Log rules that add something (before they are stored)."""
        self.store.log_rules(text)

    def log_query(self, definition: QueryDefinition) -> None:
        """Log a durable query's definition (after it installed, before ``query`` returns)."""
        self.store.log_query(definition.to_json())

    def log_query_dropped(self, name: str) -> None:
        """Log that a durable query was closed by its user."""
        self.store.log_query_dropped(name)

    def log_pending(self, time_: int, ops: WideOps, offsets: dict[str, int]) -> None:
        """Log a transaction buffered for the open event time ``time_`` (before it is buffered)."""
        self.store.log_pending(time_, offsets, _ops_table(ops))

    def log_frontier(self, frontier: int) -> None:
        """Log the event-time frontier (before it moves)."""
        self.store.log_frontier(frontier)

    def log_epoch(self, epoch: int, changed: dict[int, int], offsets: dict[str, int],
                  guessed: WideOps | None = None) -> LogWrite:
        """Start logging ``epoch`` before it commits: the batch it appended to each changed
        attribute's forward index (inside the record when held on the driver, as Parquet
        files when stored in Spark), its offsets (and, when the epoch before it is not
        ``epoch - 1``, that epoch) and, when its changes are a guess, the ``guessed``
        transaction's operations. A record of driver-held changes is written by the log's
        thread from now on; one with stored changes when :meth:`LogWrite.wait` is called."""
        small: list[tuple[int, pa.Table]] = []
        large: list[tuple[int, Kind, DataFrame, int]] = []
        for aid in sorted(changed):
            arrangement = self.state.arrangements[aid]
            if arrangement.attribute.reserved:  # introspection facts describe this process only
                continue
            kind = arrangement.attribute.kind
            for batch in arrangement.forward.batches_between(epoch, epoch + 1):
                if batch.is_local:
                    small.append((aid, from_pandas(batch.local, kind)))
                else:
                    large.append((aid, kind, batch.frame, batch.rows))
        after = self.state.epoch  # still the previous epoch: this one has not committed
        args = (epoch, offsets, small, large, after if after != epoch - 1 else None,
                _ops_table(guessed) if guessed is not None else None)
        if large:
            return LogWrite(self, epoch, write=lambda: self.store.log_epoch(*args))
        return LogWrite(self, epoch, future=self._log_thread.submit(self.store.log_epoch, *args))

    # ------------------------------------------------------------ checkpoints
    def maybe_checkpoint(self) -> None:
        """Start a background checkpoint when one is due and none is being written (engine lock held)."""
        interval = self.config.checkpoint_interval
        if interval <= 0 or self.running or self.store.wal.failed is not None:
            return
        behind = self.epochs_logged - self._epochs_checkpointed
        if behind >= interval or (behind and self.store.wal.bytes_since_rotation >= self.config.checkpoint_log_bytes):
            try:
                snapshot = self._snapshot()
            except Exception as exc:  # the epochs are committed: report, never fail them
                self.last_error = exc
                log.exception("starting a checkpoint of epoch %d failed", self.state.epoch)
                return
            self._thread = threading.Thread(target=self._write_logged, args=(snapshot,),
                                            name=f"{self._group}-{snapshot.epoch}", daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        """Whether a checkpoint is being written."""
        return not self._idle.is_set()

    def wait(self) -> None:
        """Wait until no checkpoint is being written."""
        self._idle.wait()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def checkpoint(self, lock: threading.RLock) -> int:
        """Write a checkpoint of the latest closed epoch now (the snapshot under ``lock``, the
        files outside it); returns its epoch. Raises what writing it raised."""
        while True:
            self._idle.wait()
            with lock:
                if self.running:
                    continue
                if self.state.epoch == self.checkpointed and self.store.good:
                    return self.checkpointed
                snapshot = self._snapshot()
                break
        self._write(snapshot)
        return snapshot.epoch

    def _snapshot(self) -> _Snapshot:
        """What a checkpoint of the latest closed epoch writes (engine lock held, no checkpoint
        being written): the log moves to a new segment, the forward batches are pinned."""
        started = time.perf_counter()
        state = self.state
        segment = self.store.begin_checkpoint()
        self._idle.clear()
        batches = {}
        for aid, arrangement in state.arrangements.items():
            if arrangement.attribute.reserved:
                continue
            held = list(arrangement.forward.batches)
            for batch in held:
                batch.pin()
            batches[aid] = (arrangement.attribute.kind, held)
        snapshot = _Snapshot(state.epoch, segment,
                             [(str.__str__(a.name), a.value_type, a.semantics, a.settings) for a in state.schema],
                             list(self.rules.texts), [d.to_json() for d in state.durable_queries()],
                             state.offsets.to_json(), batches)
        snapshot.logged = self.epochs_logged
        if state.clock is not None:
            snapshot.frontier = state.clock.frontier
            snapshot.pending = [(t, b.offsets, _ops_table(b.ops)) for t, entries in state.clock.pending.items()
                                for b in entries]
        snapshot.pause = time.perf_counter() - started
        return snapshot

    def _write_logged(self, snapshot: _Snapshot) -> None:
        try:
            self._write(snapshot)
        except BaseException as exc:  # a background failure is reported, the next checkpoint tries again
            self.last_error = exc
            log.exception("writing the checkpoint of epoch %d failed", snapshot.epoch)

    def _write(self, snapshot: _Snapshot) -> None:
        started = time.perf_counter()
        sc = self.state.spark.sparkContext
        label_jobs(sc, f"{self._group}-{snapshot.epoch}", f"factflow checkpoint of epoch {snapshot.epoch}")
        try:
            facts = {aid: CheckpointFiles(kind, self._writer(kind, batches))
                     for aid, (kind, batches) in snapshot.batches.items()}
            manifest = self.store.write_checkpoint(snapshot.epoch, snapshot.segment, snapshot.attributes,
                                                   snapshot.rules, snapshot.queries, snapshot.offsets, facts,
                                                   snapshot.frontier, snapshot.pending)
            entries = [f for entry in manifest["facts"] for f in entry["files"]]
            self.last_checkpoint = CheckpointReport(
                snapshot.epoch, sum(e["rows"] for e in manifest["facts"]), len(entries),
                sum(f["size"] for f in entries), time.perf_counter() - started + snapshot.pause, snapshot.pause)
            self.checkpointed = max(self.checkpointed, snapshot.epoch)
            self._epochs_checkpointed = max(self._epochs_checkpointed, snapshot.logged)
        finally:
            for _, batches in snapshot.batches.values():
                for batch in batches:
                    batch.unpin()
            label_jobs(sc, "", "")
            self._idle.set()
        log.info("checkpoint of epoch %d: %d facts in %d files (%d bytes), %.2fs", snapshot.epoch,
                 self.last_checkpoint.facts, len(entries), self.last_checkpoint.bytes, self.last_checkpoint.seconds)

    def _writer(self, kind: Kind, batches: list[Batch]):
        """A function writing the consolidated rows of ``batches`` into a checkpoint directory."""
        spark = self.state.spark

        def write(directory: Location, prefix: str) -> list[dict]:
            if not batches:
                return []
            local = [b.local[["e", "v", DIFF]] for b in batches if b.is_local]
            stored = [b.frame.select("e", "v", DIFF) for b in batches if not b.is_local]
            if not stored:
                frame = pd.concat(local, ignore_index=True)
                table = from_pandas(consolidated(frame, ["e", "v"], DIFF), kind)
                return [write_table(table, directory, f"{prefix}part-00000.parquet")] if table.num_rows else []
            if local:
                stored.append(spark_frame(spark, pd.concat(local, ignore_index=True), _facts_struct(kind)))
            union = reduce(DataFrame.unionAll, stored)
            facts = union.groupBy("e", "v").agg(F.sum(DIFF).alias(DIFF)).where(F.col(DIFF) != 0)
            spark.sparkContext.setJobDescription(f"checkpoint: write {prefix.rstrip('-')}")
            return write_frame(facts, directory, prefix, kind)

        return write

    # ------------------------------------------------------------ reports and closing
    def report(self) -> dict:
        """Sizes on disk, the last checkpoint and the recovery (for ``Engine.storage_report``)."""
        return {"directory": self.store.directory, "bytes": self.store.sizes(), "checkpointed_epoch": self.checkpointed,
                "log_segment": self.store.wal.segment, "checkpoint_running": self.running,
                "last_checkpoint": self.last_checkpoint, "last_checkpoint_error": repr(self.last_error)
                if self.last_error else None, "recovery": self.recovery}

    def close(self) -> None:
        """Wait for a running checkpoint, close the log (marking it cleanly closed at the
        engine's epoch) and give the directory up."""
        self.wait()
        self._log_thread.shutdown()
        self.store.close(self.state.epoch)


def _ops_schema() -> pa.Schema:
    """The Arrow schema of buffered operations (value slots typed as facts are; instants naive UTC)."""
    slots = [pa.field(SLOT[k], pa.timestamp("us") if k is Kind.INSTANT else facts_schema(k).field("v").type)
             for k in Kind]
    return pa.schema([pa.field("a", pa.int32()), pa.field("e", pa.int64()), pa.field("op", pa.int32())] + slots)


def _ops_table(ops: WideOps) -> pa.Table:
    """Buffered operations as an Arrow table (for the log and checkpoints)."""
    schema = _ops_schema()
    columns = ops.columns()
    return pa.Table.from_arrays([pa.array(columns[f.name], f.type) for f in schema], schema=schema)


def _ops_from_table(table: pa.Table, schema) -> WideOps:
    """Buffered operations read back from :func:`_ops_table`'s table."""
    return WideOps.from_columns({name: table.column(name).to_pylist() for name in table.column_names}, schema)


def _facts_struct(kind: Kind) -> T.StructType:
    return T.StructType([T.StructField("e", T.LongType(), False), T.StructField("v", spark_type(kind), True),
                         T.StructField(DIFF, T.LongType(), False)])
