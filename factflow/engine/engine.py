"""The engine: facts in, consistent incremental query results out, one epoch at a time.

An epoch (one ``transact``) runs in three phases, each a small, fixed number of Spark jobs
whatever the number of installed queries:

1. *changes*: one job validates the transaction and computes every attribute's effective
   changes against the shared arrangements; the changes are appended to them.
2. *queries*: the pending state changes and outputs of every affected query are built as
   one union and fetched in one job (or, for bulk changes, checkpointed in Spark).
3. *maintenance*: traces merge their batches geometrically (amortized).

Every job runs in the job group ``factflow-epoch-<n>`` with a description naming its
phase, so the Spark UI tells which epoch and which query ran what. If anything fails
before the epoch is committed, the changes already appended are undone: no partial epoch
is ever visible.
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from factflow.arrangement.attribute import AttributeArrangement
from factflow.arrangement.batch import DIFF, drop_view, register_view
from factflow.arrangement.trace import MergePolicy, Trace, TraceHandle
from factflow.dataflow.context import EpochContext
from factflow.dataflow.lookup import TRACE_DIFF, probe
from factflow.dataflow.nodes import OUT, Node, Stateful
from factflow.engine import transaction
from factflow.engine.evaluation import Evaluation
from factflow.engine.query import Query
from factflow.engine.session import REQUIRED_SQL_CONF, create_session
from factflow.errors import EngineClosedError, FactflowError, QueryError, TransactionError
from factflow.lang.parser import parse_query
from factflow.lang.rules import RuleStore
from factflow.model.schema import Attribute, Schema
from factflow.model.types import Kind
from factflow.planner.context import PlanContext
from factflow.planner.shared import SharedRules
from factflow.planner.synthesis import Dataflow, synthesize

__all__ = ["Engine", "EngineConfig", "EpochReport", "SparkJob"]

log = logging.getLogger("factflow.engine")
_ENGINE_IDS = itertools.count(1)


@dataclass(frozen=True)
class EngineConfig:
    """Tuning knobs.

    ``local_limit``: change sets and merged batches of at most this many rows are held on
    the driver and shipped to Spark as local relations; larger ones are checkpointed in Spark.
    ``merge_factor``: geometric merging factor of traces. ``partitions``: partitions of
    checkpointed batches (default: ``spark.sql.shuffle.partitions``). ``small_conf``: SQL
    settings for the statements of small epochs, whose cost is Spark's fixed overhead per
    task and per compiled stage rather than data (one shuffle partition, no whole-stage
    code generation, no broadcast joins: each broadcast is a Spark job of its own, while
    a statement whose relations are all read as one partition needs no exchange at all);
    they apply only while such a statement is planned.
    ``recompute_fraction``: a recursive component whose delete-and-rederive overdeletes more
    than this fraction of the tuples it holds is derived again from scratch instead (see
    :meth:`factflow.dataflow.recursion.Fixpoint.run`).
    """

    local_limit: int = 20_000
    merge_factor: int = 2
    partitions: int | None = None
    small_conf: tuple[tuple[str, str], ...] = (
        ("spark.sql.shuffle.partitions", "1"),
        ("spark.sql.codegen.wholeStage", "false"),
        ("spark.sql.autoBroadcastJoinThreshold", "-1"),
    )
    recompute_fraction: float = 0.5


@dataclass
class SparkJob:
    """One Spark job an epoch ran: its id, description (phase and query), duration, and the
    rows its stages read from stored batches (``rows_read``) and from shuffles."""

    id: int
    description: str | None
    tasks: int
    seconds: float | None
    rows_read: int = 0
    rows_shuffled: int = 0


@dataclass
class EpochReport:
    """What one epoch did: sizes, the Spark jobs it ran, and where the time went."""

    epoch: int
    operations: int | None
    changes: int
    queries: list[str]
    jobs: list[SparkJob]
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)
    merges: int = 0

    def describe(self) -> str:
        """Multi-line text: the epoch's figures and one line per Spark job."""
        lines = [f"epoch {self.epoch}: {self.operations} operations -> {self.changes} changes, "
                 f"{len(self.queries)} queries updated, {len(self.jobs)} Spark jobs, {self.seconds:.3f}s "
                 + " ".join(f"{k}={v:.3f}s" for k, v in self.phases.items())]
        for job in self.jobs:
            took = f"{job.seconds:.3f}s" if job.seconds is not None else "?"
            lines.append(f"  job {job.id} ({job.tasks} tasks, {took}, read {job.rows_read} rows, "
                         f"shuffled {job.rows_shuffled}): {job.description}")
        return "\n".join(lines)


def _spark_jobs(spark: SparkSession, group: str) -> list[SparkJob]:
    """The jobs Spark ran in a job group, from its status store."""
    sc = spark.sparkContext
    ids = sorted(sc.statusTracker().getJobIdsForGroup(group))
    store = sc._jsc.sc().statusStore()
    jobs = []
    for job_id in ids:
        try:
            data = store.job(job_id)
        except Exception:  # evicted from the store (spark.ui.retainedJobs)
            jobs.append(SparkJob(job_id, None, 0, None))
            continue
        description = data.description().get() if data.description().isDefined() else None
        seconds = None
        if data.completionTime().isDefined() and data.submissionTime().isDefined():
            seconds = (data.completionTime().get().getTime() - data.submissionTime().get().getTime()) / 1000.0
        read = shuffled = 0
        stages = data.stageIds().iterator()
        while stages.hasNext():
            try:
                stage = store.lastStageAttempt(stages.next())
            except Exception:  # a skipped stage has no attempt
                continue
            read += stage.inputRecords()
            shuffled += stage.shuffleReadRecords()
        jobs.append(SparkJob(job_id, description, data.numTasks(), seconds, read, shuffled))
    return jobs


class Engine:
    """An embedded factflow engine.

    ``Engine()`` starts Spark in local mode; ``Engine(spark=session)`` reuses a session (setting
    ``REQUIRED_SQL_CONF`` on it) and
    ``Engine(master="spark://...")`` connects to a cluster. ``state_dir`` holds Spark
    checkpoints (a temporary directory by default).
    """

    def __init__(self, spark: SparkSession | None = None, master: str | None = None,
                 state_dir: str | None = None, config: EngineConfig | None = None):
        self._owns_session = spark is None
        self.spark = spark if spark is not None else create_session(master=master)
        for key, value in REQUIRED_SQL_CONF.items():
            self.spark.conf.set(key, value)
        self.config = config or EngineConfig()
        partitions = self.config.partitions or int(self.spark.conf.get("spark.sql.shuffle.partitions"))
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="factflow-")
        self.policy = MergePolicy(self.config.merge_factor, self.config.local_limit, partitions,
                                  os.path.join(self.state_dir, "indexes"))
        self.schema = Schema()
        self.rules = RuleStore()
        self._arrangements: dict[int, AttributeArrangement] = {}
        self._tx_handles: dict[int, TraceHandle] = {}
        self._queries: dict[str, Query] = {}
        self._shared = SharedRules()
        self._epoch = 0
        self._lock = threading.RLock()
        self._closed = False
        self._query_counter = 0
        self._id = next(_ENGINE_IDS)
        self.epoch_log: list[EpochReport] = []

    # ------------------------------------------------------------ schema and rules
    @property
    def epoch(self) -> int:
        """The latest closed epoch (0 before any transaction)."""
        return self._epoch

    def create_attribute(self, name: str, type: str = "string", semantics: str = "set") -> Attribute:
        """Define an attribute: ``type`` is long, double, string, boolean, ref or instant;
        ``semantics`` is set (default), raw (multiset) or one (cardinality one)."""
        with self._lock:
            self._check_open()
            attribute = self.schema.create(name, type, semantics)
            if attribute.id not in self._arrangements:
                arrangement = AttributeArrangement(self.spark, attribute, self.policy, self._epoch + 1)
                self._arrangements[attribute.id] = arrangement
                self._tx_handles[attribute.id] = arrangement.forward.handle(self._epoch, "transactions")
            return attribute

    def register(self, rules: str) -> list[str]:
        """Store rules (EDN ``[[(name ?a ...) clause ...] ...]``); nothing is computed yet."""
        with self._lock:
            self._check_open()
            return self.rules.register(rules)

    def arrangement(self, name: str) -> AttributeArrangement:
        """The shared arrangement of an attribute (for inspection)."""
        return self._arrangements[self.schema.get(name).id]

    # ------------------------------------------------------------ transactions
    def transact(self, tx: Any) -> int:
        """Apply one transaction atomically as the next epoch; returns the epoch number.

        Every installed query is up to date when this returns. A rejected transaction
        changes nothing.
        """
        with self._lock:
            self._check_open()
            epoch = self._epoch + 1
            group = f"factflow-{self._id}-epoch-{epoch}"
            sc = self.spark.sparkContext
            sc.setJobGroup(group, f"factflow epoch {epoch}", interruptOnCancel=False)
            started = time.perf_counter()
            phases: dict[str, float] = {}
            try:
                sc.setJobDescription(f"epoch {epoch}: transaction")
                prepared = transaction.prepare(tx, self.schema, self.spark, self.config.local_limit)
                changed = self._apply_changes(prepared, epoch)
                phases["changes"] = time.perf_counter() - started
                mark = time.perf_counter()
                affected = [q for q in self._queries.values()
                            if any(self.schema.get(a).id in changed for a in q.dataflow.attributes)]
                outputs = self._evaluate([q.dataflow for q in affected], EpochContext(epoch, small=prepared.small, spark=self.spark),
                                         subscribed={q.dataflow.result for q in affected if q.has_subscribers})
                phases["queries"] = time.perf_counter() - mark
            except BaseException:
                self._rollback(epoch)
                raise
            self._epoch = epoch
            self._advance(epoch)
            errors = []
            for q in affected:
                out = outputs.get(q.dataflow.result)
                if out is not None and q.has_subscribers:
                    errors += q.deliver(epoch, out, OUT if OUT in out.columns else DIFF)
            mark = time.perf_counter()
            merges = self._maintain(changed, affected)
            phases["maintenance"] = time.perf_counter() - mark
            report = EpochReport(epoch, prepared.rows, sum(changed.values()), [q.name for q in affected],
                                 _spark_jobs(self.spark, group), time.perf_counter() - started, phases, merges)
            self.epoch_log.append(report)
            if log.isEnabledFor(logging.INFO):
                log.info(report.describe())
            if errors:
                raise FactflowError(f"epoch {epoch} was applied, but {len(errors)} subscriber(s) failed: {errors[0]!r}")
            return epoch

    def _apply_changes(self, prepared: transaction.PreparedTransaction, epoch: int) -> dict[int, int]:
        """Compute and append the effective changes; returns rows changed per attribute id."""
        tx_view = register_view(prepared.frame, prefix="ff_tx")
        cx = EpochContext(epoch, small=prepared.small, spark=self.spark)
        try:
            current = {a.id: self._current_state(cx, tx_view, a, epoch - 1) for a in prepared.attributes}
            sql = transaction.effective_changes(tx_view, prepared, current)
            changed = {} if sql is None else (
                self._apply_small(sql, prepared, epoch) if prepared.small else self._apply_bulk(sql, epoch))
        finally:
            for view in [tx_view] + cx.views:
                drop_view(self.spark, view)
        for aid, arrangement in self._arrangements.items():
            if aid not in changed:
                arrangement.advance_upper(epoch + 1)
        return changed

    def _current_state(self, cx: EpochContext, tx_view: str, attribute: Attribute, as_of: int) -> str:
        """The forward index of ``attribute`` as of ``as_of``: in a small epoch, only the
        rows of the entities the transaction touches, probed by key (see
        :mod:`factflow.dataflow.lookup`); otherwise the whole index."""
        handle = self._tx_handles[attribute.id]
        entities = (f"(SELECT DISTINCT `e`, CAST(1 AS BIGINT) AS `{DIFF}` FROM {tx_view} "
                    f"WHERE `a` = {attribute.id} AND `e` IS NOT NULL)")
        probed = probe(cx, handle, entities, [("e", Kind.LONG)], [("e", "e")], [("v", "v")], as_of, how="semi")
        if probed is None:
            return handle.read(as_of)
        return f"(SELECT `e`, `v`, `{TRACE_DIFF}` AS `{DIFF}` FROM {probed})"

    @contextmanager
    def _small_statements(self):
        """Plan the statements inside with ``config.small_conf`` (restored afterwards)."""
        conf = self.spark.conf
        saved = [(key, conf.get(key, None)) for key, _ in self.config.small_conf]
        for key, value in self.config.small_conf:
            conf.set(key, value)
        try:
            yield
        finally:
            for key, value in saved:
                if value is None:
                    conf.unset(key)
                else:
                    conf.set(key, value)

    def _apply_small(self, sql: str, prepared: transaction.PreparedTransaction, epoch: int) -> dict[int, int]:
        self.spark.sparkContext.setJobDescription(f"epoch {epoch}: effective changes")
        with self._small_statements():
            table = self.spark.sql(sql).toArrow()
        self._raise_errors(table.filter(pc.is_valid(table.column(transaction.ERR))))
        rows = table.filter(pc.is_null(table.column(transaction.ERR)))
        changed: dict[int, int] = {}
        for attribute in prepared.attributes:
            part = rows.filter(pc.equal(rows.column("a"), pa.scalar(attribute.id, pa.int32())))
            if part.num_rows == 0:
                continue
            slot = transaction.SLOT[attribute.kind]
            frame = part.select(["e", slot, DIFF]).rename_columns(["e", "v", DIFF]).to_pandas()
            self._arrangements[attribute.id].apply_pandas(frame, epoch)
            changed[attribute.id] = len(frame)
        return changed

    def _apply_bulk(self, sql: str, epoch: int) -> dict[int, int]:
        wide = self.spark.sql(sql).persist()
        changed: dict[int, int] = {}
        try:
            self.spark.sparkContext.setJobDescription(f"epoch {epoch}: validate bulk transaction")
            summary = (wide.groupBy("a").agg(
                F.sum(F.col(transaction.ERR).isNull().cast("long")).alias("rows"),
                F.count(transaction.ERR).alias("errors"),
                F.slice(F.collect_list(transaction.ERR), 1, 5).alias("examples"),
            ).collect())
            if any(r["errors"] for r in summary):
                self._raise_errors(pa.table({
                    "a": [r["a"] for r in summary for _ in r["examples"]],
                    transaction.ERR: [m for r in summary for m in r["examples"]],
                }), total=sum(r["errors"] for r in summary))
            for r in summary:
                if not r["rows"]:
                    continue
                attribute = self.schema.by_id(r["a"])
                slot = transaction.SLOT[attribute.kind]
                delta = wide.where((F.col("a") == attribute.id) & F.col(transaction.ERR).isNull()) \
                    .select("e", F.col(slot).alias("v"), DIFF)
                self.spark.sparkContext.setJobDescription(f"epoch {epoch}: arrange {attribute.name}")
                changed[attribute.id] = self._arrangements[attribute.id].apply_frame(delta, epoch)
        finally:
            wide.unpersist()
        return changed

    def _raise_errors(self, table: pa.Table, total: int | None = None) -> None:
        if table.num_rows == 0:
            return
        messages: list[str] = []
        for a, msg in zip(table.column("a").to_pylist(), table.column(transaction.ERR).to_pylist()):
            prefix = f"{self.schema.by_id(a).name}: " if a is not None and a >= 0 and not msg.startswith(":") else ""
            if prefix + msg not in messages:
                messages.append(prefix + msg)
        raise TransactionError(transaction.format_errors(messages, total or len(messages)))

    # ------------------------------------------------------------ dataflow evaluation
    def _evaluate(self, dataflows, cx: EpochContext, subscribed: set,
                  settled: Sequence[Node] = ()) -> dict[Stateful, pd.DataFrame]:
        """Compute and commit the pending state of ``dataflows`` for one evaluation
        (operators shared by several dataflows once; ``settled`` ones not at all).

        Returns the output rows of result operators (all of them for small epochs, those
        with subscribers otherwise).
        """
        nodes: list[Stateful] = []
        for df in dataflows:
            nodes += [n for n in df.stateful if n not in nodes and n not in settled]
        if not nodes:
            return {}
        names = ", ".join(df.name for df in dataflows)
        what = f"install {names}" if cx.install else f"epoch {cx.epoch}: queries {names}"
        return Evaluation(self.spark, cx, self._small_statements,
                          self.config.recompute_fraction).run(nodes, subscribed, what)

    @staticmethod
    def _state_of(dataflows: Sequence[Dataflow]) -> tuple[list[TraceHandle], list[Trace]]:
        """The handles and traces held by ``dataflows`` and by the shared rules they read, each once."""
        handles = [h for df in dataflows for h in df.handles()]
        traces = [t for df in dataflows for t, _ in df.private_traces()]
        for entry in dict.fromkeys(e for df in dataflows for e in df.shared_rules()):
            handles += entry.handles
            traces += [t for t, _ in entry.traces]
        return handles, traces

    def _advance(self, epoch: int) -> None:
        for h in self._tx_handles.values():
            h.advance(epoch)
        handles, traces = self._state_of([q.dataflow for q in self._queries.values()])
        for h in handles:
            h.advance(epoch)
        for trace in traces:
            trace.advance_upper(epoch + 1)

    def _maintain(self, changed: dict[int, int], affected: Sequence[Query]) -> int:
        merges = 0
        sc = self.spark.sparkContext
        for aid in changed:
            sc.setJobDescription(f"epoch {self._epoch}: merge {self.schema.by_id(aid).name}")
            merges += self._arrangements[aid].maintain()
        for trace in self._state_of([q.dataflow for q in affected])[1]:
            sc.setJobDescription(f"epoch {self._epoch}: merge {trace.name}")
            merges += trace.maintain()
        return merges

    def _rollback(self, epoch: int) -> None:
        for arrangement in self._arrangements.values():
            arrangement.truncate(epoch)
        for trace in self._state_of([q.dataflow for q in self._queries.values()])[1]:
            trace.truncate(epoch)

    # ------------------------------------------------------------ queries
    def query(self, query: str, name: str | None = None, inputs: Sequence[Any] = (), join: str = "auto",
              semantics: str = "set") -> Query:
        """Register and install a query (interest): its dataflow reads the state as of now.

        ``inputs`` supply the ``:in`` bindings after ``$``; ``join`` picks the join strategy
        (auto, binary, delta, wco); ``semantics`` is ``set`` (Datomic) or ``multiset``
        (derivation counts).
        """
        with self._lock:
            self._check_open()
            if semantics not in ("set", "multiset"):
                raise QueryError(f"semantics must be 'set' or 'multiset', not {semantics!r}")
            if name is None:
                self._query_counter += 1
                name = f"q{self._query_counter}"
                while name in self._queries:
                    self._query_counter += 1
                    name = f"q{self._query_counter}"
            elif not isinstance(name, str) or not name:
                raise QueryError("a query name must be a non-empty string")
            if name in self._queries:
                raise QueryError(f"a query named {name!r} is already installed")
            parsed = parse_query(query)
            pc = PlanContext(self.spark, self.schema, self._arrangement_of, self.rules, name, self._epoch,
                             self.policy, semantics, shared_rules=self._shared)
            sc = self.spark.sparkContext
            sc.setJobGroup(f"factflow-{self._id}-install-{name}", f"install query {name}", interruptOnCancel=False)
            try:
                dataflow = synthesize(parsed, tuple(inputs), pc, join)
                cx = EpochContext(self._epoch, install=True)
                reused = [e for e in dataflow.shared_rules() if e.installed]
                for entry in reused:
                    entry.present_as_installed(cx)
                self._evaluate([dataflow], cx, subscribed=set(), settled=[n for e in reused for n in e.stateful()])
                handles, traces = self._state_of([dataflow])
                for trace in traces:
                    trace.maintain()
            except BaseException:
                pc.release()
                raise
            self._shared.commit(name, dataflow.shared_rules())
            for h in handles:
                h.advance(self._epoch)
            handle = Query(self, dataflow, self._epoch)
            self._queries[name] = handle
            log.info("installed query %s at epoch %d (%s join)", name, self._epoch, dataflow.strategy)
            return handle

    def _arrangement_of(self, attribute: Attribute) -> AttributeArrangement:
        return self._arrangements[attribute.id]

    def _uninstall(self, query: Query) -> None:
        with self._lock:
            if self._queries.get(query.name) is query:
                del self._queries[query.name]
                self._shared.release(query.name)
            query.dataflow.close()
            query.closed = True

    @property
    def queries(self) -> dict[str, Query]:
        """Installed queries by name."""
        return dict(self._queries)

    # ------------------------------------------------------------ introspection
    def stats(self) -> dict[str, Any]:
        """Tuples (update rows, counted exactly) held in arrangements.

        ``shared_tuples`` and ``arrangements``: the shared attribute indexes (forward,
        reverse and count faces), per index. ``query_tuples``: per query, the rows of its
        private intermediate state (join-at-a-time intermediates, negation sets, goal-directed
        fixpoints); ``result_tuples``: per query, its result trace. ``query_arrangements``:
        per query, every private trace with its role and rows. ``shared_rules``: per rule
        relation shared by queries (see :mod:`factflow.planner.shared`), its rules, the
        queries reading it, its rows and its traces.
        """
        with self._lock:
            arrangements = {}
            for arrangement in self._arrangements.values():
                for trace in arrangement.traces.values():
                    arrangements[trace.name] = trace.tuples
            return {
                "epoch": self._epoch,
                "shared_tuples": sum(arrangements.values()),
                "query_tuples": {n: q.dataflow.tuples("intermediate") for n, q in self._queries.items()},
                "result_tuples": {n: q.dataflow.tuples("result") for n, q in self._queries.items()},
                "arrangements": arrangements,
                "query_arrangements": {n: {t.name: (role, t.tuples) for t, role in q.dataflow.private_traces()}
                                       for n, q in self._queries.items()},
                "shared_rules": {e.name: {"rules": list(e.rules), "users": sorted(e.users), "tuples": e.tuples(),
                                          "arrangements": {t.name: (role, t.tuples) for t, role in e.traces}}
                                 for e in self._shared.entries()},
            }

    # ------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed")

    def close(self) -> None:
        """Close every query, release all state, and stop Spark if the engine started it."""
        with self._lock:
            if self._closed:
                return
            for q in list(self._queries.values()):
                q.close()
            for arrangement in self._arrangements.values():
                arrangement.close()
            self._arrangements = {}
            self._closed = True
            if self._owns_session:
                self.spark.stop()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
