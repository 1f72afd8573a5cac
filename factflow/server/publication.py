"""Queries an admin publishes for tenants: what may be published, and each tenant's rows.

``{"op": "publish", "name": "watch", "query": "...", "tenant": "?t"}`` installs one dataflow
for every tenant. With ``tenant``, the query is *tenant-routed*: ``?t`` must be a plain
``:find`` variable, and every pattern on a parameter attribute must have ``?t`` as its
entity, so that no tenant's rows depend on another tenant's parameters; each epoch's changes
are split by the value of ``?t`` (a tenant's entity, see :mod:`factflow.server.tenants`) and
go only to that tenant's connections, without the ``?t`` column. Without ``tenant`` the
query is *public*: every interested tenant receives all of it, and it may read no parameter
attribute at all (every tenant would see every tenant's parameters). Parameter patterns
must stand in the published query itself, not inside the rules it calls, where the check
could not follow the tenant variable.

A published query's rows are kept on the driver as they change, per tenant for a routed
one (:class:`Publication`), so that a tenant joining gets its current rows at once,
without a Spark job; rows for a tenant with no connection are dropped (counted, not an
error: a tenant that left mid-epoch is not a fault).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from factflow.errors import FactflowError
from factflow.lang.ast import FindVar, Pattern, Query, RuleCall, Var, nested, show
from factflow.lang.parser import parse_query
from factflow.lang.rules import RuleStore
from factflow.model.schema import Schema
from factflow.server.protocol import ProtocolError

__all__ = ["Publication", "check_publication", "LABEL"]

#: The label (see :meth:`factflow.Engine.query`) under which a published query keeps its tenant variable.
LABEL = "factflow.published"
_PUBLIC = ""


def check_publication(text: str, tenant: str | None, schema: Schema, rules: RuleStore) -> int | None:
    """The column of ``tenant`` in the ``:find`` of the query ``text`` (None: a public
    query), or ``incorrect`` naming what may not be published (see the module docstring)."""
    try:
        query = parse_query(text)
    except FactflowError as exc:
        raise ProtocolError("incorrect", f"publish: {exc}") from None
    column = None
    if tenant is not None:
        columns = [e.var.name if isinstance(e, FindVar) else None for e in query.find.elements]
        if query.find.kind != "rel" or tenant not in columns:
            shown = " ".join(str(e) for e in query.find.elements)
            raise ProtocolError("incorrect", f"publish: the tenant variable {tenant} must be a plain variable of a "
                                             f"relation :find (the query finds {shown})")
        column = columns.index(tenant)
    for clause, inside in _patterns(query, rules):
        if not _parameter(schema, clause):
            continue
        if inside is not None:
            raise ProtocolError("incorrect", f"publish: {show(clause)} reads the parameter attribute {clause.a} inside "
                                             f"rule {inside}; match parameters in the published query itself")
        if tenant is None:
            raise ProtocolError("incorrect", f"publish: the public query reads the parameter attribute {clause.a} in "
                                             f"{show(clause)}: every tenant would see every tenant's parameters "
                                             "(publish it with a tenant variable)")
        if clause.e != Var(tenant):
            raise ProtocolError("incorrect", f"publish: {show(clause)} reads the parameter attribute {clause.a} of "
                                             f"another entity than the tenant {tenant}: a tenant's rows would depend "
                                             "on other tenants' parameters")
    return column


def _parameter(schema: Schema, pattern: Pattern) -> bool:
    try:
        return schema.get(pattern.a).parameter
    except FactflowError:
        return False


def _patterns(query: Query, rules: RuleStore) -> Iterable[tuple[Pattern, str | None]]:
    """Every pattern the query reads, with the rule it stands in (None: the query itself)."""
    seen: set[str] = set()

    def walk(clauses, inside: str | None):
        for clause, _ in nested(clauses):
            if isinstance(clause, Pattern):
                yield clause, inside
            elif isinstance(clause, RuleCall) and clause.name in rules and clause.name not in seen:
                seen.add(clause.name)
                for rule in rules.bodies(clause.name):
                    yield from walk(rule.body, inside or clause.name)

    yield from walk(query.where, None)


@dataclass
class Publication:
    """A published query's routing and its rows as of the latest epoch, per tenant entity
    (the key :data:`_PUBLIC` for a public query), without the tenant column."""

    column: int | None
    rows: dict[Any, Counter] = field(default_factory=dict)
    dropped: int = 0  # change rows for tenants that had no connection

    @property
    def tenant_routed(self) -> bool:
        """Whether rows go to the tenant their tenant column names."""
        return self.column is not None

    def split(self, changes: list[tuple[tuple, int]]) -> dict[Any, list[tuple[tuple, int]]]:
        """An epoch's changes per tenant (the tenant column removed), folded into the rows kept."""
        parts: dict[Any, list[tuple[tuple, int]]] = {}
        for row, diff in changes:
            key = _PUBLIC if self.column is None else row[self.column]
            rest = row if self.column is None else row[:self.column] + row[self.column + 1:]
            parts.setdefault(key, []).append((rest, diff))
            held = self.rows.setdefault(key, Counter())
            held[rest] += diff
            if not held[rest]:
                del held[rest]
        return parts

    def current(self, tenant_entity: Any) -> list[tuple[tuple, int]]:
        """The rows a tenant (its entity; anyone, for a public query) sees now."""
        key = _PUBLIC if self.column is None else tenant_entity
        return list(self.rows.get(key, Counter()).items())

    def everything(self) -> list[tuple[tuple, int]]:
        """Every row, the tenant column put back in (what an admin or an unrestricted client sees)."""
        if self.column is None:
            return self.current(None)
        return [(row[:self.column] + (key,) + row[self.column:], n)
                for key, part in self.rows.items() for row, n in part.items()]

    def columns(self, columns: list[str]) -> list[str]:
        """The query's columns as a tenant receives them."""
        return columns if self.column is None else columns[:self.column] + columns[self.column + 1:]
