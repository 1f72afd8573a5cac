"""The engine's public facade: facts in, consistent incremental query results out, one epoch at a time.

:class:`Engine` owns the Spark session (or borrows one) and the engine lock; each public
method checks the engine is open and delegates: an epoch to :mod:`factflow.engine.epoch`
(which applies the transaction with :mod:`factflow.engine.apply` and moves the state of
:mod:`factflow.engine.state`), the delivery of its changes to
:mod:`factflow.engine.delivery`, a query install to :mod:`factflow.engine.install`,
figures to :mod:`factflow.engine.reports`.

The engine lock (reentrant) is held by every epoch, install, close and read of state
(``Query.results()`` and its siblings, ``Engine.stats()``), so a reader in any thread sees
exactly one closed epoch; subscribers are called after it is released.

An engine given a ``state_dir`` is durable (:mod:`factflow.engine.durability`): it logs
every attribute, rule and epoch before acknowledging it, checkpoints in the background,
and recovers what the directory holds when it opens.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import shutil
import tempfile
import threading
import uuid
from typing import Any, Callable, ContextManager, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from factflow.arrangement.attribute import AttributeArrangement
from factflow.arrangement.batch import DIFF
from factflow.arrangement.bound import tasks_in_driver_jvm
from factflow.arrangement.trace import MergePolicy
from factflow.engine.config import EngineConfig
from factflow.engine.definition import QueryDefinition, labels_of
from factflow.engine.delivery import Deliveries
from factflow.engine.durability import CheckpointReport, Durability, RecoveryReport
from factflow.engine import transaction
from factflow.engine.clock import EventClock, advance, buffer
from factflow.engine.epoch import run_epoch
from factflow.engine.maintenance import POOL, Maintenance
from factflow.engine.warmup import warm_up
from factflow.engine.feeds import AttributeSubscriber
from factflow.engine.granularity import Window, window_seconds
from factflow.engine.group import plan_runs
from factflow.engine.history import check_slack
from factflow.engine.holdings import Holdings
from factflow.engine.preflight import check_executors
from factflow.storage.location import Location
from factflow.engine.install import install
from factflow.engine.introspection import Introspection
from factflow.engine.offsets import check_offset
from factflow.engine.pull import pull_query, pulled
from factflow.engine.query import Query
from factflow.engine.reports import EpochReport, SparkJob, engine_stats
from factflow.engine.session import (
    REQUIRED_SQL_CONF, acquire_session, driver_alive, release_session, warn_of_missing_start_up_settings,
)
from factflow.engine.state import EngineState
from factflow.errors import (
    EngineClosedError, ExecutionError, FactflowError, QueryError, StorageError, TransactionError,
)
from factflow.io.sinks import CHANGE, Sink, SinkWriter, sinks_of
from factflow.lang.rules import RuleStore
from factflow.io.ingest import ingest
from factflow.io.load import LoadReport, load
from factflow.model.schema import Attribute, Schema
from factflow.planner.plan import Plan
from factflow.planner.synthesis import plan_query
from factflow.text import plural

__all__ = ["Engine", "EngineConfig", "EpochReport", "SparkJob", "RecoveryReport", "CheckpointReport"]

log = logging.getLogger("factflow.engine")
_ENGINE_IDS = itertools.count(1)


class Engine:
    """An embedded factflow engine.

    ``Engine()`` starts Spark in local mode; ``Engine(master="spark://...")`` connects to a
    cluster. Both join the session already running in the process if there is one: engines
    share a session factflow started, which stops when the last of them closes (see
    :func:`factflow.engine.session.acquire_session`); a session factflow did not start is
    never stopped.
    ``Engine(spark=session)`` uses the given session (setting ``REQUIRED_SQL_CONF`` on it)
    and never stops it.

    ``state_dir`` makes the engine durable: its attributes, rules, facts, epoch counter and
    source offsets are kept in that directory (created if missing) and recovered when an
    engine opens it again; ``transact`` returns only once its epoch is in the write-ahead
    log (fsync'd), checkpoints are written in the background, and one engine at a time may
    have the directory open (:class:`factflow.StateLockedError` otherwise). It is a local
    path, a path every machine of a cluster shares, or an object store URI (``s3://``,
    ``gs://``, ``abfs://``, ``hdfs://``) with ``storage_options`` for its client (see
    :mod:`factflow.storage.location`); the index files of stored batches go there too. What the
    opening recovered is in :attr:`recovery`. Damage that would lose acknowledged epochs (a
    log record failing its checksum with more log after it, a log cut short after a clean
    close) is refused with :class:`factflow.CorruptStateError` naming the file, the byte
    offset and the epochs beyond it; ``accept_data_loss=True`` opens the directory anyway,
    cutting the log there, and ``recovery.dropped`` says what was given up (``factflow
    repair DIR`` does the same without starting Spark). Without ``state_dir`` the engine keeps its
    files (index files of stored batches) in a temporary directory that ``close()``
    removes, and nothing survives it.

    ``introspection=True`` maintains the engine's activity as facts of reserved
    ``:factflow.*`` attributes that queries read, one epoch behind (see
    :mod:`factflow.engine.introspection`).

    Before anything else, an engine checks on every executor that Spark's tasks can run
    factflow's code (the Python interpreter they start with has factflow and its
    dependencies at the driver's versions) and can read and write the state location (a
    cluster's executors on other hosts do not see the driver's temporary directory; see
    :mod:`factflow.engine.preflight`), and refuses a session where they cannot with a
    :class:`factflow.ConfigurationError` naming the host and saying what to set.

    ``time="event"`` numbers epochs by the times transactions carry (``transact(tx,
    time=T)``, closed by :meth:`advance_to`; see :mod:`factflow.engine.clock`) instead of
    by arrival (``"transaction"``, the default).

    Once the engine is closed, every public method and property but :meth:`close` raises
    :class:`factflow.EngineClosedError` (the settings it was made with, such as ``spark``,
    ``config``, ``state_dir``, ``time`` and ``recovery``, stay readable).
    """

    def __init__(self, spark: SparkSession | None = None, master: str | None = None,
                 state_dir: str | None = None, config: EngineConfig | None = None, introspection: bool = False,
                 time: str = "transaction", accept_data_loss: bool = False,
                 storage_options: dict[str, Any] | None = None):
        if time not in ("transaction", "event"):
            raise FactflowError(f"time must be 'transaction' or 'event', not {time!r}")
        location = Location(state_dir, storage_options) if state_dir else None
        self._holds_session = spark is None
        self.spark = spark if spark is not None else acquire_session(master=master)
        self._owns_state_dir = not state_dir
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="factflow-")
        self.location = location or Location(self.state_dir)
        try:
            check_executors(self.spark, self.location)
        except BaseException:
            if self._owns_state_dir:
                shutil.rmtree(self.state_dir, ignore_errors=True)
            if self._holds_session:
                release_session(self.spark)
            raise
        for key, value in REQUIRED_SQL_CONF.items():
            self.spark.conf.set(key, value)
        warn_of_missing_start_up_settings(self.spark)
        self.config = config or EngineConfig()
        partitions = self.config.partitions or int(self.spark.conf.get("spark.sql.shuffle.partitions"))
        self.policy = MergePolicy(self.config.merge_factor, self.config.local_limit, partitions,
                                  self.location.child("indexes", uuid.uuid4().hex), self.config.index_cache_bytes,
                                  not tasks_in_driver_jvm(self.spark.sparkContext.master),
                                  merge_limit=self.config.merge_limit)
        self._rules = RuleStore()
        self._state = EngineState(self.spark, self.config, self.policy)
        self._state.clock = EventClock() if time == "event" else None
        #: the time domain: "transaction" (epochs by arrival) or "event" (by the times transactions carry)
        self.time = time
        self._lock = threading.RLock()
        self._deliveries = Deliveries()
        self._closed = False
        self._id = next(_ENGINE_IDS)
        self._group = f"factflow-{self._id}-epoch"
        self._epoch_log: list[EpochReport] = []
        self._holdings = Holdings()
        self._maintenance = Maintenance(self._state, self._lock, f"factflow-{self._id}-maintenance", self._epoch_log)
        warm_up(self.spark, POOL)
        self._durability: Durability | None = None
        #: what opening the state directory recovered (None without ``state_dir``)
        self.recovery: RecoveryReport | None = None
        if state_dir:
            try:
                self._durability = Durability.open(self.location, self._state, self._rules, self.config, self._id,
                                                   accept_data_loss)
            except BaseException:
                self._state.close()
                if self._holds_session:
                    release_session(self.spark)
                raise
            self.recovery = self._durability.recovery
        self._introspection = Introspection(
            self._state, self._durability.log_attribute if self._durability else None) if introspection else None
        if state_dir:
            try:
                self._apply_unconfirmed()
            except BaseException:
                self.close()
                raise
            self._restore_queries()
            self._maintenance.run()

    # ------------------------------------------------------------ schema and rules
    @property
    def epoch(self) -> int:
        """The latest closed epoch (0 before any transaction)."""
        self._check_open()
        return self._state.epoch

    @property
    def schema(self) -> Schema:
        """The attributes defined so far."""
        self._check_open()
        return self._state.schema

    @property
    def rules(self) -> RuleStore:
        """The rules registered so far (to read: :meth:`register` adds rules, and logs them)."""
        self._check_open()
        return self._rules

    def create_attribute(self, name: str, type: str = "string", semantics: str = "set", index: str = "both",
                         support: str = "wco", slack: int = 0, parameter: bool = False) -> Attribute:
        """Define an attribute: ``type`` is long, double, string, boolean, ref or instant;
        ``semantics`` is set (default), raw (multiset) or one (cardinality one).

        ``index`` is both (default: a reverse index v->e is built when a query looks up by
        value) or forward (e->v only; lookups by value scan it); ``support`` is wco
        (default: every join strategy, count indexes built on demand), delta (no count
        indexes: binary and delta joins) or basic (binary joins only). See
        :mod:`factflow.planner.strategy` for how queries respect them. ``slack`` closed
        epochs of its forward index are kept uncompacted (:mod:`factflow.engine.history`).
        ``parameter`` marks it as a tenant parameter (see :mod:`factflow.server.tenants`)."""
        with self._lock:
            self._check_open()
            logged = self._durability.log_attribute if self._durability else None
            attribute = self._state.schema.create(name, type, semantics, log=logged, index=index, support=support,
                                                  slack=slack, parameter=parameter)
            self._state.arrange(attribute)
            return attribute

    def register(self, rules: str) -> list[str]:
        """Store rules (EDN ``[[(name ?a ...) clause ...] ...]``); nothing is computed yet."""
        with self._lock:
            self._check_open()
            return self._rules.register(rules, log=self._durability.log_rules if self._durability else None)

    def subscribe_attribute(self, name: str, fn: AttributeSubscriber) -> Callable[[], None]:
        """Call ``fn(epoch, [((entity, value), diff), ...])`` after each epoch that changes the
        attribute ``name`` (its effective changes; see :mod:`factflow.engine.feeds`); returns
        an unsubscribe function. Delivery is as for :meth:`Query.subscribe`."""
        with self._lock:
            self._check_open()
            feed = self._state.feed(self._state.schema.get(name))
            feed.add(fn)

        def unsubscribe() -> None:
            with self._lock:
                feed.remove(fn)

        return unsubscribe

    def arrangement(self, name: str) -> AttributeArrangement:
        """The shared arrangement of an attribute (for inspection)."""
        self._check_open()
        return self._state.arrangement_of(self._state.schema.get(name))

    # ------------------------------------------------------------ transactions
    def transact(self, tx: Any, source: str | None = None, offset: int | None = None, time: Any = None) -> int:
        """Apply one transaction atomically as the next epoch; returns the epoch number.

        In event time (``Engine(time="event")``) ``time`` is required (and elsewhere refused):
        the transaction is checked and buffered for that time, applied when
        :meth:`advance_to` closes it, and its time is returned (see
        :mod:`factflow.engine.clock`); a durable engine returns once it is logged.

        Every installed query is up to date when this returns, and every subscriber has been
        called with the epoch's changes (and with those of every earlier epoch). Called from
        inside a subscriber, it returns as soon as its epoch is committed: that epoch is
        delivered by the loop running the callback, after the current epoch has reached
        every subscriber. A durable engine returns (and calls subscribers) only once the
        epoch is in its write-ahead log.

        ``source`` and ``offset`` make input exactly-once (:mod:`factflow.engine.offsets`):
        the offset is recorded with the epoch, and a transaction whose offset is at or below
        the latest recorded for its source is skipped, returning the epoch that includes it
        (see :meth:`offsets`).

        A rejected transaction raises and changes nothing. Once the epoch is committed,
        neither a failing subscriber nor a failing maintenance makes this raise (both are
        logged), so retrying a call that raised does not apply a transaction twice. An
        epoch that lost the Spark driver raises :class:`ExecutionError` and closes the
        engine. Threads may call this concurrently: epochs run one at a time, and
        subscribers receive them in increasing order.
        """
        self._check_open()
        checked = check_offset(source, offset)
        if time is not None or self._state.clock is not None:
            logged = self._durability.log_pending if self._durability else None
            return self._committing(lambda: buffer(self._state, tx, time, checked, logged))

        def run() -> int:
            if checked is not None:
                applied = self._state.offsets.applied(*checked)
                if applied is not None:
                    return applied
            return self._run_epoch(tx, dict([checked]) if checked else None)

        return self._committing(run)

    def transact_many(self, transactions: Sequence[Any],
                      offsets: Sequence[tuple[str, int] | None] | None = None) -> list[int | FactflowError]:
        """Group commit: apply several transactions (operation lists or EDN text) in as few
        epochs as possible, each validated on its own; returns, per transaction, the epoch it
        landed in or the error that rejected it (a rejected one changes nothing).

        The outcome equals applying them one after another in the given order: transactions
        that touch one fact in opposite directions, or give one entity's cardinality-one
        attribute different values, go to successive epochs (see :mod:`factflow.engine.group`).
        ``offsets`` gives each transaction's ``(source, offset)`` or None, as in
        :meth:`transact`; a transaction whose offset is at or below one given earlier in the
        same call gets the outcome of the earliest one at or above it. Delivery, durability
        and maintenance are as in :meth:`transact`.
        """
        self._check_open()
        if self._state.clock is not None:
            raise TransactionError("an event-time engine takes transactions one at a time: transact(tx, time=T)")
        outcomes: list[int | FactflowError | None] = [None] * len(transactions)
        if offsets is not None and len(offsets) != len(transactions):
            raise TransactionError(f"{plural(len(offsets), 'offset')} given for {plural(len(transactions), 'transaction')}")

        def run() -> None:
            checked: dict[int, transaction.WideOps] = {}
            sources: dict[int, tuple[str, int]] = {}
            covered: dict[int, int] = {}  # position -> the earlier position whose outcome it shares
            pending: dict[str, list[tuple[int, int]]] = {}  # source -> (offset, position), ascending
            for position, tx in enumerate(transactions):
                try:
                    given = offsets[position] if offsets is not None else None
                    checked_offset = check_offset(*given) if given is not None else None
                    if checked_offset is not None:
                        source, offset = checked_offset
                        applied = self._state.offsets.applied(source, offset)
                        if applied is not None:
                            outcomes[position] = applied
                            continue
                        earlier = pending.setdefault(source, [])
                        if earlier and offset <= earlier[-1][0]:
                            covered[position] = next(p for o, p in earlier if o >= offset)
                            continue
                        earlier.append((offset, position))
                        sources[position] = checked_offset
                    checked[position] = transaction.read_ops(tx, self._state.schema)
                except TransactionError as exc:
                    outcomes[position] = exc
            positions = list(checked)
            for run_ in plan_runs([checked[p] for p in positions]):
                self._commit_run([positions[j] for j in run_], checked, sources, outcomes)
            for position, twin in covered.items():
                outcomes[position] = outcomes[twin]

        self._committing(run)
        return outcomes  # type: ignore[return-value]

    def _commit_run(self, members: list[int], checked: dict[int, "transaction.WideOps"],
                    sources: dict[int, tuple[str, int]], outcomes: list) -> None:
        """One epoch for a run of compatible transactions; if it is rejected, each member alone."""
        offsets: dict[str, int] = {}
        for member in members:
            if member in sources:
                source, offset = sources[member]
                offsets[source] = max(offset, offsets.get(source, offset))
        try:
            epoch = self._run_epoch(transaction.combine([checked[p] for p in members]), offsets or None)
        except TransactionError as exc:
            if len(members) == 1:
                outcomes[members[0]] = exc
                return
            for member in members:
                self._commit_run([member], checked, sources, outcomes)
            return
        except FactflowError as exc:  # a Spark failure: rolled back, nothing of the run committed
            if isinstance(exc, ExecutionError) and not driver_alive(self.spark):
                raise  # the engine closes (see _committing)
            for member in members:
                outcomes[member] = exc
            return
        for member in members:
            outcomes[member] = epoch

    def load(self, path: str | Sequence[str] | DataFrame, format: str = "csv", entity: str = "id",
             attributes: dict[str, str] | None = None, options: dict[str, str] | None = None,
             added: bool = True) -> LoadReport:
        """Read ``path`` with Spark (``spark.read.format(format).options(**options)``), or take
        the Spark DataFrame given as ``path``, and apply, as one epoch, a fact per non-NULL
        cell of each column mapped by ``attributes`` (``{attribute: column}``) for the entity
        in column ``entity``, converted to the attribute's type (retracted when ``added`` is
        false); a value that does not convert rejects it all (:class:`LoadError`). See
        :mod:`factflow.io.load`; relational tables: :mod:`factflow.io.tables`."""
        self._check_open()
        return load(self, path, format, entity, attributes, options, added)

    def loading(self) -> ContextManager[None]:
        """The block :mod:`factflow.io.tables` loads rows in: one load at a time, the small
        frames' rows bound for statements whose plans the engine keeps (see
        :meth:`EngineState.loading <factflow.engine.state.EngineState.loading>`)."""
        self._check_open()
        return self._state.loading()

    def ingest(self, stream: DataFrame, source: str, checkpoint: str, on_error: str = "skip",
               trigger: dict[str, Any] | None = None) -> StreamingQuery:
        """Start and return the ``StreamingQuery`` applying each micro-batch of the streaming
        DataFrame ``stream`` (columns ``e``, ``a``, ``v``, optional ``added``) as one epoch,
        exactly once (offsets of ``source``; Spark's checkpoint in ``checkpoint``). A rejected
        batch is written to ``checkpoint/rejected/batch-<id>/`` with its error, then skipped
        (``on_error="skip"``) or stops the stream (``"stop"``). See :mod:`factflow.io.ingest`."""
        self._check_open()
        return ingest(self, stream, source, checkpoint, on_error, trigger)

    def _run_epoch(self, tx: Any, offsets: dict[str, int] | None, epoch: int | None = None) -> int:
        """One epoch of ``tx`` (numbered ``epoch`` in event time), carrying the introspection
        facts of the epochs before it."""
        step = self._introspection.step(self._state, self._epoch_log) if self._introspection else None
        epoch = run_epoch(self._state, tx, self._group, self._epoch_log, self._deliveries, offsets, self._journal,
                          step.changes if step else None, epoch)
        if step is not None:
            step.commit()
        return epoch

    @property
    def durable(self) -> bool:
        """Whether the engine keeps its state in a ``state_dir``."""
        self._check_open()
        return self._durability is not None

    def advance_to(self, time: Any) -> list[int]:
        """Event time: close every time before ``time``, applying the transactions buffered for
        each as one epoch numbered by it, in time order; returns those epochs. Delivery,
        durability and maintenance are as in :meth:`transact` (see :mod:`factflow.engine.clock`)."""
        self._check_open()
        logged = self._durability.log_frontier if self._durability else None
        return self._committing(lambda: advance(self._state, time, lambda t, ops: self._run_epoch(ops, None, t), logged))

    @property
    def frontier(self) -> int:
        """The first epoch not closed yet: in event time the frontier (times before it are
        closed), in transaction time the next epoch."""
        self._check_open()
        clock = self._state.clock
        return clock.frontier if clock is not None else self._state.epoch + 1

    @property
    def _journal(self):
        return self._durability.log_epoch if self._durability else None

    def offsets(self) -> dict[str, int]:
        """The latest offset applied per source: ``{source: offset}`` (see :meth:`transact`)."""
        with self._lock:
            self._check_open()
            return self._state.offsets.latest()

    def checkpoint(self) -> int:
        """Write a checkpoint of the latest closed epoch now and wait for it (a durable engine
        also writes them in the background, see ``EngineConfig.checkpoint_interval``); returns
        its epoch. Epochs may run meanwhile."""
        self._check_open()
        if self._durability is None:
            raise StorageError("this engine has no state_dir: there is nothing to checkpoint")
        return self._durability.checkpoint(self._lock)

    def storage_report(self) -> dict[str, Any] | None:
        """A durable engine's files: bytes of log and checkpoints, the newest checkpoint's
        epoch, the last checkpoint written (:class:`CheckpointReport`) and the recovery
        (:class:`RecoveryReport`); None without ``state_dir``."""
        with self._lock:
            self._check_open()
            return self._durability.report() if self._durability else None

    def _committing(self, commit):
        """Run ``commit`` (epochs) under the engine lock, then deliver and maintain outside it."""
        self._before_command()
        try:
            with self._lock:
                self._check_open()
                try:
                    result = commit()
                except ExecutionError:
                    if not driver_alive(self.spark):
                        self.close()
                    raise
        finally:
            self._deliveries.drain()
        self._maintenance.run()
        with self._lock:
            if not self._closed and self._durability is not None:
                self._durability.maybe_checkpoint()
        return result

    def _before_command(self) -> None:
        """Unless merges may overlap epochs (``EngineConfig.overlap_merges``), wait for the
        background merges of the previous command before starting the next."""
        if not self.config.overlap_merges:
            self._maintenance.wait()

    def wait_for_maintenance(self) -> None:
        """Wait until the merges and index files of every committed epoch and install are
        done: they run in the background after delivery (see
        :mod:`factflow.engine.maintenance`), at most one round behind."""
        self._check_open()
        self._maintenance.wait()

    # ------------------------------------------------------------ queries
    def query(self, query: str | Plan, name: str | None = None, inputs: Sequence[Any] = (), join: str = "auto",
              semantics: str = "set", sink: Sink | Sequence[Sink] = (), granularity: float | None = None,
              durable: bool = False, introspect: bool = True, slack: int = 0,
              labels: dict[str, str] | None = None) -> Query:
        """Register and install a query (interest): its dataflow reads the state as of now.

        ``inputs`` supply the ``:in`` bindings after ``$``; ``join`` picks the join strategy
        (auto, binary, delta, wco); ``semantics`` is ``set`` (Datomic) or ``multiset``
        (derivation counts). ``query`` may also be a :class:`Plan` from :meth:`plan`, which
        carries its text, inputs, join and semantics (give none of them again): the plan is
        installed as it is, or refused with a QueryError when it is not this engine's plan of
        its text (one made by an engine with another schema or other rules); the plan object
        stays unbound and can be installed again under another name.

        ``sink`` (one :class:`~factflow.io.sinks.Sink` or several)
        writes the result's changes to directories (see :meth:`Query.write_to`);
        ``granularity`` (seconds) delivers them to subscribers and sinks at most once per
        window (see :mod:`factflow.engine.granularity`).

        ``durable=True`` (an engine with a ``state_dir`` only) keeps the query's definition,
        sinks and granularity included, in the state directory: an engine reopening it
        installs the query again, under its name, as of the recovered epoch, and its sinks
        continue where they stopped (see :mod:`factflow.engine.definition`). Asking for a
        durable query that is installed already with the same plan (see :meth:`plan`) and
        settings returns it, so a program that installs its durable queries at start runs
        unchanged after a restart.
        ``Query.close()`` drops a durable query for good; ``Engine.close()`` keeps it.

        ``introspect=False`` leaves the query and its private arrangements out of the
        introspection facts of ``Engine(introspection=True)``.

        ``slack`` closed epochs before the latest stay readable with ``results(as_of=...)``
        (see :mod:`factflow.engine.history`).

        ``labels`` (strings to strings) are kept with the query's definition, durable ones
        across restarts (``q.definition.labels``); the engine gives them no meaning (the
        server records there what it published the query as).
        """
        self._check_open()
        sinks, seconds = sinks_of(sink), window_seconds(granularity)
        check_slack(slack, f"query {name or '(unnamed)'}")
        expected = None
        if isinstance(query, Plan):
            expected = query
            query, inputs, join, semantics = _source_of(query, name, inputs, join, semantics)
        self._before_command()
        handle = self._query(query, name, inputs, join, semantics, sinks, seconds, durable, introspect, slack,
                             expected, labels)
        self._maintenance.run()
        return handle

    def _query(self, query: str, name: str | None, inputs: Sequence[Any], join: str, semantics: str,
               sinks: Sequence[Sink], seconds: float | None, durable: bool, introspect: bool, slack: int,
               expected: Plan | None = None, labels: dict[str, str] | None = None) -> Query:
        with self._lock:
            self._check_open()
            if not durable:
                return self._install(query, name, inputs, join, semantics, sinks, seconds, introspect, slack,
                                     self._planned(query, inputs, join, semantics, expected, name), labels)
            if self._durability is None:
                raise StorageError("durable=True needs an engine with a state_dir: there is nowhere to keep the query")
            planned = self._planned(query, inputs, join, semantics, expected, name)
            definition = QueryDefinition.of(name or "", query, inputs, join, semantics, sinks, seconds, introspect,
                                            slack, labels)
            handle = self._state.queries.get(name) if name else None
            fresh = handle is None or not (handle.definition.same_settings(definition) and handle.plan == planned)
            if fresh:
                handle = self._install(query, name, inputs, join, semantics, sinks, seconds, introspect, slack,
                                       planned, labels)
            elif handle.durable:
                return handle
            try:  # a new query, or the same query installed without durable=True: it becomes durable
                self._durability.log_query(handle.definition)
            except BaseException:
                if fresh:
                    self._release_outputs(handle)
                    self._uninstall(handle)
                raise
            handle.durable = True
            return handle

    def pull(self, pattern: Any, entity: int) -> dict[str, Any] | None:
        """Datomic's ``pull``: ``entity`` shaped by ``pattern`` (EDN text or form, such as
        ``[:person/name {:person/knows [:person/name]}]``) as of the latest closed epoch, as
        plain dicts and lists (see :mod:`factflow.model.pulled`); None, like Datomic's nil,
        when the entity has none of the pattern's attributes. It installs the pull as a query
        and closes it (see :mod:`factflow.engine.pull`); to follow an entity, query the pull."""
        with self._lock:
            self._check_open()
            query = self.query(pull_query(pattern, entity), name=f"pull of {entity}", inputs=[entity])
            try:
                return pulled(query.results())
            finally:
                query.close()


    def plan(self, query: str, inputs: Sequence[Any] = (), join: str = "auto", semantics: str = "set") -> Plan:
        """The plan of ``query`` (see :mod:`factflow.planner.plan`) as :meth:`query` would
        install it now, without installing anything: plain data (``to_data()``), equal to
        another plan (``==``, ``fingerprint()``) exactly when both describe the same dataflow.
        A QueryError when the query cannot be planned."""
        with self._lock:
            self._check_open()
            return plan_query(query, self.schema, self._rules, inputs, join, semantics, self._state.shared)

    def _planned(self, query: str, inputs: Sequence[Any], join: str, semantics: str, expected: Plan | None,
                 name: str | None) -> Plan:
        """The query planned now; a QueryError when that plan is not ``expected`` (when given)."""
        plan = self.plan(query, inputs, join, semantics)
        if expected is not None and plan != expected:
            raise QueryError(f"query {name or '(unnamed)'}: the plan given is not this engine's plan of its query "
                             "(it was planned against another schema or other rules); plan the query on this engine")
        return plan

    def _install(self, query: str, name: str | None, inputs: Sequence[Any], join: str, semantics: str,
                 sinks: Sequence[Sink] = (), seconds: float | None = None, introspect: bool = True,
                 slack: int = 0, plan: Plan | None = None, labels: dict[str, str] | None = None) -> Query:
        """Install the query: ``plan`` (planned just now, never installed) or its text planned now."""
        name = self._state.query_name(name)
        plan = plan if plan is not None else self.plan(query, inputs, join, semantics)
        definition = QueryDefinition(name, query, tuple(inputs), join, semantics, (), seconds, introspect, slack,
                                     labels_of(labels))
        dataflow = install(self._state, plan, name, f"factflow-{self._id}-install")
        handle = Query(self, dataflow, self._state.epoch, self._lock, definition)
        handle.introspect = introspect
        if seconds:
            handle.window = Window(seconds, [col for _, col in dataflow.find],
                                   lambda: self._deliveries.release(handle))
        self._state.queries[handle.name] = handle
        self._state.defer_maintenance(self._state.epoch, {}, [handle])
        try:
            if handle.pulls and seconds:
                raise QueryError(f"query {handle.name}: granularity is not supported for pull queries yet")
            for each in sinks:
                self._attach_sink(handle, each)
        except BaseException:
            self._release_outputs(handle)
            self._uninstall(handle)
            raise
        log.info("installed query %s at epoch %d (%s join)", handle.name, self._state.epoch, dataflow.strategy)
        return handle

    def _apply_unconfirmed(self) -> None:
        """Apply again the transaction of a guessed epoch the log ended with (its guess was
        never checked: see :mod:`factflow.engine.durability`), as that epoch; a rejection
        voids its record. Either way the recovery report says what became of it."""
        unconfirmed = self._durability.unconfirmed
        if unconfirmed is None:
            return
        epoch, offsets, ops = unconfirmed
        self._durability.unconfirmed = None
        try:
            with self._lock:
                applied = self._run_epoch(ops, offsets or None, epoch if self._state.clock is not None else None)
            self.recovery.unconfirmed = (f"the log ended with guessed epoch {epoch}, not yet checked: its "
                                         f"transaction was applied again as epoch {applied}")
        except TransactionError as exc:
            self._durability.store.log_void(epoch)
            self.recovery.unconfirmed = (f"the log ended with guessed epoch {epoch}, not yet checked: its "
                                         f"transaction was rejected when applied again ({exc}); it is void")
        log.warning("%s", self.recovery.unconfirmed)
        self._deliveries.drain()

    def _restore_queries(self) -> None:
        """Install the durable queries the state directory holds (a failure is logged and
        listed in the recovery report; the definition stays for the next opening)."""
        for d in self._durability.recovered_queries:
            try:
                self._install(d.text, d.name, d.inputs, d.join, d.semantics, d.sinks, d.granularity,
                              d.introspect, d.slack, labels=dict(d.labels)).durable = True
                self.recovery.queries.append(d.name)
            except FactflowError as exc:
                log.error("durable query %s could not be installed again: %s", d.name, exc)
                self.recovery.refused.append(f"query {d.name}: {exc}")

    def _attach_sink(self, query: Query, sink: Sink) -> SinkWriter:
        """Open ``sink`` for ``query`` and write its current result (see :mod:`factflow.io.sinks`);
        a durable query's kept definition gains the sink."""
        with self._lock:
            query._check()
            if query.pulls:
                raise QueryError(f"query {query.name}: sinks are not supported for pull queries yet")
            columns = [(name, kind) for _, name, kind in query.output_columns()]
            writer = SinkWriter(self.spark, query.name, sink, columns)
            result = query.frame().withColumnRenamed(DIFF, CHANGE)
            writer.start(self._state.epoch, result)
            query._sinks.append(writer)
            query.definition = dataclasses.replace(query.definition, sinks=query.definition.sinks + (sink,))
            if query.durable:
                self._durability.log_query(query.definition)
            return writer

    def _release_outputs(self, query: Query) -> None:
        """Deliver ``query``'s held window and stop its sinks (outside the engine lock)."""
        self._deliveries.release(query)
        for sink in query._sinks:
            sink.close()

    def _uninstall(self, query: Query, drop: bool = False) -> None:
        """Tear a query down; ``drop`` (its user closed it) also forgets a durable query's definition."""
        with self._lock:
            if self._state.queries.get(query.name) is query:
                if drop and query.durable and not self._closed:
                    self._durability.log_query_dropped(query.name)
                del self._state.queries[query.name]
                self._state.shared.release(query.name)
            query.dataflow.close()
            if self._state.binder is not None:
                self._state.binder.forget(query.dataflow)
            query.closed = True

    @property
    def queries(self) -> dict[str, Query]:
        """Installed queries by name."""
        self._check_open()
        return dict(self._state.queries)

    # ------------------------------------------------------------ introspection
    @property
    def epoch_log(self) -> list[EpochReport]:
        """The report of every epoch so far, oldest first (see :class:`EpochReport`)."""
        self._check_open()
        return self._epoch_log

    def stats(self) -> dict[str, Any]:
        """Tuples (update rows, counted exactly) held in arrangements.

        ``shared_tuples`` and ``arrangements``: the shared attribute indexes (forward,
        reverse and count faces), per index. ``query_tuples``: per query, the rows of its
        private intermediate state (join-at-a-time intermediates, negation sets, goal-directed
        fixpoints); ``result_tuples``: per query, its result trace. ``query_arrangements``:
        per query, every private trace with its role and rows. ``shared_rules``: per rule
        relation shared by queries (see :mod:`factflow.planner.shared`), its rules, the
        queries reading it, its rows and its traces. ``epoch``: the closed epoch all of it is
        as of (taken under the engine lock: a running epoch is waited for, never counted).
        """
        with self._lock:
            self._check_open()
            return engine_stats(self._state)

    def holdings(self) -> list[dict[str, Any]]:
        """Every trace the engine keeps (shared attribute index faces, queries' private
        traces, shared rules' traces) with its rows, batches, bytes on the driver, in Spark
        and in index files, and the queries reading it (see :mod:`factflow.engine.holdings`);
        as of the latest closed epoch, without a Spark job."""
        with self._lock:
            self._check_open()
            return self._holdings.read(self._state)

    # ------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed")

    def close(self) -> None:
        """Close every query (first, outside the engine lock, delivering held granularity
        windows and writing what sinks have queued), wait for a checkpoint being written,
        release all state, close a durable engine's log and lock (its directory stays),
        remove the temporary state directory, and give
        up the engine's hold on its session (stopping it when the engine was the last to hold
        a session factflow started). An engine whose Spark driver is gone releases nothing in
        Spark: its state went with the driver."""
        if not self._closed and driver_alive(self.spark):
            for q in list(self._state.queries.values()):
                self._release_outputs(q)
        with self._lock:
            if self._closed:
                return
            self._maintenance.close()
            if driver_alive(self.spark):
                for q in list(self._state.queries.values()):
                    self._uninstall(q)  # durable queries stay in the state directory
                if self._durability is not None:
                    self._durability.wait()
                self._state.close()
            else:
                for q in self._state.queries.values():
                    q.closed = True
            self._closed = True
            if self._durability is not None:
                self._durability.close()
                self.policy.directory.remove_tree()  # this run's index files: derived, of no use to the next
            if self._owns_state_dir:
                try:
                    shutil.rmtree(self.state_dir)
                except OSError as exc:  # a directory left behind is worth a warning, not a failed close
                    log.warning("could not remove the state directory %s: %s", self.state_dir, exc)
            if self._holds_session:
                release_session(self.spark)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _source_of(plan: Plan, name: str | None, inputs: Sequence[Any], join: str,
               semantics: str) -> tuple[str, Sequence[Any], str, str]:
    """The text, inputs, join and semantics a plan was planned from (see :meth:`Engine.plan`);
    a QueryError when the caller gave any of them again, or the plan has no text to keep."""
    source = plan.source
    label = f"query {name or '(unnamed)'}"
    if source is None or not isinstance(source.query, str):
        raise QueryError(f"{label}: only a plan made by Engine.plan (from query text) can be installed")
    if tuple(inputs) or join != "auto" or semantics != "set":
        raise QueryError(f"{label}: a plan carries its inputs, join and semantics; give none of them with it")
    return source.query, source.inputs, source.join, plan.semantics
