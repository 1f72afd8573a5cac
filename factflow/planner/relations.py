"""Constant relations: query inputs (``:in`` bindings) and literal collections (``ground``)."""

from __future__ import annotations

import datetime as _dt
from typing import Any, Sequence

from factflow.dataflow.nodes import Static
from factflow.dataflow.slots import RowsSlot
from factflow.errors import QueryError
from factflow.lang.ast import BindColl, Binding, BindRel, BindScalar, BindTuple, Blank, Var
from factflow.model.types import Kind, kind_of_python_value, to_utc_naive
from factflow.planner.context import PlanContext
from factflow.text import plural

__all__ = ["binding_rows", "static_relation"]


def binding_rows(binding: Binding, value: Any, where: str) -> tuple[list[Var | Blank], list[tuple]]:
    """The element terms and rows a binding form makes of a Python value."""
    if isinstance(binding, BindScalar):
        return [binding.var], [(value,)]
    if isinstance(binding, BindTuple):
        row = _sequence(value, where)
        if len(row) != len(binding.elements):
            raise QueryError(f"{where}: expected a tuple of {plural(len(binding.elements), 'value')}, got {len(row)}")
        return list(binding.elements), [tuple(row)]
    if isinstance(binding, BindColl):
        return [binding.var], [(v,) for v in _sequence(value, where)]
    if isinstance(binding, BindRel):
        rows = []
        for row in _sequence(value, where):
            row = _sequence(row, where)
            if len(row) != len(binding.elements):
                raise QueryError(f"{where}: every row must have {plural(len(binding.elements), 'value')}; got {row!r}")
            rows.append(tuple(row))
        return list(binding.elements), rows
    raise TypeError(binding)


def _sequence(value: Any, where: str) -> list:
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise QueryError(f"{where}: expected a collection, got {value!r}")
    return list(value)


def _column_kind(values: Sequence[Any], var: Var, expected: Kind | None, where: str) -> Kind:
    kinds = set()
    for v in values:
        k = kind_of_python_value(v)
        if k is None:
            raise QueryError(f"{where}: value {v!r} for {var} has unsupported type {type(v).__name__}")
        kinds.add(k)
    if kinds == {Kind.LONG, Kind.DOUBLE}:
        kinds = {Kind.DOUBLE}
    if len(kinds) > 1:
        raise QueryError(f"{where}: values for {var} mix types {', '.join(sorted(k.value for k in kinds))}")
    found = kinds.pop() if kinds else expected or Kind.LONG
    if expected is None or expected == found:
        return found
    if expected is Kind.DOUBLE and found is Kind.LONG:
        return Kind.DOUBLE
    raise QueryError(f"{where}: {var} is given {found.value} values but the query uses it as a {expected.value}")


def static_relation(pc: PlanContext, elements: Sequence[Var | Blank], rows: Sequence[tuple],
                    expected: dict[Var, Kind], columns: dict[Var, str], where: str) -> Static:
    """A Static operator over the distinct ``rows`` for the variables among ``elements``."""
    keep = [i for i, e in enumerate(elements) if isinstance(e, Var)]
    variables = [elements[i] for i in keep]
    if len(set(variables)) != len(variables):
        raise QueryError(f"{where}: a variable is bound twice")
    projected = [tuple(row[i] for i in keep) for row in rows]
    for row in projected:
        for v in row:
            if v is None:
                raise QueryError(f"{where}: nil is not a valid input value")
    distinct = list(dict.fromkeys(projected))
    kinds = [_column_kind([row[j] for row in distinct], var, expected.get(var), where)
             for j, var in enumerate(variables)]
    # sorted: a relation is a set, so inputs given in another order plan the same
    converted = tuple(sorted({tuple(_convert(v, k) for v, k in zip(row, kinds)) for row in distinct}))
    slot = RowsSlot(tuple((columns[var], k) for var, k in zip(variables, kinds)), converted, pc.owner)
    return Static(slot, f"{where} ({plural(len(distinct), 'row')})")


def _convert(value: Any, kind: Kind) -> Any:
    if kind is Kind.DOUBLE:
        return float(value)
    if kind is Kind.INSTANT and isinstance(value, _dt.datetime):
        return to_utc_naive(value)
    return value
