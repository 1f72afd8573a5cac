"""Planning pull expressions (``(pull ?e [...])`` in ``:find``) as flat maintained relations.

3DF compiles a pull into *pull stages*, one per attribute path of the pattern (seeds/000,
sections 5.1 and 12.1): each stage is a relation of the pulled entities and the values
reached along its path. factflow does the same. For the pull of ``?e`` the *roots* are the
set of ``?e`` values the query's ``:where`` binds (a :class:`Distinct` over its body, or the
query's result itself when ``?e`` is all it holds). The
stage of a path ``a1 .. an`` (``a1 .. a(n-1)`` reference attributes of nested maps) holds
the rows ``(root, x1, .., xn)`` of ``[?root a1 ?x1] .. [?x(n-1) an ?xn]``: it is its parent
stage's rows ``(root, .., x(n-1))`` (the roots for ``n = 1``) joined with the shared
arrangement of ``an`` by the query's join strategy (a delta join under ``auto``: lookups,
no private state), kept in a private trace keyed by ``xn`` (a :class:`Distinct` only
where a raw attribute or a multiset result can derive a row twice), so that a change of
``a(n+1)`` probes it by key in a small epoch. Each stage is maintained like any
query result: a change to an attribute at any depth, or to the roots, changes the rows
of the affected roots only. The driver assembles the nested maps of the result rows from
these rows (:mod:`factflow.engine.pull`).

``*`` expands to ``:db/id`` and every attribute the schema holds when the query is
installed (attributes created later are not pulled); ``:db/id`` needs no relation.
"""

from __future__ import annotations

from dataclasses import dataclass

from factflow.dataflow.nodes import Arranged, Distinct, Node, Project, Stateful
from factflow.edn import EdnVector, Symbol
from factflow.errors import QueryError
from factflow.lang.ast import Pattern, Pull, PullAttr, PullNested, PullPattern, PullWildcard, Var, show
from factflow.lang.pull import DB_ID
from factflow.model.schema import Attribute
from factflow.model.types import Kind
from factflow.planner.conjunction import Scope, plan_conjunction
from factflow.planner.context import PlanContext

__all__ = ["PullField", "PullPath", "PullPlan", "expand_pattern", "plan_pull"]


@dataclass(frozen=True)
class PullField:
    """One key of a pulled map: ``attribute`` (None for ``:db/id``) and, for a nested map,
    the fields of the referenced entities."""

    key: str
    attribute: Attribute | None
    nested: tuple["PullField", ...] | None = None


@dataclass
class PullPath:
    """One pull stage: the attribute chain from the root, and the set of its rows
    ``(root, x1, ..., xn)`` maintained by ``node``."""

    steps: tuple[Attribute, ...]
    node: Stateful

    @property
    def label(self) -> str:
        """The path as text, e.g. ``:person/knows :person/firstName``."""
        return " ".join(str.__str__(a.name) for a in self.steps)


@dataclass
class PullPlan:
    """The pull of one ``:find`` element: its entity column, expanded fields and stages."""

    element: Pull
    column: str
    fields: tuple[PullField, ...]
    paths: dict[tuple[str, ...], PullPath]  # by the keys of the path's fields

    def nodes(self) -> list[Stateful]:
        """The stateful operators of the stages."""
        return [p.node for p in self.paths.values()]


def expand_pattern(pattern: PullPattern, pc: PlanContext, where: str) -> tuple[PullField, ...]:
    """The fields of ``pattern`` with ``*`` expanded over the schema and every attribute
    looked up (a QueryError naming an unknown attribute, or a nested map on a non-ref)."""
    fields: dict[str, PullField] = {}
    for item in pattern.items:
        if isinstance(item, PullWildcard):
            fields.setdefault(DB_ID, PullField(DB_ID, None))
            for attribute in sorted(pc.schema, key=lambda a: str(a.name)):
                fields.setdefault(str.__str__(attribute.name), PullField(str.__str__(attribute.name), attribute))
            continue
        key = str.__str__(item.name)
        if isinstance(item, PullAttr) and key == DB_ID:
            fields[key] = PullField(key, None)
            continue
        attribute = pc.attribute(item.name, where)
        if isinstance(item, PullNested):
            if attribute.value_type != "ref":
                raise QueryError(f"{where}: {key} is a {attribute.value_type} attribute; only ref attributes "
                                 "take a nested pattern")
            fields[key] = PullField(key, attribute, expand_pattern(item.pattern, pc, where))
        else:
            fields[key] = PullField(key, attribute)
    return tuple(fields.values())


def plan_pull(element: Pull, body: Node, result: Stateful, scope: Scope, pc: PlanContext) -> PullPlan:
    """The stages of ``element`` over the bindings ``body`` of the query's ``:where``
    (``result``, the query's result operator, serves as the roots when it holds only the
    pulled entities)."""
    where = str(element)
    column = scope.col(element.var)
    if column not in body.names:
        raise QueryError(f"{element.var} in {where} is not bound by any clause")
    if body.kind_of(column) != Kind.LONG:
        raise QueryError(f"{where}: {element.var} is a {body.kind_of(column).value}, not an entity id")
    fields = expand_pattern(element.pattern, pc, where)
    roots = (result if result.names == [column]
             else pc.distinct(Project(body, [column]), f"pull roots {element.var}"))
    plan = PullPlan(element, column, fields, {})

    def add(fields: tuple[PullField, ...], parent: Node, parent_is_set: bool, steps: tuple[Attribute, ...],
            keys: tuple[str, ...]) -> None:
        for f in fields:
            if f.attribute is None:
                continue
            unique = parent_is_set and f.attribute.is_set
            path = PullPath(steps + (f.attribute,), _stage(f.attribute, parent, unique, element.var, pc, where))
            plan.paths[keys + (f.key,)] = path
            if f.nested is not None:
                add(f.nested, path.node, True, path.steps, keys + (f.key,))

    add(fields, roots, roots is not result or pc.semantics == "set", (), ())
    return plan


def _stage(attribute: Attribute, parent: Node, unique: bool, root: Var, pc: PlanContext, where: str) -> Stateful:
    """The set of rows ``(root, x1, ..., xn)``: the parent stage's rows ``(root, .., x(n-1))``
    (or the roots) extended by the values of ``attribute`` of ``x(n-1)``. When the parent
    is a set and the attribute too (``unique``), every row is derived once: the rows are
    arranged as they come, without the derivation counts (and their reads) of a Distinct."""
    scope = Scope(pc)
    chain = [root] + [Var(f"?pull{i}") for i in range(1, len(parent.names) + 1)]
    for var, column in zip(chain, parent.names):
        scope.share(var, column)
    entity, value = chain[-2], chain[-1]
    form = EdnVector([Symbol(entity.name), attribute.name, Symbol(value.name)])
    clause = Pattern(entity, attribute.name, value, form)
    body = plan_conjunction([clause], [parent], scope, pc, label=f"{where} stage {show(clause)}")
    rows = Project(body, [*parent.names, scope.col(value)])
    # keyed by the value: a nested stage looks this one up by its entity (the referenced one)
    slot = pc.private_trace(f"pull {root} {attribute.name} of {entity}", rows.columns, (rows.names[-1],), "result")
    return (Arranged if unique else Distinct)(rows, slot)
