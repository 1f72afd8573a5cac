"""What the command thread hands to the event loop: pushed changes and replies, in order,
handed over once per command.

Everything the engine produces for clients (an epoch's changes for every interested
connection, the replies to the commands that made the epoch) must reach each connection's
:class:`~factflow.server.outbox.Outbox` in the order it was produced: that order is what
makes read-your-writes hold. Handing each item to the loop on its own costs a write to the
loop's wake-up socket and a turn of the loop per item: an epoch watched by 1,200 tenants
made 1,200 of each while the command thread went on to the next epoch. So items from the
command thread wait in :class:`Handoff` until the command is done
(:meth:`Handoff.flush`, called by the worker after each command) and go over together;
the loop queues them in order and then wakes the connections' writers, those with a
reply first (:meth:`Server._deliver`), so that a reply never waits for its epoch's diffs
to every other client. Items from any other thread (a transaction of a stream feeding
the engine) go over at once, behind what waits, so the order across threads stays the
engine's.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

__all__ = ["Handoff"]


class Handoff:
    """Ordered items for the event loop, batched per command of the command thread."""

    def __init__(self, deliver: Callable[[list[tuple[Any, ...]]], None]):
        self._deliver = deliver
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batching: threading.Thread | None = None
        self._pending: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()

    def bind(self, loop: asyncio.AbstractEventLoop, command_thread: threading.Thread) -> None:
        """Deliver on ``loop``; batch what ``command_thread`` sends until it flushes."""
        self._loop = loop
        self._batching = command_thread

    def send(self, *item: Any) -> None:
        """Queue ``item`` for the loop (at once unless sent by the command thread)."""
        with self._lock:
            self._pending.append(item)
            if threading.current_thread() is self._batching:
                return
        self.flush()

    def flush(self) -> None:
        """Hand everything queued to the loop, in one call."""
        with self._lock:
            items, self._pending = self._pending, []
        if items:
            self._loop.call_soon_threadsafe(self._deliver, items)
