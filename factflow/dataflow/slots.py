"""Slots: what an operator will hold once its query is installed, as plain data.

Planning allocates nothing (see :mod:`factflow.planner.plan`). Where an operator reads a
shared arrangement, keeps private state or reads a constant relation, the planner gives it
a *slot* describing what installing will allocate: a handle on one face of an attribute's
arrangement (:class:`HandleSlot`), a private trace (:class:`TraceSlot`) or the rows of a
constant relation (:class:`RowsSlot`). Every slot names its *owner*: :data:`QUERY` (the
query being installed, whatever its name) or the name of a shared rule
(:mod:`factflow.planner.shared`). Installing hands each operator an :class:`Allocator`
whose allocations it binds (``Node.bind``).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from factflow.model.types import Kind

if TYPE_CHECKING:  # pragma: no cover
    from factflow.arrangement.trace import Trace, TraceHandle

__all__ = ["QUERY", "HandleSlot", "TraceSlot", "RowsSlot", "Allocator", "plain"]

#: the owner of what a query holds itself (its name is given at install)
QUERY = "query"

Columns = tuple[tuple[str, Kind], ...]


def plain(value: Any) -> Any:
    """``value`` as JSON data: instants as ``{"instant": iso}``, strings (keywords too) as
    plain strings, sequences as lists; numbers, booleans and None as they are."""
    if isinstance(value, _dt.datetime):
        return {"instant": value.isoformat()}
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Kind):
        return value.value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    raise TypeError(f"no plain form for {value!r}")


def _columns(columns: Columns) -> list:
    return [[name, kind.value] for name, kind in columns]


@dataclass(frozen=True)
class HandleSlot:
    """A handle on face ``face`` of the shared arrangement of an attribute (by name and id)."""

    attribute: str
    attribute_id: int
    face: str
    owner: str

    @property
    def key(self) -> tuple[str, ...]:
        """The key of the face's index (``e`` or ``v``)."""
        return ("e",) if self.face in ("forward", "count_e") else ("v",)

    def to_data(self) -> dict:
        """The slot as plain data."""
        return {"handle": self.attribute, "attribute_id": self.attribute_id, "face": self.face, "owner": self.owner}


@dataclass(frozen=True)
class TraceSlot:
    """A private trace: its label (unique per owner), layout and role ('intermediate' or 'result')."""

    label: str
    columns: Columns
    key: tuple[str, ...]
    role: str
    owner: str

    def to_data(self) -> dict:
        """The slot as plain data."""
        return {"trace": self.label, "columns": _columns(self.columns), "key": list(self.key), "role": self.role,
                "owner": self.owner}


@dataclass(frozen=True)
class RowsSlot:
    """A constant relation: its columns and distinct rows (values converted to the columns' kinds)."""

    columns: Columns
    rows: tuple[tuple, ...]
    owner: str

    def to_data(self) -> dict:
        """The slot as plain data."""
        return {"rows": [plain(list(r)) for r in self.rows], "columns": _columns(self.columns), "owner": self.owner}


class Allocator(Protocol):
    """What installing gives operators to bind their slots to (see :mod:`factflow.engine.allocation`)."""

    def owns(self, owner: str) -> bool:
        """Whether this install allocates for ``owner`` (else its operators are bound already)."""

    def handle(self, slot: HandleSlot) -> "TraceHandle":
        """A handle on the slot's index, at the install epoch."""

    def trace(self, slot: TraceSlot) -> tuple["Trace", str]:
        """A new private trace, and the name of the owner its handles are held for."""

    def view(self, slot: RowsSlot) -> str:
        """The name of a temp view holding the slot's rows (with ``_diff``)."""
