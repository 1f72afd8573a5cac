"""Aggregation in ``:find``: the Reduce operator and the SQL of each aggregate function.

Datomic semantics: the aggregates see the *set* of tuples over the find variables and the
``:with`` variables (so ``:with`` keeps tuples that would otherwise collapse), grouped by
the non-aggregated find variables. Reduce keeps its current output in a private trace;
per epoch, the groups its input change touches get new rows (+1) and lose their old ones
(-1). How the new rows are made depends on the aggregates:

- ``count``, ``sum`` and ``avg`` are *accumulated*: the trace also holds each group's
  tuple count and the sums behind its averages (hidden columns, ``_tuples`` and
  ``_sum_<column>``), and a touched group's new row is its old row plus the change's
  contributions (each tuple's value times its diff). An epoch reads its change and the
  result's old rows, never the input, so its cost grows with the groups, not with the
  input. A group leaves when its tuple count reaches zero.
  Sums of doubles are carried forward, so after retractions they may differ from a
  recomputation in the last bits.
- Every other aggregate is *recomputed* over the touched groups' whole new input.

Collection-valued aggregates (``distinct``, ``(min n ?x)``, ``(max n ?x)``,
``(sample n ?x)``) are computed as JSON arrays in Spark and decoded when rows reach
Python: ``distinct`` becomes a frozenset, the others a tuple (``min``: ascending,
``max``: descending, ``sample``: ascending). ``sample`` is deterministic: the ``n``
distinct values with the smallest 64-bit hashes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from factflow.arrangement.batch import DIFF
from factflow.arrangement.index import TRACE_DIFF
from factflow.dataflow import zset
from factflow.dataflow.context import Version
from factflow.dataflow.nodes import Columns, Node, Stateful
from factflow.dataflow.slots import TraceSlot
from factflow.dataflow.zset import ident
from factflow.errors import QueryError
from factflow.model.types import Kind

__all__ = ["AggregateSpec", "aggregate_spec", "Reduce", "reduce_columns", "TUPLES"]

TUPLES = "_tuples"  # an accumulating Reduce's hidden column: the group's tuple count
#: results up to this many rows are read whole by an accumulating epoch (see Reduce._old_rows):
#: TPC-H's Q3 gained with 1,100 groups (SF 0.01) and lost with 11,000 (SF 0.1)
WHOLE_RESULT_ROWS = 4096
ACCUMULATED = {"count", "sum", "avg"}
NUMERIC_ONLY = {"sum", "avg", "median", "variance", "stddev"}
TAKING_N = {"min", "max", "sample"}  # (fn n ?x) forms, which return a tuple of up to n values


@dataclass(frozen=True)
class AggregateSpec:
    """One aggregate: its output column, kind, SQL over the input column, and Python
    decoder; ``fn`` and ``source`` (the input column) say how it is accumulated when it is."""

    column: str
    kind: Kind
    sql: str
    decode: Callable[[Any], Any] | None = None
    fn: str = ""
    source: str = ""
    source_kind: Kind = Kind.LONG

    @property
    def accumulated(self) -> bool:
        """Whether a group's value follows from its old value and the change's rows alone."""
        return self.fn in ACCUMULATED

    @property
    def hidden_sum(self) -> str | None:
        """The hidden column holding the sum behind an average (None for other aggregates)."""
        return f"_sum_{self.column}" if self.fn == "avg" else None

    @property
    def summed(self) -> str | None:
        """The column an accumulating Reduce keeps this aggregate's sum in: its own for
        ``sum``, the hidden one for ``avg`` (None for ``count``, which is the tuple count)."""
        return {"sum": self.column, "avg": self.hidden_sum}.get(self.fn)


def aggregate_spec(fn: str, params: Sequence[Any], column: str, kind: Kind, out: str, where: str) -> AggregateSpec:
    """The spec of aggregate ``fn`` over ``column`` (of ``kind``), output as ``out``."""
    x = ident(column)
    if fn in NUMERIC_ONLY and not kind.numeric:
        raise QueryError(f"{where}: {fn} needs numbers, but its argument is a {kind.value}")
    if params and fn not in TAKING_N:
        raise QueryError(f"{where}: {fn} takes no leading arguments")
    if params or fn == "sample":
        if len(params) != 1 or not isinstance(params[0], int) or isinstance(params[0], bool) or params[0] < 1:
            raise QueryError(f"{where}: the count of ({fn} n ?x) must be a positive integer")
        n = params[0]
        if fn == "min":
            values = f"slice(array_sort(collect_list({x})), 1, {n})"
        elif fn == "max":
            values = f"slice(reverse(array_sort(collect_list({x}))), 1, {n})"
        else:
            hashed = f"array_sort(collect_set(named_struct('h', xxhash64({x}), 'v', {x})))"
            values = f"array_sort(transform(slice({hashed}, 1, {n}), s -> s.v))"
        return AggregateSpec(out, Kind.STRING, f"to_json({values})", _decoder(tuple))
    simple = {
        "count": (f"COUNT({x})", Kind.LONG),
        "count-distinct": (f"COUNT(DISTINCT {x})", Kind.LONG),
        "sum": (f"SUM({x})", kind),
        "avg": (f"AVG(CAST({x} AS DOUBLE))", Kind.DOUBLE),
        "median": (f"percentile({x}, 0.5)", Kind.DOUBLE),
        "variance": (f"var_pop(CAST({x} AS DOUBLE))", Kind.DOUBLE),
        "stddev": (f"stddev_pop(CAST({x} AS DOUBLE))", Kind.DOUBLE),
        "min": (f"MIN({x})", kind),
        "max": (f"MAX({x})", kind),
    }
    if fn in simple:
        sql, out_kind = simple[fn]
        return AggregateSpec(out, out_kind, sql, fn=fn, source=column, source_kind=kind)
    if fn == "distinct":
        return AggregateSpec(out, Kind.STRING, f"to_json(array_sort(collect_set({x})))", _decoder(frozenset))
    raise QueryError(f"{where}: aggregate {fn} is not supported (rand is not deterministic; use sample)")


def _decoder(kind: type) -> Callable[[Any], Any]:
    return lambda text: kind(json.loads(text))


def reduce_columns(child: Node, group: Sequence[str], specs: Sequence[AggregateSpec]) -> Columns:
    """The columns of a Reduce's trace: the group's, the aggregates', then, when every
    aggregate is accumulated, the hidden accumulators (see the module docs)."""
    kinds = dict(child.columns)
    columns = tuple((g, kinds[g]) for g in group) + tuple((s.column, s.kind) for s in specs)
    if not all(s.accumulated for s in specs):
        return columns
    hidden = tuple((s.hidden_sum, s.source_kind) for s in specs if s.hidden_sum)
    return columns + ((TUPLES, Kind.LONG),) + hidden


class Reduce(Stateful):
    """Grouped aggregation of a set-valued input; only touched groups change (accumulated
    or recomputed, see the module docs)."""

    def __init__(self, child: Node, group: Sequence[str], specs: Sequence[AggregateSpec], slot: TraceSlot):
        super().__init__(child, slot)
        self.group = list(group)
        self.specs = list(specs)
        self.accumulated = all(s.accumulated for s in self.specs)
        self.columns: Columns = reduce_columns(child, self.group, self.specs)
        self.visible: list[str] = self.group + [s.column for s in self.specs]

    def params(self, ref):
        specs = [{"column": s.column, "kind": s.kind.value, "sql": s.sql, "decoded": s.decode is not None}
                 for s in self.specs]
        return {**super().params(ref), "group": list(self.group), "specs": specs, "accumulated": self.accumulated}

    def _aggregate(self, relation: str) -> str:
        outs = [ident(g) for g in self.group] + [f"{s.sql} AS {ident(s.column)}" for s in self.specs]
        group = f" GROUP BY {', '.join(ident(g) for g in self.group)}" if self.group else ""
        return f"SELECT {', '.join(outs)}, CAST(1 AS BIGINT) AS {ident(DIFF)} FROM {relation}{group} HAVING COUNT(*) > 0"

    def _state_delta(self, cx):
        d = self.child.delta(cx)
        if d is None:
            return None
        if self.accumulated:
            old_rows = self._old_rows(cx, d)
            new_rows = cx.define(self._accumulate(d, old_rows))
        else:
            old_rows = self.state(cx, Version.OLD)
            new_input = self.child.read(cx, Version.NEW)
            if self.group:
                old_rows = cx.define(zset.semijoin(old_rows, d, self.group))
                new_input = cx.define(zset.semijoin(new_input, d, self.group))
            new_rows = cx.define(self._aggregate(new_input))
        retracted = cx.define(zset.select(old_rows, self.names, diff=f"-{ident(DIFF)}"))
        return cx.define(zset.consolidate(f"({zset.union([new_rows, retracted], self.names)})", self.names))

    def _old_rows(self, cx, change: str) -> str:
        """The old rows an accumulating epoch reads, each present row once (diff 1): every
        group's while the result holds at most ``WHOLE_RESULT_ROWS`` rows, else those of the
        groups ``change`` touches, probed by their keys in a small epoch (see
        :mod:`.lookup`; a join instead scans the whole result: TPC-H Q18's 150,000 orders'
        sums at SF 0.1, in a Spark job every epoch). Reading the whole result reads
        ``change`` once, so a small epoch's statement keeps its plan."""
        if not self.group or self.handle.tuples <= WHOLE_RESULT_ROWS:
            return cx.define(zset.present(self.state(cx, Version.OLD), self.names))
        kinds = dict(self.columns)
        keys = cx.define(zset.touched(change, self.group))
        probed = self.probe_old(cx, keys, [(g, kinds[g]) for g in self.group], self.group, how="semi", present=True)
        if probed is not None:
            return cx.define(zset.select(probed, self.names, diff=ident(TRACE_DIFF)))
        touched = cx.define(zset.semijoin(self.state(cx, Version.OLD), change, self.group))
        return cx.define(zset.present(touched, self.names))

    def _accumulate(self, change: str, old_rows: str) -> str:
        """SQL of the new row of every group in ``old_rows`` (present rows) or ``change``:
        its old accumulators plus the contributions of ``change``'s rows (value times
        diff), summed in one aggregation, with neither a join nor a generator.

        Every old row read is retracted: an untouched group's new row equals its old one,
        and the consolidation after drops both. (The cost grows with the old rows read,
        see :meth:`_old_rows`, never with the input.)"""
        diff = ident(DIFF)
        contributions = {TUPLES: diff, **{s.summed: f"{ident(s.source)} * {diff}" for s in self.specs if s.summed}}
        group = [ident(g) for g in self.group]
        old = ", ".join(group + [ident(n) for n in contributions])
        new = ", ".join(group + [f"{sql} AS {ident(n)}" for n, sql in contributions.items()])
        both = f"SELECT {old} FROM {old_rows} UNION ALL SELECT {new} FROM {change}"
        sums = [f"SUM({ident(n)}) AS {ident(n)}" for n in contributions]
        by = f" GROUP BY {', '.join(group)}" if group else ""
        tuples = ident(TUPLES)
        summed = f"SELECT {', '.join(group + sums)} FROM ({both}){by} HAVING SUM({tuples}) > 0"
        shown = {}
        for s in self.specs:
            if s.fn == "count":
                shown[s.column] = tuples
            elif s.fn == "avg":
                shown[s.column] = f"CAST({ident(s.hidden_sum)} AS DOUBLE) / CAST({tuples} AS DOUBLE)"
        outs = [f"{shown[n]} AS {ident(n)}" if n in shown else ident(n) for n in self.names]
        return f"SELECT {', '.join(outs)}, CAST(1 AS BIGINT) AS {diff} FROM ({summed})"

    def _delta(self, cx):
        return self.state_delta(cx)

    def _read(self, cx, version):
        return self.state(cx, version)

    def describe(self):
        aggs = ", ".join(s.sql for s in self.specs)
        how = "accumulated from the change" if self.accumulated else "touched groups recomputed"
        return f"Reduce by {', '.join(self.group) or '(all)'}: {aggs} ({how})"
