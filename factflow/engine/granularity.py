"""Granularity: at most one delivery of a query's changes per window of time (thesis 12.1).

A query installed with ``granularity=G`` (seconds) is delivered like this: the first
epoch that changes it after a quiet spell of ``G`` seconds goes out at once; the epochs
that follow within ``G`` seconds of that delivery are *held*, their changes summed per row
(rows whose diffs cancel disappear), and delivered together, labelled with the latest
epoch, when the window ends: by a timer, even if no further epoch comes, or earlier when
the query closes. Subscribers and sinks receive the same windows.

:class:`Throttle` is the timing rule alone (when may the next delivery go), shared with
the server's per-interest granularity (:mod:`factflow.server.outbox`); :class:`Window`
holds one query's changes (pandas frames of its output columns and ``_diff``) between
deliveries. Both are used under the caller's lock (the delivery lock for windows).
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import pandas as pd

from factflow.arrangement.batch import DIFF
from factflow.model.frames import consolidated
from factflow.errors import QueryError

__all__ = ["Throttle", "Window", "window_seconds"]


def window_seconds(granularity: float | None) -> float | None:
    """A query's ``granularity`` checked: None (every epoch) or a positive number of seconds."""
    if granularity is None:
        return None
    if isinstance(granularity, bool) or not isinstance(granularity, (int, float)) or not granularity > 0:
        raise QueryError(f"granularity must be a positive number of seconds, not {granularity!r}")
    return float(granularity)


class Throttle:
    """At most one delivery per ``seconds``: how long the next one must wait."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self._last: float | None = None

    def wait(self, now: float) -> float:
        """Seconds from ``now`` until a delivery may go (0: at once)."""
        if self._last is None:
            return 0.0
        return max(self._last + self.seconds - now, 0.0)

    def sent(self, now: float) -> None:
        """Record a delivery at ``now``."""
        self._last = now


class Window:
    """One query's changes held back by its granularity; ``on_due`` is called (on a timer
    thread) when a held window ends."""

    def __init__(self, seconds: float, names: Sequence[str], on_due: Callable[[], None]):
        self.throttle = Throttle(seconds)
        self._names = list(names)
        self._on_due = on_due
        self._held: list[pd.DataFrame] = []
        self._epoch: int | None = None
        self._timer: threading.Timer | None = None

    def offer(self, epoch: int, frame: pd.DataFrame, now: float) -> pd.DataFrame | None:
        """An epoch's changes: returned when they may be delivered now, else held (None)."""
        if self._epoch is None:
            wait = self.throttle.wait(now)
            if not wait:
                self.throttle.sent(now)
                return frame
            self._timer = threading.Timer(wait, self._on_due)
            self._timer.daemon = True
            self._timer.start()
        self._held.append(frame)
        self._epoch = epoch
        return None

    def take(self, now: float) -> tuple[int, pd.DataFrame] | None:
        """The held window as ``(latest epoch, changes summed per row)`` (None if nothing is
        held); the next window starts ``now``. The changes may be empty (all cancelled)."""
        if self._epoch is None:
            return None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        epoch, frames = self._epoch, self._held
        self._epoch, self._held = None, []
        self.throttle.sent(now)
        return epoch, consolidated(pd.concat(frames, ignore_index=True), self._names, DIFF)
