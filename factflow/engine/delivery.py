"""Delivering each epoch's changes to subscribers: in epoch order, outside the engine lock.

An epoch commits under the engine lock and queues its changes, with the subscribers each
query had at that moment (:meth:`Deliveries.put`). Once the lock is released, the thread
that ran the epoch drains the queue (:meth:`Deliveries.drain`) under a separate delivery
lock, so that

* every subscriber receives epochs in increasing order, however many threads transact:
  epochs are queued in commit order and only one thread delivers at a time;
* a slow subscriber holds up other deliveries, never the engine: epochs still run and
  readers still read while it works;
* a subscriber that raises is logged (logger ``factflow.engine``, with the traceback) and
  the others still receive the epoch: the epoch stays committed;
* a subscriber may transact itself: on the delivering thread ``drain`` returns at once,
  and the loop already running there delivers the new epoch after the current one.

A query with a granularity (:mod:`factflow.engine.granularity`) passes each epoch through
its window first: a held epoch is delivered later, folded with the epochs after it, by the
window's timer (:meth:`Deliveries.release`, on the timer's thread) or when the query
closes. A query's sinks (:mod:`factflow.io.sinks`) get each delivery after its
subscribers; they only queue it for their writer threads.

**Large change sets.** An epoch that changes a query by more rows than a fetch may bring
to the driver (``EngineConfig.fetch_limit``) leaves its changes in Spark, consolidated and
written as files of at most that many rows (:class:`~factflow.arrangement.filed.HeldRows`,
see :meth:`factflow.engine.evaluation.Evaluation.run`). Its subscribers receive it in
chunks: one call per file, in turn, each with at most ``fetch_limit`` rows, all labelled
with the epoch, every chunk read on the driver just before its call; the calls of one
epoch come before those of the next, and their changes sum to the epoch's. Its sinks
write it from Spark, reading the files (never through pandas), and the files go once the
delivery and every sink have them written. Such an epoch is not folded into a
granularity window: what the window holds is delivered first, then the large epoch.

The delivery lock is only ever taken without the engine lock held, and a subscriber
takes the engine lock only inside it, so the two locks cannot deadlock. A subscriber must
not wait for another thread's ``transact``, though: that call returns only once its epoch
is delivered, which waits for the subscriber.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from factflow.arrangement.batch import DIFF
from factflow.arrangement.filed import HeldRows
from factflow.io.sinks import SparkChanges

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.feeds import AttributeFeed
    from factflow.engine.query import Query, Subscriber

__all__ = ["Deliveries", "Notice"]

log = logging.getLogger("factflow.engine")


@dataclass(frozen=True)
class Notice:
    """The changes of one query (or attribute feed) in one epoch, for the subscribers it had
    when the epoch committed; for a query also as a frame (:meth:`Query._output`), which its
    window and sinks take (``changes`` is then empty when the query has a window), or, for
    a large change set, ``held`` in Spark instead of either (delivered in chunks)."""

    source: "Query | AttributeFeed"
    subscribers: tuple["Subscriber", ...]
    changes: list[tuple[tuple, int]]
    frame: pd.DataFrame | None = None
    held: HeldRows | None = None


class Deliveries:
    """The queue of committed epochs whose changes are still to be delivered."""

    def __init__(self) -> None:
        self._queue: deque[tuple[int, list[Notice]]] = deque()
        self._lock = threading.Lock()
        self._delivering = threading.local()

    def put(self, epoch: int, notices: list[Notice]) -> None:
        """Queue a committed epoch's notices (called under the engine lock, in epoch order)."""
        if notices:
            self._queue.append((epoch, notices))

    def drain(self) -> None:
        """Deliver every queued epoch, in order; returns at once on a thread already delivering.

        Must not be called with the engine lock held.
        """
        if getattr(self._delivering, "active", False):
            return
        with self._lock:
            self._delivering.active = True
            try:
                while self._queue:
                    epoch, notices = self._queue.popleft()
                    for notice in notices:
                        _deliver(epoch, notice)
            finally:
                self._delivering.active = False

    def release(self, query: "Query") -> None:
        """Deliver what ``query``'s window holds now (its timer, or the query closing).

        Must not be called with the engine lock held."""
        if getattr(self._delivering, "active", False):  # a subscriber closing its query
            _release(query)
            return
        with self._lock:
            self._delivering.active = True
            try:
                _release(query)
            finally:
                self._delivering.active = False


def _deliver(epoch: int, notice: Notice) -> None:
    """Deliver a committed epoch's notice, or hold it in its query's window."""
    if notice.held is not None:
        _deliver_held(epoch, notice)
        return
    window = getattr(notice.source, "window", None)
    if window is not None and window.offer(epoch, notice.frame, time.monotonic()) is None:
        return
    if window is not None:
        notice = Notice(notice.source, notice.subscribers, notice.source._changes(notice.frame, DIFF), notice.frame)
    _notify(epoch, notice)
    _write(epoch, notice)


def _deliver_held(epoch: int, notice: Notice) -> None:
    """Deliver a change set kept in Spark: the query's held window first, then the change
    set in chunks to the subscribers, then to the sinks (see the module docs)."""
    query, held = notice.source, notice.held
    try:
        if query.window is not None:
            _release(query)
        if any(fn in query._subscribers for fn in notice.subscribers):
            for chunk in held.files.chunks():
                _notify(epoch, Notice(query, notice.subscribers, query._changes(chunk, DIFF)))
        for sink in query._sinks:
            sink.offer(epoch, SparkChanges(held.hold(), query._sink_columns()))
    finally:
        held.release()


def _release(query: "Query") -> None:
    """Deliver a query's held window, if any, to its subscribers now and its sinks."""
    held = query.window.take(time.monotonic()) if query.window is not None else None
    if held is None or held[1].empty:
        return
    epoch, frame = held
    notice = Notice(query, tuple(query._subscribers), query._changes(frame, DIFF), frame)
    _notify(epoch, notice)
    _write(epoch, notice)


def _write(epoch: int, notice: Notice) -> None:
    """Queue a query's delivered changes for its sinks."""
    sinks = getattr(notice.source, "_sinks", ())
    if sinks and notice.frame is not None:
        frame = notice.source._sink_frame(notice.frame)
        for sink in sinks:
            sink.offer(epoch, frame)


def _notify(epoch: int, notice: Notice) -> None:
    """Call the notice's subscribers that are still subscribed; a failure is logged, not raised."""
    source = notice.source
    for fn in notice.subscribers:
        if fn not in source._subscribers:  # unsubscribed since the epoch committed (the query may be closed since)
            continue
        try:
            fn(epoch, notice.changes)
        except Exception:
            log.exception("subscriber %r of %s failed at epoch %d (the epoch stays committed)",
                          fn, source.name, epoch)
