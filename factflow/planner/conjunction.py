"""Planning one conjunction of clauses (a query's ``:where`` or a rule body) into operators.

The clauses of a conjunction are of three sorts: *relations* that bind variables
(data patterns, rule calls, literal collections, query inputs), *filters* (predicates)
and *binders* (function expressions). Filters and binders are applied as soon as the
variables they read are bound, on a single relation before it is joined when possible.

Each conjunction is summarized (:meth:`_Conjunction.summary`) and planned with the
strategy :func:`factflow.planner.strategy.choose` picks for it. This module implements
the join-at-a-time (``binary``) strategy: relations are joined in clause order (inputs
first, as Datomic binds them before ``:where``); every intermediate result that is
joined again is arranged privately on the next join key. ``delta`` and ``wco`` are
planned by :mod:`factflow.planner.delta`.
"""

from __future__ import annotations

from typing import Sequence

from factflow.dataflow import expressions as X
from factflow.dataflow.aggregate import Reduce, aggregate_spec, reduce_columns
from factflow.dataflow.zset import ident, literal
from factflow.dataflow.nodes import (
    AntiJoin, Arranged, Bind, Filter, Join, Node, Project, Rename, Scan, Stateful, Static, Union,
)
from factflow.errors import QueryError
from factflow.lang.ast import (
    BindScalar, Blank, Clause, Const, FnCall, Not, Or, Pattern, Predicate, Rule, RuleCall, Var, binding_vars,
    clause_vars, show, term_vars,
)
from factflow.lang.rules import bound_vars, check_arity
from factflow.model.types import Kind, coerce_value, kind_of_python_value
from factflow.planner.context import PlanContext
from factflow.planner.magic import goal_relation
from factflow.planner.recursion import component_of, plan_component
from factflow.planner.relations import binding_rows, static_relation
from factflow.planner.strategy import ConjunctionSummary, Strategy, choose

__all__ = ["Scope", "plan_conjunction", "pattern_kinds"]


class Scope:
    """The variables of one conjunction and the columns that carry them."""

    def __init__(self, pc: PlanContext):
        self.pc = pc
        self._columns: dict[Var, str] = {}

    def col(self, var: Var) -> str:
        """The column of ``var`` (allocated on first use)."""
        if var not in self._columns:
            self._columns[var] = self.pc.column(var.name)
        return self._columns[var]

    def share(self, var: Var, column: str) -> None:
        """Let ``var`` use an existing column (a nested clause group joining its parent)."""
        self._columns[var] = column

    def var_of(self, column: str) -> Var | None:
        """The variable a column carries, if any."""
        for v, c in self._columns.items():
            if c == column:
                return v
        return None

    @property
    def columns(self) -> dict[Var, str]:
        """Variables allocated so far, with their columns."""
        return dict(self._columns)


def pattern_kinds(clauses: Sequence[Clause], pc: PlanContext) -> dict[Var, Kind]:
    """Kinds that data patterns give variables; conflicting uses are errors naming both clauses."""
    kinds: dict[Var, tuple[Kind, Clause]] = {}

    def note(var, kind, clause):
        if not isinstance(var, Var):
            return
        if var in kinds and kinds[var][0] != kind:
            other_kind, other = kinds[var]
            raise QueryError(
                f"{var} is a {other_kind.value} in {show(other)} but a {kind.value} in {show(clause)}"
            )
        kinds.setdefault(var, (kind, clause))

    for c in clauses:
        if isinstance(c, Pattern):
            attribute = pc.attribute(c.a, show(c))
            note(c.e, Kind.LONG, c)
            note(c.v, attribute.kind, c)
    return {v: k for v, (k, _) in kinds.items()}


class _Conjunction:
    """Builds the operator chain of one conjunction."""

    def __init__(self, clauses: Sequence[Clause], sources: Sequence[Node], scope: Scope,
                 pc: PlanContext, stack: tuple[str, ...]):
        self.scope = scope
        self.pc = pc
        self.stack = stack
        self.expected = pattern_kinds(clauses, pc)
        self.sources = list(sources)
        self.relations: list[Clause] = []
        self.pending: list[Clause] = []
        for c in clauses:
            if isinstance(c, (Predicate, Not)):
                self.pending.append(c)
            elif isinstance(c, FnCall) and X.canonical_name(c.fn) != "ground":
                self.pending.append(c)
            else:
                self.relations.append(c)

    # ------------------------------------------------------------ strategy
    def summary(self) -> ConjunctionSummary:
        """What the strategy decision needs to know about this conjunction (see
        :mod:`factflow.planner.strategy`); edges name variables, so no column is allocated."""
        seeded_or = next((c for c in self.relations
                          if isinstance(c, Or) and not self.standalone(c.branches, self.or_vars(c))), None)
        seeded_goal = self.seeded_goal()
        edges = [frozenset(str(self.scope.var_of(c) or c) for c in s.names) for s in self.sources]
        edges += [frozenset(str(v) for v in self.relation_vars(c)) for c in self.relations]
        patterns = [(c, self.pc.attribute(c.a, show(c))) for c in self.relations if isinstance(c, Pattern)]
        single_valued = [c for c, attribute in patterns if attribute.semantics == "one"]
        return ConjunctionSummary(
            requested=self.pc.strategy,
            edges=tuple(edges),
            cardinality_one=len(single_valued) == len(self.relations),
            support=tuple((str(attribute.name), attribute.support) for _, attribute in patterns),
            determines=tuple((str(c.e), str(c.v)) for c in single_valued
                             if isinstance(c.e, Var) and isinstance(c.v, Var) and c.e != c.v),
            recursive=self.pc.transient,
            seeded_or=show(seeded_or) if seeded_or is not None else None,
            seeded_goal=show(seeded_goal) if seeded_goal is not None else None,
            negations=sum(isinstance(c, Not) for c in self.pending),
            sources=len(self.sources),
        )

    def relation_vars(self, clause: Clause) -> list[Var]:
        """The variables a binding clause (pattern, rule call, or, literal collection) binds."""
        if isinstance(clause, Or):
            return self.or_vars(clause)
        if isinstance(clause, RuleCall):
            return term_vars(clause.args)
        if isinstance(clause, Pattern):
            return [v for v in (clause.e, clause.v) if isinstance(v, Var)]
        return binding_vars(clause.binding)

    def seeded_goal(self) -> RuleCall | None:
        """A call of a recursive rule with a variable argument bound by an earlier clause:
        its goal-directed evaluation is seeded by the join-at-a-time prefix before it."""
        bound = {v for s in self.sources for v in map(self.scope.var_of, s.names) if v is not None}
        for c in self.relations:
            if isinstance(c, RuleCall) and bound & set(term_vars(c.args)) and component_of(c.name, self.pc, show(c)):
                return c
            bound |= bound_vars([c])
        return None

    # ------------------------------------------------------------ chain
    def plan(self) -> Node:
        """The join-at-a-time (``binary``) plan of this conjunction."""
        left: Node | None = None
        left_is_shared = True
        items: list[Node | Clause] = [*self.sources, *self.relations]
        for item in items:
            if isinstance(item, Or) and not self.standalone(item.branches, self.or_vars(item)):
                left = self.apply_ready(self.seeded_or(item, left, left_is_shared))
                left_is_shared = False
                continue
            node = item if isinstance(item, Node) else self.relation(item, left)
            node = self.apply_ready(node)
            if left is None:
                left, left_is_shared = node, True
                continue
            on = [n for n in left.names if n in node.names]
            self.check_join_kinds(left, node, on, item)
            if not left_is_shared:
                left = self.arrange(left, on)
            left = self.apply_ready(Join(left, node))
            left_is_shared = False
        if left is None:
            if self.pending:
                self.fail_unbound(self.pending[0], set())
            raise QueryError("the query has no clause that binds a variable")
        if self.pending:
            self.fail_unbound(self.pending[0], set(left.names))
        return left

    def arrange(self, node: Node, on: Sequence[str]) -> Node:
        """``node`` arranged privately by ``on`` (it is read again as a whole by a join).

        Inside a recursive component nothing is arranged: its bodies are re-evaluated per
        iteration, so intermediate state would go stale."""
        if self.pc.transient:
            return node
        key = tuple(on) if on else tuple(node.names)
        slot = self.pc.private_trace(f"join state by {', '.join(key)}", node.columns, key, "intermediate")
        return Arranged(node, slot)

    def check_join_kinds(self, left: Node, right: Node, on: list[str], item) -> None:
        for col in on:
            a, b = left.kind_of(col), right.kind_of(col)
            if a != b:
                var = self.scope.var_of(col)
                raise QueryError(f"{var} is a {a.value} but {_describe(item)} uses it as a {b.value}")

    def inputs_of(self, clause: Clause) -> list[Var]:
        """The variables a pending clause (predicate, function binding or not) needs bound."""
        return self.not_vars(clause) if isinstance(clause, Not) else term_vars(clause.args)

    def fail_unbound(self, clause: Clause, bound_cols: set[str]) -> None:
        for v in self.inputs_of(clause):
            if self.scope.col(v) not in bound_cols:
                raise QueryError(f"{show(clause)} uses {v}, which no clause binds")
        raise QueryError(f"{show(clause)} cannot be evaluated")

    # ------------------------------------------------------------ filters and binders
    def apply_ready(self, node: Node) -> Node:
        progress = True
        while progress:
            progress = False
            for clause in list(self.pending):
                names = set(node.names)
                if not all(self.scope.col(v) in names for v in self.inputs_of(clause)):
                    continue
                self.pending.remove(clause)
                if isinstance(clause, Predicate):
                    node = self.filter(node, clause)
                elif isinstance(clause, Not):
                    node = self.negate(node, clause)
                else:
                    node = self.bind(node, clause)
                progress = True
        return node

    def argument(self, node: Node, term, clause) -> tuple:
        if isinstance(term, Var):
            col = self.scope.col(term)
            return ident(col), node.kind_of(col)
        if isinstance(term, Blank):
            raise QueryError(f"'_' cannot be a function or predicate argument in {show(clause)}")
        kind = kind_of_python_value(term.value)
        if kind is None:
            raise QueryError(f"unsupported constant {term} in {show(clause)}")
        return literal(term.value, kind), kind

    def filter(self, node: Node, clause: Predicate) -> Node:
        args = [self.argument(node, t, clause) for t in clause.args]
        X.check_predicate(clause.fn, [k for _, k in args], show(clause))
        return Filter(node, X.predicate_sql(clause.fn, [c for c, _ in args]), show(clause))

    def bind(self, node: Node, clause: FnCall) -> Node:
        if not isinstance(clause.binding, BindScalar):
            raise QueryError(f"{show(clause)}: {clause.fn} returns one value; bind it to a variable like ?x")
        args = [self.argument(node, t, clause) for t in clause.args]
        kinds = [k for _, k in args]
        kind = X.function_kind(clause.fn, kinds, show(clause))
        target = self.scope.col(clause.binding.var)
        if target in node.names and node.kind_of(target) != kind:
            raise QueryError(f"{show(clause)} yields a {kind.value} but {clause.binding.var} is a {node.kind_of(target).value}")
        value = X.function_sql(clause.fn, [c for c, _ in args], kinds)
        return Bind(node, target, kind, value, show(clause))

    # ------------------------------------------------------------ negation and disjunction
    @staticmethod
    def not_vars(clause: Not) -> list[Var]:
        """The variables a not clause joins on (all its variables, or the not-join list)."""
        return list(clause.join_vars) if clause.join_vars is not None else clause_vars(clause)

    def or_vars(self, clause: Or) -> list[Var]:
        """The variables an or clause joins on; every branch of an ``or`` must use the same ones."""
        if clause.join_vars is not None:
            return list(clause.join_vars)
        per_branch = [set(v for c in b for v in clause_vars(c)) for b in clause.branches]
        for branch, used in zip(clause.branches[1:], per_branch[1:]):
            if used != per_branch[0]:
                missing = sorted(str(v) for v in per_branch[0] ^ used)
                raise QueryError(f"{show(clause)}: all branches of or must use the same variables "
                                 f"(differ in {', '.join(missing)}); use or-join to name the shared ones")
        return clause_vars(clause)

    def standalone(self, branches, join_vars: Sequence[Var]) -> bool:
        """Whether each clause group binds ``join_vars`` and everything its filters read on its own."""
        for clauses in branches:
            bound = bound_vars(clauses)
            if not set(join_vars) <= bound:
                return False
            for c in clauses:
                if isinstance(c, (Predicate, FnCall)) and not set(term_vars(c.args)) <= bound:
                    return False
                if isinstance(c, Not) and not set(self.not_vars(c)) <= bound:
                    return False
        return True

    def inner_scope(self, join_vars: Sequence[Var]) -> Scope:
        """A scope for a nested clause group: ``join_vars`` share the outer columns, the rest is local."""
        inner = Scope(self.pc)
        for v in join_vars:
            inner.share(v, self.scope.col(v))
        return inner

    def negate(self, node: Node, clause: Not) -> Node:
        join_vars = self.not_vars(clause)
        if not join_vars:
            raise QueryError(f"{show(clause)} shares no variable with the rest of the query")
        cols = [self.scope.col(v) for v in join_vars]
        inner = self.inner_scope(join_vars)
        if self.standalone([clause.clauses], join_vars):
            body = plan_conjunction(clause.clauses, [], inner, self.pc, self.stack, label=show(clause))
        elif self.pc.transient:
            raise QueryError(f"{show(clause)} inside a recursive rule must bind its variables itself "
                             "(negation that reads the rule's other bindings is not supported there)")
        else:  # the negated clauses need the outer bindings: evaluate them on those
            seed = self.pc.distinct(Project(node, cols), f"bindings of {show(clause)}")
            body = plan_conjunction(clause.clauses, [seed], inner, self.pc, self.stack, label=show(clause))
        negated = self.pc.distinct(Project(body, cols), f"negated {show(clause)}")
        if not isinstance(node, (Scan, Static, Stateful)):
            node = self.arrange(node, cols)
        return AntiJoin(node, negated, show(clause))

    def union_of(self, clause: Or, sources: Sequence[Node], keep: Sequence[str]) -> Node:
        join_vars = self.or_vars(clause)
        cols = list(keep) + [self.scope.col(v) for v in join_vars if self.scope.col(v) not in keep]
        parts = []
        for branch in clause.branches:
            inner = self.inner_scope(join_vars)
            for s in sources:
                for c in s.names:
                    var = self.scope.var_of(c)
                    if var is not None:
                        inner.share(var, c)
            body = plan_conjunction(branch, sources, inner, self.pc, self.stack,
                                    label=f"{show(clause)} branch {' '.join(show(c) for c in branch)}")
            missing = [c for c in cols if c not in body.names]
            if missing:
                var = self.scope.var_of(missing[0])
                raise QueryError(f"{show(clause)}: branch {' '.join(show(c) for c in branch)} does not bind {var}")
            parts.append(Project(body, cols))
        kinds = [p.columns for p in parts]
        if any(k != kinds[0] for k in kinds):
            raise QueryError(f"{show(clause)}: its branches bind variables of different types")
        return parts[0] if len(parts) == 1 else Union(parts)

    def seeded_or(self, clause: Or, left: Node | None, left_is_shared: bool) -> Node:
        if left is None:
            raise QueryError(f"{show(clause)} needs variables bound by earlier clauses, but none precede it")
        if not left_is_shared:
            left = self.arrange(left, left.names)
        return self.union_of(clause, [left], left.names)

    # ------------------------------------------------------------ relations
    def relation(self, clause: Clause, left: Node | None) -> Node:
        if isinstance(clause, Pattern):
            return self.pattern(clause, set(left.names) if left is not None else set())
        if isinstance(clause, RuleCall):
            return self.rule_call(clause, left)
        if isinstance(clause, Or):
            return self.union_of(clause, [], [])
        return self.ground(clause)

    def pattern(self, clause: Pattern, bound: set[str]) -> Scan:
        where = show(clause)
        attribute = self.pc.attribute(clause.a, where)
        e_col = self.scope.col(clause.e) if isinstance(clause.e, Var) else None
        v_col = self.scope.col(clause.v) if isinstance(clause.v, Var) else None
        e_const = clause.e.value if isinstance(clause.e, Const) else None
        v_const = None
        if isinstance(clause.v, Const):
            ok, v_const = coerce_value(clause.v.value, attribute.value_type)
            if not ok:
                raise QueryError(f"{where}: {clause.v} is not a valid {attribute.value_type} value of {attribute.name}")
        if e_col is not None and e_col in bound:
            face = "forward"
        elif v_col is not None and v_col in bound or v_const is not None and e_const is None:
            # lookups by value: an index="forward" attribute has no reverse index, so they
            # read (and join with) its forward index instead, correct but not keyed
            face = "reverse" if attribute.keeps("reverse") else "forward"
        else:
            face = "forward"
        return Scan(self.pc.handle(attribute, face), attribute.kind, e_col, e_const, v_col, v_const, where)

    def ground(self, clause: FnCall) -> Node:
        where = show(clause)
        if len(clause.args) != 1 or not isinstance(clause.args[0], Const):
            raise QueryError(f"{where}: ground takes one constant (a value or a literal collection)")
        elements, rows = binding_rows(clause.binding, clause.args[0].value, where)
        for e in elements:
            if isinstance(e, Var):
                self.scope.col(e)
        return static_relation(self.pc, elements, rows, self.expected, self.scope.columns, where)

    def rule_call(self, clause: RuleCall, left: Node | None) -> Node:
        """A rule's relation with the call's constants and repeated variables applied; a recursive
        rule called with bound arguments is evaluated goal-directed (see :mod:`factflow.planner.magic`)."""
        where = show(clause)
        check_arity(clause, self.pc.arity(clause.name, where), where)
        goal = goal_relation(clause, left, self.scope, self.pc, self.stack, where)
        relation, kinds = goal or rule_relation(clause.name, self.pc, self.stack, where)
        node: Node = relation
        mapping: dict[str, str] = {}
        first: dict[Var, str] = {}
        for (col, kind), term in zip(relation.columns, clause.args):
            if isinstance(term, Var):
                if term in first:
                    node = Filter(node, f"{ident(first[term])} = {ident(col)}", f"{where}: repeated {term}")
                    continue
                first[term] = col
                mapping[col] = self.scope.col(term)
            elif isinstance(term, Const):
                ckind = kind_of_python_value(term.value)
                if ckind is None or not (ckind == kind or (ckind.numeric and kind.numeric)):
                    raise QueryError(f"{where}: {term} does not match the rule's {kind.value} argument")
                node = Filter(node, f"{ident(col)} = {literal(term.value, ckind)}", f"{where}: {term}")
        return Rename(node, mapping)


def _describe(item) -> str:
    return show(item) if not isinstance(item, Node) else item.describe()


def rule_relation(name: str, pc: PlanContext, stack: tuple[str, ...], where: str) -> tuple[Node, list[Kind]]:
    """The (set) relation a rule defines, over positional columns: planned once per query,
    and for registered rules once for every query with the same join strategy (see
    :mod:`factflow.planner.shared`)."""
    if name in pc.rule_relations:
        return pc.rule_relations[name]
    component = component_of(name, pc, where)
    return pc.shared_rule(name, component or [name], lambda: _plan_rule(name, component, pc, stack, where))


def _plan_rule(name: str, component: list[str], pc: PlanContext, stack: tuple[str, ...],
               where: str) -> tuple[Node, list[Kind]]:
    bodies = pc.bodies(name, where)
    if any(body.aggregates for body in bodies):
        if component:
            raise QueryError(f"rule {name}: an aggregate rule cannot be recursive (it calls itself through "
                             f"{', '.join(component)})")
        return _plan_aggregate_rule(name, bodies, pc, stack)
    if component:
        return plan_component(name, component, pc, stack, where)
    columns = [pc.column(f"{name}_{i}") for i in range(len(bodies[0].head))]
    parts: list[Node] = []
    kinds: list[Kind] | None = None
    for body in bodies:
        scope = Scope(pc)
        node = plan_conjunction(body.body, [], scope, pc, stack + (name,), label=f"rule {show(body)}")
        for v in body.head:
            if scope.col(v) not in node.names:
                raise QueryError(f"rule {name}: head variable {v} is not bound by {show(body)}")
        part = Rename(node, {scope.col(v): c for v, c in zip(body.head, columns)})
        body_kinds = [k for _, k in part.columns]
        if kinds is not None and body_kinds != kinds:
            raise QueryError(f"rule {name}: its bodies bind arguments of different types")
        kinds = body_kinds
        parts.append(part)
    union = parts[0] if len(parts) == 1 else Union(parts)
    relation = pc.distinct(union, f"rule {name}")
    pc.rule_relations[name] = (relation, kinds)
    return relation, kinds


def _plan_aggregate_rule(name: str, bodies: Sequence[Rule], pc: PlanContext,
                         stack: tuple[str, ...]) -> tuple[Node, list[Kind]]:
    """The relation of an aggregate rule: its body's distinct bindings (every variable of
    the body, as SQL aggregates rows, not Datomic's ``:find`` the set of find tuples),
    grouped by the head's plain variables, each aggregate computed per group (a Reduce,
    which changes only the groups a change touches; its hidden accumulators projected
    away). The head lists the aggregates after the plain variables (the parser makes
    sure), the order of Reduce's columns."""
    if len(bodies) != 1:
        raise QueryError(f"rule {name}: an aggregate rule has one body, it has {len(bodies)}")
    body = bodies[0]
    scope = Scope(pc)
    node = plan_conjunction(body.body, [], scope, pc, stack + (name,), label=f"rule {show(body)}")
    for v in body.head:
        if scope.col(v) not in node.names:
            raise QueryError(f"rule {name}: head variable {v} is not bound by {show(body)}")
    columns = [pc.column(f"{name}_{i}") for i in range(len(body.head))]
    aggregates = dict(body.aggregates)
    named = {scope.col(v): columns[i] for i, v in enumerate(body.head) if i not in aggregates}
    bindings = Rename(node, {c: named.get(c, c) for c in node.names})  # plain head variables as the rule's columns
    specs = []
    for i, aggregate in body.aggregates:
        source = scope.col(aggregate.var)
        spec = aggregate_spec(aggregate.fn, aggregate.params, source, node.kind_of(source), columns[i], show(aggregate))
        if spec.decode is not None:
            raise QueryError(f"rule {name}: {aggregate} yields a collection, which a rule cannot hold "
                             "(use it in :find)")
        specs.append(spec)
    group = list(named.values())
    tuples = pc.distinct(bindings, f"rule {name} aggregate input")
    slot = pc.private_trace(f"rule {name}", reduce_columns(tuples, group, specs), tuple(group), "intermediate")
    reduced = Reduce(tuples, group, specs, slot)
    relation = reduced if reduced.names == reduced.visible else Project(reduced, reduced.visible)
    kinds = [k for _, k in relation.columns]
    pc.rule_relations[name] = (relation, kinds)
    return relation, kinds


def plan_conjunction(clauses: Sequence[Clause], sources: Sequence[Node], scope: Scope,
                     pc: PlanContext, stack: tuple[str, ...] = (), label: str = "query") -> Node:
    """Operators computing every binding of ``clauses`` (joined with ``sources``), joined
    with the strategy :func:`factflow.planner.strategy.choose` picks for them."""
    conjunction = _Conjunction(clauses, sources, scope, pc, stack)
    summary = conjunction.summary()
    strategy, reason = choose(summary)
    if not summary.recursive:  # a recursive body is shown by its fixpoint
        pc.note_strategy(label, strategy, reason)
    if strategy == Strategy.BINARY:
        return conjunction.plan()
    from factflow.planner.delta import plan_delta
    return plan_delta(clauses, sources, scope, pc, stack, strategy, label)
