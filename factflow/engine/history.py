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

A query's past changes, epoch by epoch, are read back from its result trace as Spark SQL
(:func:`changes_sql`, behind ``Query.changes_frame``). The result trace holds the query's
output as updates ``(columns..., _t, _diff)``; merging compacts it: times older than its readers' frontier (the query's own handle, held back by
whatever slack of history the query keeps) are advanced to that frontier and summed.
Changes after an epoch ``since`` are therefore readable while ``since`` is at or after the
epoch the trace is compacted to (:func:`oldest_available`). They are computed in one
statement: every update's time is advanced to ``since`` (so what was compacted counts as
the state at ``since``), updates are summed per row and time, and

* for a set result (a :class:`Distinct` holds derivation counts), a running sum over
  time per row gives its count after each epoch, and the change is whether the row is
  present then minus whether it was before (``LAG`` over the same window);
* for any other result (multiset semantics, aggregates) the summed updates are the changes.

The changes of epochs after ``since`` are then projected onto the find elements and
consolidated per row and epoch, exactly as subscribers receive them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from factflow.arrangement.batch import DIFF, TIME
from factflow.arrangement.trace import TraceHandle
from factflow.dataflow.nodes import Distinct, Stateful
from factflow.dataflow.recursion import Fixpoint
from factflow.dataflow.zset import ident
from factflow.errors import HistoryError, QueryError
from factflow.io.sinks import CHANGE, EPOCH
from factflow.model.types import Kind

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.query import Query

__all__ = ["History", "check_slack", "private_handles", "oldest_available", "changes_sql"]


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
    """The latest closed epochs, as many as the largest slack needs (ascending).

    ``start`` is the epoch the engine starts at (0, the empty state, or the epoch a durable
    engine recovered): it is closed too, so a query installed there with slack keeps its
    install epoch readable until ``slack`` later epochs have closed."""

    def __init__(self, start: int = 0) -> None:
        self.closed: list[int] = [start]

    def close(self, epoch: int, keep: int) -> None:
        """Record the closed ``epoch``; remember it and the ``keep`` closed before it."""
        self.closed.append(epoch)
        del self.closed[:max(0, len(self.closed) - keep - 1)]

    def frontier(self, slack: int) -> int:
        """The oldest epoch a reader with ``slack`` must still read exactly."""
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



def oldest_available(query: "Query") -> int:
    """The earliest ``since`` whose following changes ``query`` can still give: the epoch
    its result trace is compacted to. It starts at the install epoch minus one (the
    install's full result then counts as the change of the install epoch) and moves with
    the query's frontier as merges compact the trace; history a query keeps back (its
    slack) holds that frontier, and so this epoch, back."""
    return query.dataflow.result.writer.since


def changes_sql(query: "Query", since: int, latest: int, columns: list[tuple[str, str, Kind]]) -> str:
    """SQL of ``query``'s consolidated changes of the epochs in ``(since, latest]``: the
    ``columns`` (``(internal, output name, kind)``, see :meth:`Query.output_columns`), then
    ``diff`` and ``epoch``, as in a sink directory. Call under the engine lock, with
    ``since`` at or after :func:`oldest_available`."""
    result = query.dataflow.result
    names = [ident(n) for n in result.names]
    row = ", ".join(names)
    at = f"greatest({ident(TIME)}, {int(since)}L)"
    summed = (f"SELECT {row}, {at} AS {ident(TIME)}, SUM({ident(DIFF)}) AS {ident(DIFF)} "
              f"FROM {result.handle.read(latest)} GROUP BY {row}, {at}")
    if isinstance(result, Distinct):
        order = f"PARTITION BY {row} ORDER BY {ident(TIME)}"
        counted = (f"SELECT {row}, {ident(TIME)}, CASE WHEN SUM({ident(DIFF)}) OVER ({order} ROWS BETWEEN "
                   f"UNBOUNDED PRECEDING AND CURRENT ROW) > 0 THEN 1 ELSE 0 END AS `_now` FROM ({summed})")
        summed = (f"SELECT {row}, {ident(TIME)}, `_now` - LAG(`_now`, 1, 0) OVER ({order}) AS {ident(DIFF)} "
                  f"FROM ({counted})")
    report = [f"{ident(internal)} AS {ident(name)}" for internal, name, _ in columns]
    group = ", ".join([ident(internal) for internal, _, _ in columns] + [ident(TIME)])
    return (f"SELECT {', '.join(report)}, SUM({ident(DIFF)}) AS {ident(CHANGE)}, {ident(TIME)} AS {ident(EPOCH)} "
            f"FROM ({summed}) WHERE {ident(TIME)} > {int(since)}L GROUP BY {group} HAVING SUM({ident(DIFF)}) <> 0")
