"""Synthesis of a query into a plan: inputs, body, projection onto ``:find``, result state.

``plan_query`` is the planning half of what ``interest`` does: it resolves the rules the
query depends on, plans its body for the chosen join strategy and ends the dataflow in a
*result* operator that will keep the query's current result in a private trace
(derivation counts under set semantics, so each tuple is reported once; plain
multiplicities under multiset). It reads the schema, the rules and the shared rules, and
allocates nothing: the :class:`~factflow.planner.plan.Plan` it returns is installed by
:func:`factflow.engine.install.install`.
"""

from __future__ import annotations

from typing import Any, Sequence

from factflow.dataflow.aggregate import Reduce, aggregate_spec, reduce_columns
from factflow.dataflow.nodes import Arranged, Distinct, Node, Project, Stateful, Static
from factflow.errors import QueryError
from factflow.lang.ast import (
    Aggregate, BindScalar, Blank, Const, FindVar, FnCall, Pattern, Predicate, Pull, Query, Var, binding_vars, show,
    term_vars,
)
from factflow.lang.parser import parse_query
from factflow.lang.rules import RuleStore
from factflow.model.schema import Schema
from factflow.planner.conjunction import Scope, pattern_kinds, plan_conjunction
from factflow.planner.context import PlanContext
from factflow.planner.plan import Plan, PlanSource
from factflow.planner.pull import PullPlan, plan_pull
from factflow.planner.relations import binding_rows, static_relation
from factflow.planner.shared import SharedRules
from factflow.planner.strategy import requested_strategy
from factflow.text import plural

__all__ = ["plan_query"]


def _bind_inputs(query: Query, inputs: Sequence[Any], scope: Scope, pc: PlanContext) -> list[Static]:
    bindings = query.binding_inputs
    if len(inputs) != len(bindings):
        raise QueryError(f"the query's :in expects {plural(len(bindings), 'input')} after $, but got {len(inputs)}")
    expected = pattern_kinds(query.where, pc)
    sources = []
    for i, (inp, value) in enumerate(zip(bindings, inputs)):
        where = f"input {i + 1} of :in"
        elements, rows = binding_rows(inp.binding, value, where)
        for e in elements:
            if isinstance(e, Var):
                scope.col(e)
        sources.append(static_relation(pc, elements, rows, expected, scope.columns, where))
    return sources


def _unique_derivations(query: Query, pc: PlanContext, output: list[Var]) -> bool:
    """Whether every derivation yields a distinct output tuple, so no Distinct is needed.

    True when every relation is a set (attributes with set or one semantics, inputs) and the
    output variables functionally determine every variable and every blank of the body:
    a function's result is determined by its arguments, and the value of a
    cardinality-one attribute by its entity. Predicates only filter.
    """
    clauses = [c for c in query.where if not isinstance(c, Predicate)]
    if any(not isinstance(c, (Pattern, FnCall)) for c in clauses):
        return False
    if any(isinstance(c, FnCall) and not isinstance(c.binding, BindScalar) for c in clauses):
        return False
    patterns = [(c, pc.attribute(c.a, show(c))) for c in clauses if isinstance(c, Pattern)]
    if any(not attribute.is_set or isinstance(c.e, Blank) for c, attribute in patterns):
        return False
    input_vars = {v for i in query.binding_inputs for v in binding_vars(i.binding)}
    known = set(output)
    if not input_vars <= known:
        return False
    changed = True
    while changed:
        changed = False
        for c in clauses:
            if isinstance(c, FnCall) and set(term_vars(c.args)) <= known and c.binding.var not in known:
                known.add(c.binding.var)
                changed = True
        for c, attribute in patterns:
            determined = isinstance(c.e, Const) or c.e in known
            if attribute.semantics == "one" and determined and isinstance(c.v, Var) and c.v not in known:
                known.add(c.v)
                changed = True
    for c, attribute in patterns:
        if isinstance(c.e, Var) and c.e not in known:
            return False
        if isinstance(c.v, Var) and c.v not in known:
            return False
        if isinstance(c.v, Blank) and attribute.semantics != "one":
            return False
    return True


def plan_query(query: str | Query, schema: Schema, rules: RuleStore, inputs: Sequence[Any] = (),
               join: str = "auto", semantics: str = "set", shared_rules: SharedRules | None = None) -> Plan:
    """The plan of ``query`` (text or parsed) with ``inputs`` for its ``:in`` bindings, join
    strategy ``join`` and ``semantics`` ('set' or 'multiset'), over ``schema`` and ``rules``;
    rules ``shared_rules`` holds already are read from there (None: every rule is planned
    for this query alone). Allocates nothing; a QueryError for a query that cannot be planned."""
    if semantics not in ("set", "multiset"):
        raise QueryError(f"semantics must be 'set' or 'multiset', not {semantics!r}")
    parsed = parse_query(query) if isinstance(query, str) else query
    pc = PlanContext(schema, rules, semantics, requested_strategy(join), shared_rules)
    plan = _synthesize(parsed, tuple(inputs), pc, join)
    plan.source = PlanSource(query, tuple(inputs), join)
    return plan


def _plan(pc: PlanContext, result: Stateful, find: list, strategy: str, join: str, find_kind: str,
          decoders: dict | None = None, pulls: Sequence[PullPlan] = ()) -> Plan:
    return Plan(result, find, find_kind, decoders or {}, strategy, join, pc.semantics, pulls, pc.strategies,
                pc.notes, pc.shared, pc.attributes)


def _synthesize(query: Query, inputs: Sequence[Any], pc: PlanContext, join: str) -> Plan:
    scope = Scope(pc)
    sources = _bind_inputs(query, inputs, scope, pc)
    root = plan_conjunction(query.where, sources, scope, pc)
    strategy = pc.strategy_of("query")
    find_vars = [e.var for e in query.find.elements if isinstance(e, (FindVar, Pull))]
    if len(set(find_vars)) != len(find_vars):
        raise QueryError(":find names a variable twice (a pull of ?e holds its id when the pattern has :db/id)")
    aggregates = [e for e in query.find.elements if isinstance(e, Aggregate)]
    pulls = [e for e in query.find.elements if isinstance(e, Pull)]
    if pulls and aggregates:
        raise QueryError(f"{pulls[0]} cannot be combined with aggregates in :find")
    output = list(dict.fromkeys(find_vars + [a.var for a in aggregates] + list(query.with_vars)))
    for v in output:
        if scope.col(v) not in root.names:
            raise QueryError(f"{v} in :find{'/:with' if v in query.with_vars else ''} is not bound by any clause")
    columns = [scope.col(v) for v in output]
    projected = Project(root, columns)
    if aggregates:
        return _aggregation(query, pc, scope, projected, find_vars, aggregates, strategy, join, output)
    slot = pc.private_trace("result", projected.columns, tuple(columns), "result")
    needs_distinct = pc.semantics == "set" and not _unique_derivations(query, pc, output)
    result: Stateful = Distinct(projected, slot) if needs_distinct else Arranged(projected, slot)
    find = [(e if isinstance(e, Pull) else FindVar(e.var), scope.col(e.var)) for e in query.find.elements]
    stages = [plan_pull(p, root, result, scope, pc) for p in pulls]
    return _plan(pc, result, find, strategy, join, query.find.kind, pulls=stages)


def _aggregation(query: Query, pc: PlanContext, scope: Scope, projected: Node, find_vars: list[Var],
                 aggregates: list[Aggregate], strategy: str, join: str, output: list[Var]) -> Plan:
    """Group the set of find (and :with) tuples by the plain find variables and aggregate.

    The tuples are made a set by a Distinct (a private trace of derivation counts) unless
    every derivation yields a distinct tuple (:func:`_unique_derivations`) and every
    aggregate is accumulated: a Reduce that accumulates reads only its input's change, and
    adds each tuple's contribution times its diff, so it needs neither the Distinct's
    state nor a consolidated change. TPC-H's Q1 and Q6 (line items' attributes joined by
    line item, ``:with ?l``) are such: the Distinct held a row per line item."""
    group = [scope.col(v) for v in find_vars]
    specs = []
    for a in aggregates:
        col = scope.col(a.var)
        specs.append(aggregate_spec(a.fn, a.params, col, projected.kind_of(col), pc.column(a.fn), show(a)))
    if all(s.accumulated for s in specs) and _unique_derivations(query, pc, output):
        tuples = projected
    else:
        tuples = pc.distinct(projected, "aggregate input")
    slot = pc.private_trace("result", reduce_columns(tuples, group, specs), tuple(group), "result")
    result = Reduce(tuples, group, specs, slot)
    by_agg = dict(zip(aggregates, specs))
    find = [(e, scope.col(e.var)) if isinstance(e, FindVar) else (e, by_agg[e].column)
            for e in query.find.elements]
    decoders = {s.column: s.decode for s in specs if s.decode is not None}
    return _plan(pc, result, find, strategy, join, query.find.kind, decoders)
