"""Synthesis of a query into a dataflow: inputs, body, projection onto ``:find``, result state.

``synthesize`` is what ``interest`` does: it resolves the rules the query depends on,
plans its body for the chosen join strategy and ends the dataflow in a *result* operator
that keeps the query's current result in a private trace (derivation counts under set
semantics, so each tuple is reported once; plain multiplicities under multiset).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from factflow.dataflow.aggregate import Reduce, aggregate_spec
from factflow.dataflow.recursion import Fixpoint
from factflow.dataflow.nodes import Arranged, Distinct, Node, Project, Stateful, Static
from factflow.errors import QueryError
from factflow.lang.ast import (
    Aggregate, BindScalar, Blank, Const, FindElement, FindVar, FnCall, Pattern, Pull, Query, Var, binding_vars, show,
    term_vars,
)
from factflow.planner.conjunction import Scope, pattern_kinds, plan_conjunction
from factflow.planner.context import PlanContext
from factflow.planner.pull import PullPlan, plan_pull
from factflow.planner.relations import binding_rows, static_relation
from factflow.planner.shared import SharedRule
from factflow.planner.strategy import requested_strategy

__all__ = ["Dataflow", "synthesize"]


class Dataflow:
    """A synthesized query: its operators, the state they hold, and its result operator."""

    def __init__(self, pc: PlanContext, result: Stateful, find: list[tuple[FindElement, str]], strategy: str,
                 requested: str, find_kind: str = "rel", decoders: dict[str, Callable] | None = None,
                 pulls: Sequence[PullPlan] = ()):
        self.pc = pc
        self.name = pc.name
        self.result = result
        self.find = find
        self.find_kind = find_kind
        self.decoders = dict(decoders or {})
        self.strategy = strategy
        self.requested_strategy = requested
        self.semantics = pc.semantics
        #: the pull expressions of :find, whose stages are maintained beside the result
        self.pulls = list(pulls)
        self.nodes: list[Node] = list({id(n): n for root in [result, *self.pull_nodes()] for n in root.walk()}
                                      .values())
        self.stateful: list[Node] = [n for n in self.nodes if isinstance(n, (Stateful, Fixpoint))]
        self.attributes = set(pc.attributes)

    def pull_nodes(self) -> list[Stateful]:
        """The stateful operators of every pull stage (see :mod:`factflow.planner.pull`)."""
        return [n for p in self.pulls for n in p.nodes()]

    def outputs(self, subscribed: bool) -> list[Stateful]:
        """The operators whose changes an epoch must fetch for this query: the result when
        someone subscribes; with pulls, the result and every stage (their rows on the driver
        are kept up to date whether or not anyone subscribes)."""
        if self.pulls:
            return [self.result, *self.pull_nodes()]
        return [self.result] if subscribed else []

    @property
    def report_columns(self) -> list[str]:
        """Result columns in :find order."""
        return [col for _, col in self.find]

    def tuples(self, role: str) -> int:
        """Rows held in this query's private traces of ``role`` ('intermediate' or 'result')."""
        return sum(t.tuples for t, r in self.pc.traces if r == role)

    def private_traces(self):
        """(trace, role) pairs private to this query."""
        return list(self.pc.traces)

    def handles(self):
        """Every trace handle the query holds (those of the shared rules it reads not included)."""
        return list(self.pc.handles)

    def shared_rules(self) -> list[SharedRule]:
        """The shared rules the query reads (see :mod:`factflow.planner.shared`)."""
        return list(self.pc.shared)

    def explain(self) -> str:
        """A readable description of the plan."""
        lines = [
            f"query {self.name}",
            f"  strategy: {self.strategy} (requested {self.requested_strategy})",
            f"  semantics: {self.semantics}",
            f"  find ({self.find_kind}): {' '.join(str(v) for v, _ in self.find)}",
            "  conjunctions:",
        ]
        for conjunction, strategy, reason in self.pc.strategies:
            lines.append(f"    {conjunction}: {strategy + ' (' + reason + ')' if strategy else reason}")
        lines.append("  plan:")
        seen: set[int] = set()

        def render(node: Node, depth: int) -> None:
            pad = "    " + "  " * depth
            if id(node) in seen:
                lines.append(f"{pad}(shared) {node.describe()}")
                return
            seen.add(id(node))
            cols = ", ".join(f"{n}:{k.value}" for n, k in node.columns)
            lines.append(f"{pad}{node.describe()}  [{cols}]")
            lines.extend(f"{pad}  | {line}" for line in node.details())
            for child in node.inputs():
                render(child, depth + 1)

        render(self.result, 0)
        for pull in self.pulls:
            lines.append(f"  pull {pull.element} (entities from {pull.column}):")
            for path in pull.paths.values():
                lines.append(f"    stage {path.label}")
                render(path.node, 1)
        return "\n".join(lines)

    def close(self) -> None:
        """Release every handle and private trace (shared rules are released by the engine
        when their last reader closes)."""
        self.pc.release()


def _bind_inputs(query: Query, inputs: Sequence[Any], scope: Scope, pc: PlanContext) -> list[Static]:
    bindings = query.binding_inputs
    if len(inputs) != len(bindings):
        raise QueryError(f"the query's :in expects {len(bindings)} input(s) after $, but {len(inputs)} were given")
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
    cardinality-one attribute by its entity.
    """
    clauses = query.where
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


def synthesize(query: Query, inputs: Sequence[Any], pc: PlanContext, join: str) -> Dataflow:
    """Build the dataflow of ``query`` as of ``pc.epoch`` with join strategy ``join``."""
    pc.strategy = requested_strategy(join)
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
        return _aggregation(query, pc, scope, projected, find_vars, aggregates, strategy, join)
    trace = pc.private_trace("result", projected.columns, tuple(columns), "result")
    needs_distinct = pc.semantics == "set" and not _unique_derivations(query, pc, output)
    result: Stateful = (Distinct(projected, trace, pc.name, role="result") if needs_distinct
                        else Arranged(projected, trace, pc.name))
    result.role = "result"
    find = [(e if isinstance(e, Pull) else FindVar(e.var), scope.col(e.var)) for e in query.find.elements]
    stages = [plan_pull(p, root, result, scope, pc) for p in pulls]
    return Dataflow(pc, result, find, strategy, join, query.find.kind, pulls=stages)


def _aggregation(query: Query, pc: PlanContext, scope: Scope, projected: Node, find_vars: list[Var],
                 aggregates: list[Aggregate], strategy: str, join: str) -> Dataflow:
    """Group the set of find (and :with) tuples by the plain find variables and aggregate."""
    tuples = pc.distinct(projected, "aggregate input")
    group = [scope.col(v) for v in find_vars]
    specs = []
    for a in aggregates:
        col = scope.col(a.var)
        specs.append(aggregate_spec(a.fn, a.params, col, projected.kind_of(col), pc.column(a.fn), show(a)))
    trace = pc.private_trace("result", tuple((g, projected.kind_of(g)) for g in group)
                             + tuple((s.column, s.kind) for s in specs), tuple(group), "result")
    result = Reduce(tuples, group, specs, trace, pc.name)
    by_agg = dict(zip(aggregates, specs))
    find = [(e, scope.col(e.var)) if isinstance(e, FindVar) else (e, by_agg[e].column)
            for e in query.find.elements]
    decoders = {s.column: s.decode for s in specs if s.decode is not None}
    return Dataflow(pc, result, find, strategy, join, query.find.kind, decoders)
