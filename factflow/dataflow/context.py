"""What one evaluation of the dataflows sees: the epoch, the mode, and the SQL built so far."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Callable

from factflow.arrangement.views import PROBE_VIEW_PREFIX, drop_view, register_view
from factflow.dataflow.statement import Statement

if TYPE_CHECKING:  # pragma: no cover
    from collections import Counter

    from pyspark.sql import DataFrame, SparkSession

    from factflow.arrangement.index import ProbeChain

__all__ = ["Version", "EpochContext"]


class Version(Enum):
    """Which state of a collection an operator reads during epoch ``t``."""

    OLD = "old"  # as of t - 1 (before this epoch's changes)
    NEW = "new"  # as of t (with this epoch's changes)


class EpochContext:
    """One evaluation: the epoch's changes (``install=False``) or a query's initial state.

    In *install* mode the whole state as of ``epoch`` counts as the change and the old
    state is empty, so the same delta rules compute a query's initial result.
    ``small`` says every base change of this epoch is small (held on the driver), or, for
    an install, that all the state the query reads is: its statements then run in one
    partition without shuffles or broadcasts (every named subquery coalesced, see
    :class:`Statement`; settings in ``EngineConfig.small_conf``), and a small epoch's
    operators read large traces by probing their keys (:mod:`factflow.dataflow.lookup`).

    Operators describe their work as named SQL subqueries (:meth:`define`); a statement
    (:meth:`statement`) puts the ones it needs into a ``WITH`` clause, so each is written
    once however often it is referenced.
    """

    def __init__(self, epoch: int, spark: "SparkSession", install: bool = False, small: bool = False):
        self.epoch = epoch
        self.install = install
        self.small = small
        self.spark = spark
        self.views: list[str] = []  # temp views registered for this evaluation (dropped after it)
        self.probes_registered: list[tuple[str, "DataFrame"]] = []  # probes' views and DataFrames
        self.persisted: list["DataFrame"] = []  # the probes persisted for this evaluation
        self._probes: bool | None = None  # None: probe in small epochs only
        self._single_partition: bool | None = None  # None: as small
        self._memo: dict[tuple[int, str], str | None] = {}
        self._sql = Statement(single_partition=small)
        #: probe products, with the relation their chain reads and the chain (see
        #: :func:`factflow.dataflow.lookup.probe_product`)
        self.chains: dict[str, tuple[str, "ProbeChain"]] = {}

    @property
    def old_epoch(self) -> int:
        """The epoch the OLD version reads as of."""
        return self.epoch - 1

    @property
    def probes(self) -> bool:
        """Whether operators may probe traces by key: in small epochs, and in an install's
        pipeline that starts from a constant (see :meth:`child`)."""
        return self.small and not self.install if self._probes is None else self._probes

    @property
    def single_partition(self) -> bool:
        """Whether the subqueries defined here are read as one partition (see
        :class:`Statement`): in small epochs, unless a :meth:`child` says otherwise."""
        return self.small if self._single_partition is None else self._single_partition

    def define(self, sql: str) -> str:
        """Name a subquery; returns the name to use in FROM clauses."""
        return self._sql.define(sql, self._single_partition)

    def frame(self, relation: str) -> "DataFrame":
        """A relation of this evaluation as a lazy DataFrame (to apply a task-side function
        and register the result as a view): its subqueries all written in place
        (:meth:`view_statement`)."""
        return self.spark.sql(self.view_statement(f"SELECT * FROM {relation}"))

    def register(self, frame: "DataFrame") -> str:
        """Name a probe's DataFrame for the SQL of this evaluation (dropped when it ends;
        see :meth:`persist_shared`)."""
        view = register_view(frame, prefix=PROBE_VIEW_PREFIX)
        self.views.append(view)
        self.probes_registered.append((view, frame))
        return view

    def reads_probe(self, view: str, frame: "DataFrame") -> str:
        """Note that this evaluation reads the probe ``frame`` named ``view`` by someone else
        (a binder's parameterized probe, see :func:`factflow.dataflow.lookup._run`): it may be
        persisted for it (:meth:`persist_shared`), but its view is not dropped when it ends."""
        self.probes_registered.append((view, frame))
        return view

    def persist_shared(self, reads: "Callable[[], Counter[str]]") -> bool:
        """Persist, until this evaluation ends, every probe that a statement about to run
        reads more than once, so that it runs once; ``reads()`` counts the views the
        statement's analysed plan reads (:func:`factflow.arrangement.bound.analysed_views`).

        A probe's view is a plan of its own, and a probe whose prefix reads another copies
        that plan: in a small epoch of TPC-H's Q1 (a join at a time, each step probing the
        one below and keeping its state) 13 probes ran 43 times in one statement. Spark
        computes a persisted plan where the statement first reads it and reads what it
        stored everywhere else. A probe read once is left alone: storing its rows costs
        more than it saves (persisting every probe made the heavier epochs of the
        worst-case optimal triangles over oregon1 a fifth slower).

        Returns whether the statement reads a persisted probe (a plan that does is run again
        in later epochs only on the driver, which computes the probe anew; see
        :mod:`factflow.arrangement.bound`)."""
        if not self.probes_registered:
            return False
        counts = reads()
        held = {id(p) for p in self.persisted}
        for view, probe in self.probes_registered:
            if id(probe) not in held and counts[view] > 1:
                self.persisted.append(probe.persist())
                held.add(id(probe))
        return any(counts[view] for view, probe in self.probes_registered if id(probe) in held)

    def release(self) -> None:
        """Drop the views registered for this evaluation and unpersist its probes."""
        for view in self.views:
            drop_view(self.spark, view)
        for frame in self.persisted:
            frame.unpersist()
        self.views.clear()
        self.probes_registered.clear()
        self.persisted.clear()

    def memo(self, owner: object, what: str, build: Callable[[], str | None]) -> str | None:
        """Build a relation once per evaluation, keyed by operator and purpose."""
        key = (id(owner), what)
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def child(self, probes: bool | None = None, single_partition: bool | None = None) -> "EpochContext":
        """A context for one step of an iterative operator (or one selective pipeline): the
        same epoch, statement and memoized relations, whose memo entries it may then
        replace without affecting this one; ``probes`` overrides whether it probes, and
        ``single_partition`` whether its subqueries are read as one partition (a step over
        large relations in a small epoch is better spread over the session's partitions)."""
        sub = EpochContext(self.epoch, self.spark, self.install, self.small)
        sub._memo = dict(self._memo)
        sub._sql = self._sql
        sub.views = self.views
        sub.probes_registered = self.probes_registered
        sub.persisted = self.persisted
        sub.chains = self.chains
        sub._probes = self._probes if probes is None else probes
        sub._single_partition = self._single_partition if single_partition is None else single_partition
        return sub

    def set(self, owner: object, what: str, relation: str | None) -> None:
        """Replace a memoized relation (with a materialized equivalent)."""
        self._memo[(id(owner), what)] = relation

    def statement(self, sql: str) -> str:
        """``sql`` preceded by the named subqueries it (transitively) uses."""
        return self._sql.render(sql)

    def view_statement(self, sql: str) -> str:
        """``sql`` with the named subqueries it uses written in place, without a ``WITH``
        clause: the definition of a view that other statements read. Spark 4.1's optimizer
        mishandles a CTE inside a view that a statement reads more than once or that is
        persisted (:meth:`persist_shared`): it inlined one copy's definition under another
        copy's references (a worst-case optimal stage of TPC-H's Q5 failed with "Could not
        find _w"), or failed to find the CTE (``PushdownPredicatesAndPruneColumnsForCTEDef``).
        Spark inlines such entries wherever they are read anyway."""
        return self._sql.render(sql, inline=True)
