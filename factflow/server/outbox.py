"""A client's outgoing messages: in order, consolidated while the client lags, bounded.

Replies and pushed changes of one client go through one :class:`Outbox`, drained by one
writer task, so the client receives them in the order the engine produced them (which
is what makes read-your-writes hold: an epoch's diffs are queued before the reply to the
transaction that produced it).

A client that reads slowly never holds up the engine or other clients: while its
messages wait, a new change of a query (or attribute) that already has a change waiting
is folded into it (rows' diffs summed, the epoch the latest), so what waits grows with
the number of distinct changed rows, not with the number of epochs. Past ``max_rows``
waiting change rows the outbox overflows: it calls ``on_overflow`` once (the server drops
the client) and sends nothing more.

A query interest with a granularity of G seconds gets at most one diff message per G
seconds: changes arriving sooner wait, folded, until the window closes (the timing rule
is the engine's, :class:`factflow.engine.granularity.Throttle`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Callable

from factflow.engine.granularity import Throttle

__all__ = ["Outbox"]


class _Changes:
    """One query's (or attribute's) changes waiting to be sent, folded per row."""

    def __init__(self, kind: str, name: str, epoch: int, changes: list[tuple[tuple, int]]):
        self.kind = kind
        self.name = name
        self.epoch = epoch
        self.rows: dict[tuple, int] = {}
        self.fold(epoch, changes)

    def fold(self, epoch: int, changes: list[tuple[tuple, int]]) -> int:
        """Add an epoch's changes; returns how many rows were added to what waits."""
        self.epoch = epoch
        before = len(self.rows)
        for row, diff in changes:
            total = self.rows.get(row, 0) + diff
            if total:
                self.rows[row] = total
            else:
                self.rows.pop(row, None)
        return len(self.rows) - before

    def message(self) -> dict:
        key = "query" if self.kind == "diff" else "attribute"
        return {"type": self.kind, key: self.name, "epoch": self.epoch,
                "changes": [[list(row), diff] for row, diff in self.rows.items()]}


class Outbox:
    """The queue of one client's outgoing messages (used on the event loop's thread only)."""

    def __init__(self, max_rows: int, on_overflow: Callable[[], None] | None = None):
        self.max_rows = max_rows
        self._on_overflow = on_overflow
        self._queue: deque[dict | _Changes] = deque()
        self._waiting: dict[tuple[str, str], _Changes] = {}  # changes still in the queue, by source
        self._held: dict[str, _Changes] = {}  # query changes held back by a granularity window
        self._throttles: dict[str, Throttle] = {}  # query -> its granularity's timing
        self._rows = 0
        self._ready = asyncio.Event()
        self._freed = asyncio.Event()  # set whenever waiting rows are sent or the outbox closes
        self.overflowed = False
        self.closed = False

    # ------------------------------------------------------------ producers
    def reply(self, message: dict, wake: bool = True) -> None:
        """Queue a reply (or any message that is never folded); see :meth:`changes` for ``wake``."""
        self._queue.append(message)
        if wake:
            self._ready.set()

    def changes(self, kind: str, name: str, epoch: int, changes: list[tuple[tuple, int]],
                always: bool = False, wake: bool = True) -> None:
        """Queue an epoch's changes of a query (``kind`` "diff") or an attribute ("attribute").

        ``always`` sends a message even when ``changes`` is empty (a query's first result);
        without ``wake`` the writer is not woken until :meth:`wake` is called.
        """
        if self.closed:
            return
        key = (kind, name)
        throttle = self._throttles.get(name) if kind == "diff" else None
        if throttle is not None and not always:
            held = self._held.get(name)
            if held is not None:
                self._grow(held.fold(epoch, changes))
                return
            wait = throttle.wait(time.monotonic())
            if wait > 0:
                held = self._held[name] = _Changes(kind, name, epoch, changes)
                self._grow(len(held.rows))
                asyncio.get_running_loop().call_later(wait, self._release, name)
                return
        waiting = self._waiting.get(key)
        if waiting is not None and not always:
            self._grow(waiting.fold(epoch, changes))
            return
        item = _Changes(kind, name, epoch, changes)
        if not item.rows and not always:
            return
        if not always:  # a query's first result stays exactly the result at its epoch
            self._waiting[key] = item
        self._queue.append(item)
        self._grow(len(item.rows))
        if wake:
            self._ready.set()

    def wake(self) -> None:
        """Wake the writer for what was queued without waking it."""
        self._ready.set()

    def set_granularity(self, query: str, seconds: float | None) -> None:
        """At most one diff message of ``query`` per ``seconds`` (None or 0: every epoch);
        the first window starts now, with the whole result the interest has just queued."""
        if seconds:
            self._throttles[query] = throttle = Throttle(seconds)
            throttle.sent(time.monotonic())
        else:
            self._throttles.pop(query, None)

    def forget(self, query: str) -> None:
        """Drop what waits for a query the client is no longer interested in."""
        self._throttles.pop(query, None)
        held = self._held.pop(query, None)
        if held is not None:
            self._rows -= len(held.rows)

    def _release(self, name: str) -> None:
        held = self._held.pop(name, None)
        if held is None or self.closed:
            return
        self._rows -= len(held.rows)
        if held.rows:
            self.changes(held.kind, name, held.epoch, list(held.rows.items()), always=False)

    async def room(self, rows: int, wait: float) -> None:
        """Wait until ``rows`` more change rows fit beside those waiting (or nothing waits,
        or the outbox is closed), at most ``wait`` seconds."""
        deadline = asyncio.get_running_loop().time() + wait
        while not (self.closed or self.overflowed) and self._rows and self._rows + rows > self.max_rows:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), remaining)
            except TimeoutError:
                return

    def _grow(self, rows: int) -> None:
        self._rows += rows
        if self._rows > self.max_rows and not self.overflowed:
            self.overflowed = True
            self._ready.set()
            if self._on_overflow is not None:
                self._on_overflow()

    # ------------------------------------------------------------ the writer
    async def next(self) -> dict | None:
        """The next message to send, waiting for one; None once the outbox is closed or overflowed."""
        while not self._queue:
            if self.closed or self.overflowed:
                return None
            self._ready.clear()
            await self._ready.wait()
        if self.overflowed:
            return None
        item = self._queue.popleft()
        if isinstance(item, _Changes):
            if self._waiting.get((item.kind, item.name)) is item:
                del self._waiting[(item.kind, item.name)]
            self._rows -= len(item.rows)
            self._freed.set()
            throttle = self._throttles.get(item.name) if item.kind == "diff" else None
            if throttle is not None:
                throttle.sent(time.monotonic())
            return item.message()
        return item

    def close(self) -> None:
        """Stop: the writer returns None once what is queued is sent."""
        self.closed = True
        self._ready.set()
        self._freed.set()

    @property
    def waiting_rows(self) -> int:
        """Change rows waiting to be sent (held ones included)."""
        return self._rows

    def pending(self) -> list[Any]:
        """What is still queued (for tests and status)."""
        return list(self._queue)
