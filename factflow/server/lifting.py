"""Automatic sharing: the same query with different constants, one dataflow for all clients.

Clients that did not opt in to tenants still often ask one query with their own constants:
``[?d :device/speed ?s] [(= ?d 111)]``, ``[111 :device/speed ?s]``, or an ``:in`` scalar. Each
would install a dataflow of its own. The server instead *lifts* the constants out of the
query into a parameter relation it owns (thesis, section 10.4): the lifted query reads
``[?k :factflow-lift.<family>/p0 ?c0] ...`` first, where ``?c0`` stands where the constant
stood, and finds ``?k`` beside the original ``:find``. Each distinct tuple of constants is
one parameter entity ``K`` with one fact per constant; a client's rows are the lifted
query's rows whose ``?k`` is its ``K``, without that column (routed as a tenant-routed
published query's rows are, :class:`factflow.server.publication.Publication`).

What is lifted, and where it keeps the plan as good: a constant in the entity or value
position of a top-level pattern, one side of a top-level ``=`` predicate against a
variable, and a scalar ``:in`` input. The parameter patterns come first in the lifted
query, so that they bind the constants' variables before anything else reads them (one
row per client, looked up by key from either side). Constants are left in place inside
``not`` and ``or`` (lifting would move them out of the clause's scope), in other
predicates and functions (a range is not a relation to join), as attributes, keywords and
collection inputs; a query with nothing to lift, or whose ``:find`` is not a relation of
plain variables and aggregates, is installed as it is. :func:`lift` says what it lifted and
what it left, and why (the server's ``explain`` shows it).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

from factflow import edn
from factflow.edn import EdnVector, Keyword, Symbol
from factflow.errors import FactflowError
from factflow.lang.ast import BindScalar, Const, FindVar, Aggregate, InBinding, Not, Or, Pattern, Predicate, Var, show
from factflow.lang.parser import parse_query, query_sections
from factflow.model.schema import Schema

__all__ = ["Lifted", "lift", "touches_lifted_parameters", "LIFT_PREFIX", "KEY_VAR"]

#: The namespace of the parameter attributes the server owns (clients may not write them).
LIFT_PREFIX = ":factflow-lift."
KEY_VAR = "?__lift_key"


@dataclass(frozen=True)
class Lifted:
    """A query with its constants lifted: the ``family`` all queries of its shape share, the
    lifted ``text`` and remaining ``inputs``, the ``attributes`` of its parameter relation
    (with their value types), this query's ``constants`` (one per attribute), and in words
    what was ``lifted`` and what was ``kept`` in place."""

    family: str
    text: str
    inputs: tuple[Any, ...]
    attributes: tuple[tuple[str, str], ...]
    constants: tuple[Any, ...]
    lifted: tuple[str, ...]
    kept: tuple[str, ...]

    def explain(self) -> str:
        """What was lifted and why the rest was not, in words."""
        lines = [f"constants lifted into the parameter relation of {self.family}: " + "; ".join(self.lifted)]
        if self.kept:
            lines.append("left in place: " + "; ".join(self.kept))
        return "\n".join(lines)


def lift(text: str, inputs: Sequence[Any], schema: Schema) -> Lifted | None:
    """The query ``text`` with ``inputs`` lifted (see the module docstring), or None when
    nothing can be lifted."""
    try:
        form = edn.read(text)
        query = parse_query(form)
        sections = query_sections(form)
    except FactflowError:
        return None  # the ordinary install reports what is wrong with it
    if query.find.kind != "rel" or not all(isinstance(e, (FindVar, Aggregate)) for e in query.find.elements):
        return None
    taken = {str(s) for s in _symbols(form)}
    fresh = (f"?__lift{i}" for i in range(10**6))
    parameters: list[tuple[str, Any, str]] = []  # (variable, constant, value type)
    lifted, kept = [], []

    in_forms, kept_inputs = [], []
    values = iter(inputs)
    for item, spec in zip(sections.get(":in", []), query.inputs):
        if not isinstance(spec, InBinding):
            in_forms.append(item)
            continue
        value = next(values)
        value_type = _value_type(value)
        if isinstance(spec.binding, BindScalar) and value_type is not None:
            parameters.append((spec.binding.var.name, value, value_type))
            lifted.append(f"the input {spec.binding.var.name} = {edn.write(value)}")
        else:
            in_forms.append(item)
            kept_inputs.append(value)
            kept.append(f"the input {edn.write(item)} (only scalar inputs are lifted)")

    where_forms = []
    for clause, item in zip(query.where, sections.get(":where", [])):
        if isinstance(clause, Pattern):
            parts = list(item)
            for position, term in ((0, clause.e), (2, clause.v)):
                if isinstance(term, Const) and not isinstance(term.value, Keyword) and position < len(parts):
                    value_type = "ref" if position == 0 else _attribute_type(schema, clause.a)
                    if value_type is None or _value_type(term.value) is None:
                        continue
                    variable = _next_free(fresh, taken)
                    parameters.append((variable, term.value, value_type))
                    parts[position] = Symbol(variable)
                    lifted.append(f"{edn.write(term.value)} in {show(clause)}")
            where_forms.append(EdnVector(parts))
        elif isinstance(clause, Predicate) and clause.fn == "=" and len(clause.args) == 2 and _var_and_const(clause):
            variable, value = _var_and_const(clause)
            value_type = _value_type(value)
            if value_type is None:
                where_forms.append(item)
                kept.append(f"{show(clause)} (no parameter of that type)")
                continue
            parameters.append((variable, value, value_type))
            lifted.append(f"{show(clause)}")
        else:
            if isinstance(clause, (Not, Or)) and _has_constant(item):
                kept.append(f"the constants of {show(clause)} (lifting would move them out of its scope)")
            elif isinstance(clause, Predicate) and any(isinstance(a, Const) for a in clause.args):
                kept.append(f"the constant of {show(clause)} (only = joins a parameter relation)")
            where_forms.append(item)
    if not parameters:
        return None

    placeholders = [f"{LIFT_PREFIX}family/p{i}" for i in range(len(parameters))]
    key = Symbol(KEY_VAR)
    parameter_forms = [EdnVector([key, Keyword(attribute), Symbol(variable)])
                       for attribute, (variable, _, _) in zip(placeholders, parameters)]
    types = tuple(value_type for _, _, value_type in parameters)
    shape = _compose(sections, key, in_forms, parameter_forms + where_forms)
    family = "lift-" + hashlib.sha256(edn.write([shape, list(kept_inputs), list(types)]).encode()).hexdigest()[:12]
    attributes = tuple((f"{LIFT_PREFIX}{family}/p{i}", value_type) for i, value_type in enumerate(types))
    final_forms = [EdnVector([key, Keyword(attribute), Symbol(variable)])
                   for (attribute, _), (variable, _, _) in zip(attributes, parameters)]
    final = _compose(sections, key, in_forms, final_forms + where_forms)
    return Lifted(family, final, tuple(kept_inputs), attributes, tuple(value for _, value, _ in parameters),
                  tuple(lifted), tuple(kept))


def touches_lifted_parameters(tx: Any) -> bool:
    """Whether the transaction ``tx`` (operations, or EDN text) names a lifted parameter attribute."""
    if isinstance(tx, str):
        return LIFT_PREFIX in tx
    return any(isinstance(op, (list, tuple)) and len(op) > 2 and str(op[2]).startswith(LIFT_PREFIX) for op in tx)


def _compose(sections: dict[str, list], key: Symbol, in_forms: list, where: list) -> str:
    """The EDN text of a query from its sections, ``key`` first in ``:find``."""
    parts: list[Any] = [Keyword(":find"), key, *sections[":find"]]
    if sections.get(":with"):
        parts += [Keyword(":with"), *sections[":with"]]
    if in_forms and in_forms != [Symbol("$")]:
        parts += [Keyword(":in"), *in_forms]
    parts += [Keyword(":where"), *where]
    return edn.write(EdnVector(parts))


def _var_and_const(clause: Predicate) -> tuple[str, Any] | None:
    first, second = clause.args
    if isinstance(first, Var) and isinstance(second, Const):
        return first.name, second.value
    if isinstance(second, Var) and isinstance(first, Const):
        return second.name, first.value
    return None


def _value_type(value: Any) -> str | None:
    """The attribute type a parameter holding ``value`` has (None: not liftable)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str) and not isinstance(value, (Symbol, Keyword)):
        return "string"
    if isinstance(value, _dt.datetime):
        return "instant"
    return None


def _attribute_type(schema: Schema, attribute: Keyword) -> str | None:
    try:
        return schema.get(attribute).value_type
    except FactflowError:
        return None


def _has_constant(form: Any) -> bool:
    if isinstance(form, (list, tuple)):
        return any(_has_constant(item) for item in form)
    return _value_type(form) is not None


def _symbols(form: Any):
    if isinstance(form, Symbol):
        yield form
    elif isinstance(form, (list, tuple)):
        for item in form:
            yield from _symbols(item)
    elif isinstance(form, dict):
        for key, value in form.items():
            yield from _symbols(key)
            yield from _symbols(value)


def _next_free(fresh, taken: set[str]) -> str:
    for name in fresh:
        if name not in taken:
            taken.add(name)
            return name
    raise AssertionError("unreachable")
