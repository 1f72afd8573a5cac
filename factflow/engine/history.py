"""A query's past changes, epoch by epoch, read back from its result trace as Spark SQL.

The result trace holds the query's output as updates ``(columns..., _t, _diff)``; merging
compacts it: times older than its readers' frontier (the query's own handle, held back by
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

from typing import TYPE_CHECKING

from factflow.arrangement.batch import DIFF, TIME
from factflow.dataflow.nodes import Distinct
from factflow.dataflow.zset import ident
from factflow.io.sinks import CHANGE, EPOCH
from factflow.model.types import Kind

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.query import Query

__all__ = ["oldest_available", "changes_sql"]


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
