"""What one evaluation of the dataflows sees: the epoch, the mode, and the SQL built so far."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Callable

from factflow.arrangement.views import register_view
from factflow.dataflow.statement import Statement

if TYPE_CHECKING:  # pragma: no cover
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
        self._probes: bool | None = None  # None: probe in small epochs only
        self._single_partition: bool | None = None  # None: as small
        self._memo: dict[tuple[int, str], str | None] = {}
        self._sql = Statement(single_partition=small)
        #: probe products and the chains that make them (see :func:`factflow.dataflow.lookup.probe_product`)
        self.chains: dict[str, tuple["DataFrame", "ProbeChain"]] = {}

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
        """A relation of this evaluation as a lazy DataFrame (to apply a task-side function)."""
        return self.spark.sql(self.statement(f"SELECT * FROM {relation}"))

    def register(self, frame: "DataFrame") -> str:
        """Name a DataFrame for the SQL of this evaluation (dropped when it ends)."""
        view = register_view(frame, prefix="ff_q")
        self.views.append(view)
        return view

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
