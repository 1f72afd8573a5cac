"""Aggregation in ``:find``: the Reduce operator and the SQL of each aggregate function.

Datomic semantics: the aggregates see the *set* of tuples over the find variables and the
``:with`` variables (so ``:with`` keeps tuples that would otherwise collapse), grouped by
the non-aggregated find variables. Reduce keeps its current output in a private trace
and, per epoch, recomputes only the groups its input change touches: the new rows of
those groups enter with +1, their old rows leave with -1.

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
from factflow.dataflow.nodes import Columns, Node, Stateful
from factflow.dataflow.slots import TraceSlot
from factflow.dataflow.zset import ident
from factflow.errors import QueryError
from factflow.model.types import Kind

__all__ = ["AggregateSpec", "aggregate_spec", "Reduce"]

NUMERIC_ONLY = {"sum", "avg", "median", "variance", "stddev"}
TAKING_N = {"min", "max", "sample"}  # (fn n ?x) forms, which return a tuple of up to n values


@dataclass(frozen=True)
class AggregateSpec:
    """One aggregate: its output column, kind, SQL over the input column, and Python decoder."""

    column: str
    kind: Kind
    sql: str
    decode: Callable[[Any], Any] | None = None


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
        return AggregateSpec(out, out_kind, sql)
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
