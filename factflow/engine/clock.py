"""Event time: the frontier, and the transactions buffered for the times still open.

An engine created with ``Engine(time="event")`` numbers its epochs by the times its
transactions carry instead of by arrival (see docs/event-time-and-history.md):

* ``transact(tx, time=T)`` checks the transaction as far as it can without the state
  (operations, attributes, value types, and conflicts: below) and *buffers* it for time
  ``T``; it returns ``T``. Times are positive integers (epoch 0 is the empty state before
  any), or ``datetime``\\ s, taken as microseconds since 1970-01-01 UTC (naive ones as UTC).
  Transactions may arrive in any order of time, as long as their time is at or after the
  *frontier*; one for an earlier time raises :class:`factflow.LateTransactionError`.
* ``advance_to(T)`` closes every time before ``T``: the transactions buffered for each
  closed time are applied together as ONE epoch numbered by that time, in increasing time
  order, so every result and subscriber sees exactly the facts of the closed times. The
  frontier becomes ``T`` (it never moves back; an earlier ``T`` changes nothing).
* Transactions of one time must commute: applying them together has to equal applying
  them in any order. So a transaction that asserts a fact another one of the same time
  retracts (or the other way round), or gives a cardinality-one attribute of an entity a
  value other than the one another of the same time gives it, is rejected when it
  arrives (a ``TransactionError`` naming the fact and time), as is one that conflicts
  with itself; the transactions buffered before stay. What is buffered is therefore
  always applicable, and the epoch of a time does not depend on arrival order.
* ``source``/``offset`` keep input exactly-once: the offset is recorded (and, in a durable
  engine, logged) with the buffered transaction, so a replay is skipped and returns its time.

This module keeps the buffers and the frontier; :mod:`factflow.engine.durability` logs
them, :func:`buffer` and :func:`advance` are what the engine's methods run.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Callable

from factflow.engine import transaction
from factflow.engine.group import Touches, touches
from factflow.engine.transaction import WideOps
from factflow.errors import LateTransactionError, TransactionError
from factflow.model.schema import Schema
from factflow.model.types import coerce_value

__all__ = ["Buffered", "EventClock", "event_time", "buffer", "advance"]

_EPOCH = _dt.datetime(1970, 1, 1)


def event_time(value: Any) -> int:
    """An event time as an epoch number: a positive 64-bit integer, or a datetime as
    microseconds since 1970-01-01 UTC; TransactionError otherwise."""
    if isinstance(value, _dt.datetime):
        ok, utc = coerce_value(value, "instant")
        value = (utc - _EPOCH) // _dt.timedelta(microseconds=1) if ok else value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63 - 1:
        raise TransactionError(f"an event time must be a positive 64-bit integer or a datetime, not {value!r}")
    return value


@dataclass
class Buffered:
    """One transaction buffered for an open time: its checked operations and its offsets."""

    ops: WideOps
    offsets: dict[str, int] = field(default_factory=dict)


class EventClock:
    """The frontier (times before it are closed) and the transactions buffered per open time."""

    def __init__(self, frontier: int = 1):
        self.frontier = frontier
        self.pending: dict[int, list[Buffered]] = {}
        self._touched: dict[int, Touches] = {}

    @property
    def buffered(self) -> int:
        """How many transactions are buffered."""
        return sum(len(b) for b in self.pending.values())

    def check_open(self, time: int) -> None:
        """Raise :class:`LateTransactionError` when ``time`` is closed."""
        if time < self.frontier:
            raise LateTransactionError(f"late transaction: time {time} is before the frontier {self.frontier} "
                                       f"(times before it are closed and applied); nothing was changed")

    def admit(self, time: int, ops: WideOps, schema: Schema) -> Touches:
        """What ``ops`` touches, once checked to conflict neither with itself nor with what
        is buffered for ``time`` (TransactionError naming the fact otherwise); changes nothing."""
        touched, clash = touches(ops)
        if clash is not None:
            raise TransactionError(f"transaction rejected: {_describe(clash, schema)} in one transaction")
        buffered = self._touched.get(time)
        clash = buffered.conflict(touched) if buffered is not None else None
        if clash is not None:
            raise TransactionError(f"transaction rejected: {_describe(clash, schema)} by it and by a transaction "
                                   f"already buffered for time {time}; transactions of one time must commute")
        return touched

    def add(self, time: int, entry: Buffered, touched: Touches | None = None) -> None:
        """Buffer ``entry`` for the open ``time`` (``touched``: what :meth:`admit` returned)."""
        self.pending.setdefault(time, []).append(entry)
        self._touched.setdefault(time, Touches()).absorb(touched if touched is not None else touches(entry.ops)[0])

    def due(self, before: int) -> list[int]:
        """The times with buffered transactions before ``before``, ascending."""
        return sorted(t for t in self.pending if t < before)

    def combined(self, time: int) -> WideOps:
        """The transactions buffered for ``time`` as one."""
        return transaction.combine([b.ops for b in self.pending[time]])

    def close(self, time: int) -> None:
        """Forget the transactions of ``time``, now applied; times up to it are closed."""
        self.pending.pop(time, None)
        self._touched.pop(time, None)
        self.frontier = max(self.frontier, time + 1)


def _clock(state) -> EventClock:
    """The event clock of ``state``; TransactionError for an engine in transaction time."""
    if state.clock is None:
        raise TransactionError("time= and advance_to are for event-time engines (Engine(time='event')); "
                               "this engine numbers its epochs by arrival")
    return state.clock


def _describe(clash: tuple, schema: Schema) -> str:
    """A conflict found by :class:`Touches` in words."""
    if len(clash) == 3:
        aid, e, v = clash
        return f"{schema.by_id(aid).name}: entity {e} value {v!r} is both asserted and retracted"
    aid, e = clash
    return f"{schema.by_id(aid).name} has cardinality one, but entity {e} is given different values"


def buffer(state, tx: Any, time: Any, offset: tuple[str, int] | None,
           journal: Callable[[int, WideOps, dict[str, int]], None] | None) -> int:
    """Buffer ``tx`` for ``time`` in the event-time ``state`` (see the module docs); returns the time.

    ``journal(time, ops, offsets)`` makes it durable first (a durable engine's log)."""
    clock = _clock(state)
    if time is None:
        raise TransactionError("an event-time engine needs the transaction's time: transact(tx, time=T)")
    t = event_time(time)
    if offset is not None:
        applied = state.offsets.applied(*offset)
        if applied is not None:
            return applied
    clock.check_open(t)
    ops = transaction.read_wide(tx, state.schema, state.spark, state.config.local_limit)
    touched = clock.admit(t, ops, state.schema)
    offsets = dict([offset]) if offset is not None else {}
    if journal is not None:
        journal(t, ops, offsets)
    clock.add(t, Buffered(ops, offsets), touched)
    if offsets:
        state.offsets.record(offsets, t)
    return t


def advance(state, to: Any, run: Callable[[int, WideOps], int],
            journal: Callable[[int], None] | None) -> list[int]:
    """Close every time before ``to``: ``run(time, ops)`` applies each time's buffered
    transactions as its epoch, in time order; then the frontier moves to ``to``
    (``journal(frontier)`` logs it first). Returns the epochs applied. When ``run`` raises,
    the times before the failed one stay closed and it and later ones stay open."""
    clock = _clock(state)
    target = event_time(to)
    closed = []
    for t in clock.due(target):
        run(t, clock.combined(t))
        clock.close(t)
        closed.append(t)
    if target > clock.frontier:
        if journal is not None:
            journal(target)
        clock.frontier = target
    return closed
