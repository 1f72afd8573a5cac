"""Planning pull expressions (``(pull ?e [...])`` in ``:find``) as flat maintained relations.

3DF compiles a pull into *pull stages*, one per attribute path of the pattern (seeds/000,
sections 5.1 and 12.1): each stage is a relation of the pulled entities and the values
reached along its path. factflow does the same. For the pull of ``?e`` the *roots* are the
set of ``?e`` values the query's ``:where`` binds (a :class:`Distinct` over its body), and
every path ``a1 a2 ... an`` of the pattern (``a1 .. a(n-1)`` reference attributes of
nested maps) is the conjunction ``[?root a1 ?x1] [?x1 a2 ?x2] ... [?x(n-1) an ?xn]``
joined with the roots by the query's join strategy, projected onto ``root, x1, .., xn``
and kept as a set in a private trace. Each path relation is maintained like any query
result: a change to an attribute at any depth, or to the roots, changes the rows of the
affected roots only. The driver assembles the nested maps of the result rows from these
rows (:mod:`factflow.engine.pull`).

``*`` expands to ``:db/id`` and every attribute the schema holds when the query is
installed (attributes created later are not pulled); ``:db/id`` needs no relation.
"""

from __future__ import annotations

from dataclasses import dataclass

from factflow.dataflow.nodes import Distinct, Node, Project
from factflow.edn import EdnVector, Symbol
from factflow.errors import QueryError
from factflow.lang.ast import Pattern, Pull, PullAttr, PullNested, PullPattern, PullWildcard, Var
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
    node: Distinct

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

    def nodes(self) -> list[Distinct]:
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


def plan_pull(element: Pull, body: Node, scope: Scope, pc: PlanContext) -> PullPlan:
    """The stages of ``element`` over the bindings ``body`` of the query's ``:where``."""
    where = str(element)
    column = scope.col(element.var)
    if column not in body.names:
        raise QueryError(f"{element.var} in {where} is not bound by any clause")
    if body.kind_of(column) != Kind.LONG:
        raise QueryError(f"{where}: {element.var} is a {body.kind_of(column).value}, not an entity id")
    fields = expand_pattern(element.pattern, pc, where)
    roots = pc.distinct(Project(body, [column]), f"pull roots {element.var}")
    plan = PullPlan(element, column, fields, {})

    def add(fields: tuple[PullField, ...], prefix: tuple[Attribute, ...], keys: tuple[str, ...]) -> None:
        for f in fields:
            if f.attribute is None:
                continue
            steps, key = prefix + (f.attribute,), keys + (f.key,)
            plan.paths[key] = PullPath(steps, _stage(steps, element.var, column, roots, pc, where))
            if f.nested is not None:
                add(f.nested, steps, key)

    add(fields, (), ())
    return plan


def _stage(steps: tuple[Attribute, ...], root: Var, column: str, roots: Node, pc: PlanContext,
           where: str) -> Distinct:
    """The set of rows ``(root, x1, ..., xn)`` of one attribute path, from the roots."""
    scope = Scope(pc)
    scope.share(root, column)
    chain = [root] + [Var(f"?pull{i + 1}") for i in range(len(steps))]
    clauses = [Pattern(chain[i], step.name, chain[i + 1],
                       EdnVector([Symbol(chain[i].name), step.name, Symbol(chain[i + 1].name)]))
               for i, step in enumerate(steps)]
    path = " ".join(str(a.name) for a in steps)
    body = plan_conjunction(clauses, [roots], scope, pc, label=f"{where} path {path}")
    rows = Project(body, [scope.col(v) for v in chain])
    trace = pc.private_trace(f"pull {root} {path}", rows.columns, tuple(rows.names), "result")
    return Distinct(rows, trace, pc.owner, role="result")
