"""What an engine holds, and how that state moves from one epoch to the next.

The state is the shared arrangement of every attribute (with the handle through which
transactions read it), the installed queries, the rule relations they share, and the
latest closed epoch. An epoch first appends its changes past that epoch (see
:mod:`factflow.engine.apply` and :meth:`EngineState.evaluate`); then either

* it commits: :meth:`EngineState.advance` moves every reader's handle to the new epoch
  (or, for a slack, to an earlier one: see :mod:`factflow.engine.history`), allowing
  compaction, and :meth:`EngineState.maintain` merges the batches of what
  changed (see :mod:`factflow.engine.maintenance`); or
* it fails: :meth:`EngineState.rollback` truncates every trace back to the closed epoch,
  so no partial epoch is ever visible.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Iterator, Sequence

import pandas as pd
from pyspark.sql import SparkSession

from factflow.arrangement import bound
from factflow.arrangement.attribute import AttributeArrangement
from factflow.arrangement.trace import MergePolicy, StoredMerge, Trace, TraceHandle
from factflow.dataflow.context import EpochContext
from factflow.dataflow.nodes import Node, Stateful
from factflow.engine.apply import small_statements
from factflow.engine.config import EngineConfig
from factflow.engine.definition import QueryDefinition
from factflow.engine.evaluation import Evaluation
from factflow.engine.feeds import AttributeFeed
from factflow.engine.history import History, private_handles
from factflow.engine.offsets import SourceOffsets
from factflow.engine.speculation import Guesses
from factflow.errors import QueryError
from factflow.model.schema import Attribute, Schema
from factflow.planner.shared import SharedRules
from factflow.engine.dataflow import Dataflow

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.clock import EventClock
    from factflow.engine.query import Query

__all__ = ["EngineState"]


class EngineState:
    """An engine's schema, arrangements, installed queries, shared rules, latest closed epoch,
    the offsets applied per source, the closed epochs kept readable (``history``), in
    event time the frontier and the transactions buffered for open times (``clock``), and
    the binder whose kept plans small epochs reuse (``binder``, None where the session
    cannot bind rows: see :mod:`factflow.arrangement.bound`), and the one small loads bind
    their rows to (``load_binder``, used by one load at a time: :meth:`loading`)."""

    def __init__(self, spark: SparkSession, config: EngineConfig, policy: MergePolicy):
        self.spark = spark
        self.config = config
        self.policy = policy
        self.schema = Schema()
        self.arrangements: dict[int, AttributeArrangement] = {}
        self.tx_handles: dict[int, TraceHandle] = {}
        self.queries: dict[str, Query] = {}
        self.feeds: dict[int, AttributeFeed] = {}
        self.shared = SharedRules()
        self.epoch = 0
        self.offsets = SourceOffsets(config.offset_history)
        self.history = History()
        self.clock: EventClock | None = None
        self._query_counter = 0
        self.unmaintained: list[tuple[int, set[int], list[Query]]] = []  # (epoch, attribute ids, queries)
        #: what wrong guesses of small epochs' changes taught (:mod:`factflow.engine.speculation`)
        self.guesses = Guesses()
        self.binder = bound.Binder(spark) if config.reuse_plans and bound.supported(spark) else None
        self.load_binder: bound.Binder | None = None  # made by the first load (:meth:`loading`)
        self._load_lock = threading.Lock()

    @contextmanager
    def loading(self) -> Iterator[None]:
        """The block a load runs in (:mod:`factflow.io.tables`): one load at a time, the rows
        the driver holds bound to slots of ``load_binder``, whose kept plans the next load of
        the same tables reuses (a load's statements are few: a quarter of the epochs'
        binder's memory)."""
        with self._load_lock:
            if self.load_binder is None and self.binder is not None:
                self.load_binder = bound.Binder(self.spark, capacity=8, memory=self.binder.memory // 4)
            with bound.binding(self.load_binder):
                try:
                    yield
                finally:
                    if self.load_binder is not None:
                        self.load_binder.take_on_driver()  # a load's statements belong to no epoch's report

    # ------------------------------------------------------------ what is held
    def feed(self, attribute: Attribute) -> AttributeFeed:
        """The feed of an attribute's changes (created on first use)."""
        return self.feeds.setdefault(attribute.id, AttributeFeed(attribute))

    def watched(self, attribute_id: int) -> bool:
        """Whether anyone subscribes to the changes of an attribute."""
        feed = self.feeds.get(attribute_id)
        return bool(feed and feed.subscribers)

    def arrange(self, attribute: Attribute) -> None:
        """Give a new attribute its shared arrangement, read by transactions from the next epoch on."""
        if attribute.id not in self.arrangements:
            arrangement = AttributeArrangement(self.spark, attribute, self.policy, self.epoch + 1)
            self.arrangements[attribute.id] = arrangement
            self.tx_handles[attribute.id] = arrangement.forward.handle(self.epoch, "transactions")

    def arrangement_of(self, attribute: Attribute) -> AttributeArrangement:
        """The shared arrangement of ``attribute``."""
        return self.arrangements[attribute.id]

    def durable_queries(self) -> list[QueryDefinition]:
        """The definitions of the installed durable queries, in install order."""
        return [q.definition for q in self.queries.values() if q.durable]

    def query_name(self, name: str | None) -> str:
        """``name`` checked for a new query, or the next free ``q<n>`` when it is None."""
        if name is None:
            self._query_counter += 1
            name = f"q{self._query_counter}"
            while name in self.queries:
                self._query_counter += 1
                name = f"q{self._query_counter}"
        elif not isinstance(name, str) or not name:
            raise QueryError("a query name must be a non-empty string")
        if name in self.queries:
            raise QueryError(f"a query named {name!r} is already installed")
        return name

    @staticmethod
    def held_by(dataflows: Sequence[Dataflow]) -> tuple[list[TraceHandle], list[Trace]]:
        """The handles and traces held by ``dataflows`` and by the shared rules they read, each once."""
        handles = [h for df in dataflows for h in df.handles()]
        traces = [t for df in dataflows for t, _ in df.private_traces()]
        for entry in dict.fromkeys(e for df in dataflows for e in df.shared_rules()):
            handles += entry.handles
            traces += [t for t, _ in entry.traces]
        return handles, traces

    # ------------------------------------------------------------ moving between epochs
    def evaluate(self, dataflows: Sequence[Dataflow], cx: EpochContext, subscribed: set,
                 settled: Sequence[Node] = (), check: str | None = None) -> tuple[dict[Stateful, pd.DataFrame], list[str]]:
        """Compute and commit the pending state of ``dataflows`` for one evaluation
        (operators shared by several dataflows once; ``settled`` ones not at all).

        Returns the output rows of result operators (all of them for small epochs, those
        with subscribers otherwise), and the traces whose rows a small epoch kept in Spark
        because they exceeded what a fetch may bring to the driver. ``check`` names the
        relation checking the epoch's guessed changes (see :mod:`factflow.engine.speculation`).
        """
        nodes: list[Stateful] = []
        for df in dataflows:
            nodes += [n for n in df.stateful if n not in nodes and n not in settled]
        if not nodes and check is None:
            return {}, []
        names = ", ".join(df.name for df in dataflows)
        what = f"install {names}" if cx.install else f"epoch {cx.epoch}: queries {names}"
        evaluation = Evaluation(self.spark, cx, partial(small_statements, self.spark, self.config.small_conf),
                                self.config.fetch_limit, self.policy.directory, self.config.recompute_fraction,
                                self.config.local_limit, check)
        return evaluation.run(nodes, subscribed, what), evaluation.kept

    def advance(self, epoch: int) -> None:
        """Move every reader to the committed ``epoch``, allowing traces to compact up to it;
        the transactions' handle on an attribute with slack, and a query's handle on its result
        with slack, only as far as the slack lets them (see :mod:`factflow.engine.history`)."""
        slacks = [self.schema.by_id(aid).slack for aid in self.tx_handles]
        queries = list(self.queries.values())
        self.history.close(epoch, max(slacks + [q.slack for q in queries] + [0]))
        for h, slack in zip(self.tx_handles.values(), slacks):
            h.advance(self.history.frontier(slack))
        handles, traces = self.held_by([q.dataflow for q in queries])
        for h in handles:
            h.advance(epoch)
        for trace in traces:
            trace.advance_upper(epoch + 1)
        for q in queries:
            result = q.dataflow.result.handle
            for h in private_handles(q.dataflow.stateful):
                h.advance(self.history.frontier(q.slack) if h is result else epoch)

    def defer_maintenance(self, epoch: int, changed: dict[int, int], affected: Sequence[Query]) -> None:
        """Record the traces ``epoch`` appended to (the attributes ``changed`` and the queries
        ``affected``, or a query just installed), for :meth:`maintain` to merge after delivery."""
        self.unmaintained.append((epoch, set(changed), list(affected)))

    def maintain(self) -> tuple[int, list[StoredMerge]]:
        """Merge the local batches of the arrangements and query traces that epochs and
        installs since the last call appended to; returns the merges done and the merges
        left that need Spark (stored batches, index files), for the caller to run (see
        :mod:`factflow.engine.maintenance`)."""
        pending, self.unmaintained = self.unmaintained, []
        if not pending:
            return 0, []
        changed = set().union(*(aids for _, aids, _ in pending))
        queries = {id(q): q for _, _, qs in pending for q in qs if self.queries.get(q.name) is q}
        traces = [t for aid in sorted(changed) if aid in self.arrangements
                  for t in self.arrangements[aid].traces.values()]
        traces += self.held_by([q.dataflow for q in queries.values()])[1]
        merges, stored = 0, []
        try:
            for trace in traces:
                merges += trace.merge_local()
                later = trace.stored_merge()
                if later is not None:
                    stored.append(later)
        except BaseException:
            for later in stored:  # unpin their snapshots
                later.abandon()
            raise
        return merges, stored

    def rollback(self, epoch: int) -> None:
        """Undo the failed ``epoch``: drop every batch appended for it."""
        for arrangement in self.arrangements.values():
            arrangement.truncate(epoch)
        for trace in self.held_by([q.dataflow for q in self.queries.values()])[1]:
            trace.truncate(epoch)

    def close(self) -> None:
        """Release every arrangement and the binder (queries are closed by the engine first)."""
        for binder in (self.binder, self.load_binder):
            if binder is not None:
                binder.close()
        for arrangement in self.arrangements.values():
            arrangement.close()
        self.arrangements = {}
