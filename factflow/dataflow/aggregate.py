"""Aggregation in ``:find``: the Reduce operator and the SQL of each aggregate function.

Datomic semantics: the aggregates see the *set* of tuples over the find variables and the
``:with`` variables (so ``:with`` keeps tuples that would otherwise collapse), grouped by
the non-aggregated find variables. Reduce keeps its current output in a private trace
and, per epoch, recomputes only the groups its input change touches: the new rows of
those groups enter with +1, their old rows leave with -1. Recomputing a group reads all
of its input, and a group can be most of the data (TPC-H's Q1 has four groups over all of
lineitem; an order and its line items changed cost a pass over a quarter of it).

When every aggregate is ``count``, ``sum`` or ``avg`` (:func:`accumulates`), a group's new
value follows from its old one and the change alone: :class:`Accumulate` keeps per group
the number of input tuples and each aggregate's sum and count of values, and adds the
change's to them; :class:`Finalize` turns those into the aggregates' values (an
``Arranged`` trace keeps the result, as Reduce's does). Sums of doubles then depend on
the order updates came in, as sums in any streaming system do (differences in the last
bits, not in meaning).

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
from factflow.dataflow import zset
from factflow.dataflow.context import Version
from factflow.dataflow.nodes import Arranged, Columns, Linear, Node, Stateful
from factflow.dataflow.slots import TraceSlot
from factflow.dataflow.zset import ident
from factflow.errors import QueryError
from factflow.model.types import Kind, sql_type

__all__ = ["AggregateSpec", "aggregate_spec", "aggregation", "accumulates", "Accumulate", "Finalize", "Reduce"]

NUMERIC_ONLY = {"sum", "avg", "median", "variance", "stddev"}
#: aggregates whose value per group follows from its old value and the change of its input
INVERTIBLE = {"count", "sum", "avg"}
#: the column of :class:`Accumulate` counting a group's input tuples
ROWS = "_rows"
TAKING_N = {"min", "max", "sample"}  # (fn n ?x) forms, which return a tuple of up to n values


@dataclass(frozen=True)
class AggregateSpec:
    """One aggregate: its output column, kind, SQL over the input column, and Python decoder."""

    column: str
    kind: Kind
    sql: str
    decode: Callable[[Any], Any] | None = None
    fn: str = ""
    source: str = ""  # the input column


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
        return AggregateSpec(out, out_kind, sql, fn=fn, source=column)
    if fn == "distinct":
        return AggregateSpec(out, Kind.STRING, f"to_json(array_sort(collect_set({x})))", _decoder(frozenset))
    raise QueryError(f"{where}: aggregate {fn} is not supported (rand is not deterministic; use sample)")


def _decoder(kind: type) -> Callable[[Any], Any]:
    return lambda text: kind(json.loads(text))


class Reduce(Stateful):
    """Grouped aggregation of a set-valued input; only touched groups are recomputed."""

    def __init__(self, child: Node, group: Sequence[str], specs: Sequence[AggregateSpec], slot: TraceSlot):
        super().__init__(child, slot)
        self.group = list(group)
        self.specs = list(specs)
        kinds = dict(child.columns)
        self.columns: Columns = tuple((g, kinds[g]) for g in self.group) + tuple((s.column, s.kind) for s in specs)

    def params(self, ref):
        specs = [{"column": s.column, "kind": s.kind.value, "sql": s.sql, "decoded": s.decode is not None}
                 for s in self.specs]
        return {**super().params(ref), "group": list(self.group), "specs": specs}

    def _aggregate(self, relation: str) -> str:
        outs = [ident(g) for g in self.group] + [f"{s.sql} AS {ident(s.column)}" for s in self.specs]
        group = f" GROUP BY {', '.join(ident(g) for g in self.group)}" if self.group else ""
        return f"SELECT {', '.join(outs)}, CAST(1 AS BIGINT) AS {ident(DIFF)} FROM {relation}{group} HAVING COUNT(*) > 0"

    def _state_delta(self, cx):
        d = self.child.delta(cx)
        if d is None:
            return None
        new_input = self.child.read(cx, Version.NEW)
        old_output = self.state(cx, Version.OLD)
        if self.group:
            new_input = cx.define(zset.semijoin(new_input, d, self.group))
            old_output = cx.define(zset.semijoin(old_output, d, self.group))
        new_rows = cx.define(self._aggregate(new_input))
        retracted = cx.define(zset.select(old_output, self.names, diff=f"-{ident(DIFF)}"))
        return cx.define(zset.consolidate(f"({zset.union([new_rows, retracted], self.names)})", self.names))

    def _delta(self, cx):
        return self.state_delta(cx)

    def _read(self, cx, version):
        return self.state(cx, version)

    def describe(self):
        aggs = ", ".join(s.sql for s in self.specs)
        return f"Reduce by {', '.join(self.group) or '(all)'}: {aggs} (touched groups only)"


def accumulates(specs: Sequence[AggregateSpec]) -> bool:
    """Whether every aggregate of ``specs`` can be maintained by :class:`Accumulate`."""
    return all(s.fn in INVERTIBLE for s in specs)


def aggregation(child: Node, group: Sequence[str], specs: Sequence[AggregateSpec], slot: TraceSlot,
                private_slot: Callable[[Columns, tuple[str, ...]], TraceSlot]) -> Stateful:
    """The operator keeping ``child`` aggregated by ``group`` in the trace of ``slot``: a
    :class:`Reduce`, or, when the aggregates allow it (:func:`accumulates`), an
    :class:`Accumulate` (its trace from ``private_slot(columns, key)``) finalized into an
    ``Arranged`` trace."""
    if not accumulates(specs):
        return Reduce(child, group, specs, slot)
    sums = Accumulate(child, group, specs, private_slot(accumulator_columns(child, group, specs), tuple(group)))
    return Arranged(Finalize(sums), slot)


def _sum_column(spec: AggregateSpec) -> str:
    return f"{spec.column}_sum"


def _count_column(spec: AggregateSpec) -> str:
    return f"{spec.column}_count"


def accumulator_columns(child: Node, group: Sequence[str], specs: Sequence[AggregateSpec]) -> Columns:
    """The columns of :class:`Accumulate`'s trace: the group, its input tuples, and per
    aggregate the sum (``sum``, ``avg``) and count of its values."""
    kinds = dict(child.columns)
    columns = [(g, kinds[g]) for g in group] + [(ROWS, Kind.LONG)]
    for s in specs:
        if s.fn != "count":
            columns.append((_sum_column(s), Kind.DOUBLE if s.fn == "avg" else s.kind))
        columns.append((_count_column(s), Kind.LONG))
    return tuple(columns)


class Accumulate(Stateful):
    """Per group of a set-valued input, its number of tuples and the sums and counts its
    ``count``, ``sum`` and ``avg`` aggregates need, kept in a private trace as one row per
    group; an epoch adds its change's to the touched groups' (see the module docs)."""

    def __init__(self, child: Node, group: Sequence[str], specs: Sequence[AggregateSpec], slot: TraceSlot):
        super().__init__(child, slot)
        self.group = list(group)
        self.specs = list(specs)
        self.columns = accumulator_columns(child, group, specs)

    def params(self, ref):
        return {**super().params(ref), "group": list(self.group), "aggregates": [s.fn for s in self.specs]}

    def _state_delta(self, cx):
        d = self.child.delta(cx)
        if d is None:
            return None
        diff = ident(DIFF)
        sums = [f"SUM({diff}) AS {ident(ROWS)}"]
        for s in self.specs:
            x = ident(s.source)
            if s.fn != "count":
                value = f"CAST({x} AS DOUBLE)" if s.fn == "avg" else x
                sums.append(f"SUM({value} * {diff}) AS {ident(_sum_column(s))}")
            sums.append(f"SUM(CASE WHEN {x} IS NOT NULL THEN {diff} ELSE 0 END) AS {ident(_count_column(s))}")
        keys = [ident(g) for g in self.group]
        by = f" GROUP BY {', '.join(keys)}" if keys else ""
        change = cx.define(f"SELECT {', '.join(keys + sums)}, CAST(1 AS BIGINT) AS {diff} FROM {d}{by} "
                           "HAVING COUNT(*) > 0")
        old = self.state(cx, Version.OLD)
        if self.group:
            old = cx.define(zset.semijoin(old, change, self.group))
        totals = [ident(n) for n in self.names if n not in self.group]
        weighted = cx.define(f"SELECT {', '.join(keys + [f'{t} * {diff} AS {t}' for t in totals])} FROM {old}")
        both = " UNION ALL ".join(f"SELECT {', '.join(keys + totals)} FROM {r}" for r in (weighted, change))
        new = cx.define(f"SELECT {', '.join(keys + [f'SUM({t}) AS {t}' for t in totals])}, CAST(1 AS BIGINT) AS {diff} "
                        f"FROM ({both}){by} HAVING SUM({ident(ROWS)}) > 0")
        retracted = cx.define(zset.select(old, self.names, diff=f"-{diff}"))
        return cx.define(zset.consolidate(f"({zset.union([new, retracted], self.names)})", self.names))

    def _delta(self, cx):
        return self.state_delta(cx)

    def _read(self, cx, version):
        return self.state(cx, version)

    def describe(self):
        aggs = ", ".join(f"{s.fn}({s.source})" for s in self.specs)
        return f"Accumulate by {', '.join(self.group) or '(all)'}: {aggs} (from the change only)"


class Finalize(Linear):
    """The aggregates' values from :class:`Accumulate`'s sums and counts: the group and one
    column per aggregate, as :class:`Reduce` outputs them."""

    def __init__(self, child: Accumulate):
        super().__init__(child)
        self.group, self.specs = child.group, child.specs
        kinds = dict(child.columns)
        self.columns = tuple((g, kinds[g]) for g in self.group) + tuple((s.column, s.kind) for s in self.specs)

    def apply(self, relation):
        outs = [ident(g) for g in self.group]
        for s in self.specs:
            count = ident(_count_column(s))
            if s.fn == "count":
                value = count
            elif s.fn == "sum":
                value = f"CASE WHEN {count} > 0 THEN {ident(_sum_column(s))} END"
            else:
                value = f"CASE WHEN {count} > 0 THEN {ident(_sum_column(s))} / {count} END"
            outs.append(f"CAST({value} AS {sql_type(s.kind)}) AS {ident(s.column)}")
        return f"SELECT {', '.join(outs)}, {ident(DIFF)} FROM {relation}"

    def describe(self):
        return "Finalize " + ", ".join(f"{s.fn} as {s.column}" for s in self.specs)
