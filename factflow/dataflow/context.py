"""What one evaluation of the dataflows sees: the epoch, the mode, and the SQL built so far."""

from __future__ import annotations

from enum import Enum
from typing import Callable

from factflow.dataflow.statement import Statement

__all__ = ["Version", "EpochContext"]


class Version(Enum):
    """Which state of a collection an operator reads during epoch ``t``."""

    OLD = "old"  # as of t - 1 (before this epoch's changes)
    NEW = "new"  # as of t (with this epoch's changes)


class EpochContext:
    """One evaluation: the epoch's changes (``install=False``) or a query's initial state.

    In *install* mode the whole state as of ``epoch`` counts as the change and the old
    state is empty, so the same delta rules compute a query's initial result.
    ``small`` says every base change of this epoch is small (held on the driver), so
    operators may hint broadcasts of change-derived relations.

    Operators describe their work as named SQL subqueries (:meth:`define`); a statement
    (:meth:`statement`) puts the ones it needs into a ``WITH`` clause, so each is written
    once however often it is referenced.
    """

    def __init__(self, epoch: int, install: bool = False, small: bool = False):
        self.epoch = epoch
        self.install = install
        self.small = small
        self._memo: dict[tuple[int, str], str | None] = {}
        self._sql = Statement()

    @property
    def old_epoch(self) -> int:
        """The epoch the OLD version reads as of."""
        return self.epoch - 1

    def define(self, sql: str) -> str:
        """Name a subquery; returns the name to use in FROM clauses."""
        return self._sql.define(sql)

    def memo(self, owner: object, what: str, build: Callable[[], str | None]) -> str | None:
        """Build a relation once per evaluation, keyed by operator and purpose."""
        key = (id(owner), what)
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def child(self) -> "EpochContext":
        """A context for one step of an iterative operator: the same epoch, statement and
        memoized relations, whose memo entries it may then replace without affecting this one."""
        sub = EpochContext(self.epoch, self.install, self.small)
        sub._memo = dict(self._memo)
        sub._sql = self._sql
        return sub

    def set(self, owner: object, what: str, relation: str | None) -> None:
        """Replace a memoized relation (with a materialized equivalent)."""
        self._memo[(id(owner), what)] = relation

    def statement(self, sql: str) -> str:
        """``sql`` preceded by the named subqueries it (transitively) uses."""
        return self._sql.render(sql)
