"""History: which closed epochs stay readable, and reads of a query's result as of one of them.

Traces compact (see :mod:`factflow.arrangement.trace`): when batches merge, times older
than the least frontier of the trace's readers are advanced to it, so a trace can only be
read as of its readers' frontiers or later. An engine moves every reader to the latest
closed epoch when an epoch commits (:meth:`factflow.engine.state.EngineState.advance`),
except where a *slack* asks it to lag:

* ``db.query(..., slack=N)``: the handle on the query's result trace stays at the N-th
  closed epoch before the latest, so ``q.rows(as_of=E)`` / ``q.results(as_of=E)`` answer
  exactly for every epoch E from there (or the install epoch, if later) to the latest;
* ``db.create_attribute(..., slack=N)``: the transactions' handle on the attribute's
  forward index lags the same way, so the index keeps its last N epochs' changes apart
  (readable as SQL through ``db.arrangement(name).forward.read(E)``; nothing in the public
  API reads them yet).

"Epochs" are closed epochs, whatever their numbers (in event time, the times that were
applied): slack N keeps N of them besides the latest. A read as of an epoch between two
closed ones is the state of the earlier. Slack costs what the trace then holds: every
change of the kept epochs as a row of its own instead of their sum (see
docs/benchmarks.md). History is not durable: a recovered engine starts with none.
"""

from __future__ import annotations

from typing import Iterable

from factflow.arrangement.trace import TraceHandle
from factflow.dataflow.nodes import Stateful
from factflow.dataflow.recursion import Fixpoint
from factflow.errors import HistoryError, QueryError

__all__ = ["History", "check_slack", "private_handles"]


def check_slack(slack: object, what: str) -> int:
    """``slack`` checked: a non-negative integer (``what`` names its owner in the error)."""
    if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
        raise QueryError(f"{what}: slack must be a non-negative integer (closed epochs kept), not {slack!r}")
    return slack


def private_handles(stateful: Iterable[object]) -> list[TraceHandle]:
    """The handles through which stateful operators read their own traces."""
    handles: list[TraceHandle] = []
    for node in stateful:
        if isinstance(node, Stateful):
            handles.append(node.handle)
        elif isinstance(node, Fixpoint):
            handles += node.handles.values()
    return handles


class History:
    """The latest closed epochs, as many as the largest slack needs (ascending)."""

    def __init__(self) -> None:
        self.closed: list[int] = []

    def close(self, epoch: int, keep: int) -> None:
        """Record the closed ``epoch``; remember it and the ``keep`` closed before it."""
        self.closed.append(epoch)
        del self.closed[:max(0, len(self.closed) - keep - 1)]

    def frontier(self, slack: int) -> int | None:
        """The oldest epoch a reader with ``slack`` must still read exactly (None before any epoch)."""
        if not self.closed:
            return None
        return self.closed[max(0, len(self.closed) - 1 - slack)]

    @staticmethod
    def check(handle: TraceHandle, as_of: object, oldest: int, latest: int, what: str) -> int:
        """``as_of`` checked against what ``handle`` can read: from ``oldest`` (or the handle's
        frontier, if later) to the latest closed epoch; raises :class:`HistoryError` naming both."""
        if isinstance(as_of, bool) or not isinstance(as_of, int):
            raise HistoryError(f"{what}: as_of must be an epoch number, not {as_of!r}")
        first = max(oldest, handle.frontier)
        if not first <= as_of <= latest:
            why = "is not closed yet" if as_of > latest else "is older than the history kept"
            raise HistoryError(f"{what}: epoch {as_of} {why}; epochs {first} to {latest} can be read "
                               f"(a query keeps its slack of closed epochs: db.query(..., slack=N))")
        return as_of
