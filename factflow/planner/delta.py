"""Planning a conjunction as delta pipelines (``delta``) or worst-case optimal stages (``wco``).

The conjunction's clauses become *bindings* (data patterns, rule calls, inputs, literal
collections, unions), *negated bindings* (a ``not`` that binds its variables on its own)
and *constraints* (predicates, function bindings, ``not`` of predicates only). Bindings
are numbered in clause order (inputs first); the number decides which version each
pipeline reads (see :mod:`factflow.dataflow.delta`).

For each binding that can change, a pipeline is planned from it. Constraints, and
bindings whose every variable is bound (conflicts on the source binding, such as
``[?a :k ?b] [?b :k ?a]``, or a constant pattern), are applied as soon as the prefix
binds their variables. Then:

* ``delta`` extends the prefix by the binding sharing the most bound variables (ties:
  fewer new variables, then clause order), a lookup into its index keyed by the bound
  side (the forward index for a bound entity, the reverse index for a bound value);
* ``wco`` follows thesis 13.3: the next variable is one that some binding of two or more
  variables can propose from the bound prefix; among those, the variable with the most
  extenders (ties: first in the query). Every binding whose only unbound variable it is
  becomes an extender: attributes count from their shared count indexes, other bindings
  (rule relations, unary patterns, inputs) by a keyed lookup. Bindings of several unbound
  variables are joined as in ``delta`` when no single variable can be extended.

Negation whose variables need the rest of the conjunction (``not-join`` reading outer
bindings) is applied after the join on a privately arranged result (``explain`` says
so). Whether a conjunction is planned here at all is decided by
:func:`factflow.planner.strategy.choose` (an ``or`` reading outer bindings or a seeded
goal-directed call keeps it ``binary``, for example).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from factflow.dataflow.delta import (
    Apply, CountIndex, DeltaJoin, Exclude, Extend, Extender, Lookup, Pipeline, Shape, selective,
)
from factflow.dataflow.nodes import Filter, Node, Project, Scan, Static
from factflow.errors import QueryError
from factflow.lang.ast import Clause, FnCall, Not, Pattern, Predicate, show, term_vars
from factflow.model.types import Kind
from factflow.planner.conjunction import Scope, _Conjunction, plan_conjunction
from factflow.planner.context import PlanContext
from factflow.planner.strategy import Strategy

__all__ = ["plan_delta"]


@dataclass
class _Binding:
    """One binding (or negated binding) of the conjunction.

    For a data pattern, ``scan`` is its first Scan and ``faces`` holds the binding read
    through each index it is looked up in (with the pattern's own predicates applied)."""

    position: int
    node: Node
    label: str
    negated: bool = False
    pattern: Pattern | None = None
    scan: Scan | None = None
    filters: list[Predicate] = field(default_factory=list)
    faces: dict[str, Node] = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        return self.node.names


class _DeltaConjunction(_Conjunction):
    """Plans one conjunction as a :class:`DeltaJoin` with strategy ``delta`` or ``wco``."""

    def __init__(self, clauses: Sequence[Clause], sources: Sequence[Node], scope: Scope, pc: PlanContext,
                 stack: tuple[str, ...], strategy: Strategy, label: str):
        super().__init__(clauses, sources, scope, pc, stack)
        self.strategy = strategy
        self.label = label
        self.bindings: list[_Binding] = []
        self.constraints: list[Clause] = []
        self.deferred: list[Not] = []

    # ------------------------------------------------------------ bindings
    def plan(self) -> Node:
        """The :class:`DeltaJoin` of this conjunction (negation reading outer bindings applied after it)."""
        for node in self.sources:
            self.add_binding(_Binding(len(self.bindings), node, node.describe()), node)
        for clause in self.relations:
            self.add_relation(clause)
        for clause in self.pending:
            if isinstance(clause, Not):
                self.add_negation(clause)
            else:
                self.constraints.append(clause)
        self.pending = []
        node = self.join(self.strategy)
        for clause in self.deferred:
            node = self.negate(node, clause)
        return node

    def add_binding(self, binding: _Binding, item) -> None:
        for other in self.bindings:
            on = [c for c in other.columns if c in binding.columns]
            self.check_join_kinds(other.node, binding.node, on, item)
        self.bindings.append(binding)

    def add_relation(self, clause: Clause) -> None:
        position = len(self.bindings)
        if not isinstance(clause, Pattern):
            self.add_binding(_Binding(position, self.relation(clause, None), show(clause)), clause)
            return
        scan = self.pattern(clause, set())
        binding = _Binding(position, scan, show(clause), pattern=clause, scan=scan)
        binding.filters = [c for c in self.pending if isinstance(c, Predicate)
                           and {self.scope.col(v) for v in term_vars(c.args)} <= set(scan.names)]
        for c in binding.filters:
            self.pending.remove(c)
        binding.node = binding.faces[scan.face] = self.filtered(binding, scan)
        self.add_binding(binding, clause)

    def add_negation(self, clause: Not) -> None:
        join_vars = self.not_vars(clause)
        if not join_vars:
            raise QueryError(f"{show(clause)} shares no variable with the rest of the query")
        if all(isinstance(c, Predicate) for c in clause.clauses):
            self.constraints.append(clause)
        elif self.standalone([clause.clauses], join_vars):
            cols = [self.scope.col(v) for v in join_vars]
            body = plan_conjunction(clause.clauses, [], self.inner_scope(join_vars), self.pc, self.stack,
                                    label=f"{self.label}: {show(clause)}")
            negated = self.pc.distinct(Project(body, cols), f"negated {show(clause)}")
            self.add_binding(_Binding(len(self.bindings), negated, show(clause), negated=True), clause)
        else:
            self.pc.note_strategy(self.label, "", f"{show(clause)} reads outer bindings: applied after the join, "
                                                  "on a privately arranged result")
            self.deferred.append(clause)

    def filtered(self, binding: _Binding, node: Node) -> Node:
        for c in binding.filters:
            node = self.filter(node, c)
        return node

    def face(self, binding: _Binding, bound: Sequence[str]) -> Node:
        """The binding read through the index keyed by its bound side (forward for a bound
        entity, reverse for a bound value)."""
        scan = binding.scan
        if scan is None:
            return binding.node
        if scan.e_col is not None and scan.e_col in bound:
            face = "forward"
        elif scan.v_col is not None and scan.v_col in bound:
            face = "reverse"
        else:
            return binding.node
        if face not in binding.faces:
            key = scan.e_col if face == "forward" else scan.v_col
            binding.faces[face] = self.filtered(binding, self.pattern(binding.pattern, {key}))
        return binding.faces[face]

    def extender(self, binding: _Binding, column: str, counted: bool) -> Extender:
        """``binding`` as an extender of ``column``; with ``counted``, attributes count from
        their shared count index (built on first use), other bindings by a keyed lookup."""
        key = [c for c in binding.columns if c != column]
        node = self.face(binding, key)
        count = None
        base = binding.scan
        if (counted and base is not None and not binding.filters and base.e_const is None and base.v_const is None
                and base.e_col is not None and base.v_col is not None and base.e_col != base.v_col):
            source, face = ("e", "count_e") if key == [base.e_col] else ("v", "count_v")
            attribute = self.pc.attribute(binding.pattern.a, binding.label)
            if attribute.keeps(face):  # index="forward" keeps no count_v: counted by a lookup instead
                count = CountIndex(self.pc.handle(attribute, face), source, key[0])
        return Extender(node, binding.position, key, count, binding.label)

    # ------------------------------------------------------------ pipelines
    def join(self, strategy: Strategy) -> DeltaJoin:
        columns: dict[str, Kind] = {}
        for b in self.bindings:
            if b.negated:
                continue
            for name, kind in b.node.columns:
                columns.setdefault(name, kind)
        pipelines = []
        for source in self.bindings:
            pipeline, bound = self.pipeline(strategy, source, columns)
            pipelines.append(pipeline)
            for name, kind in bound.items():
                columns.setdefault(name, kind)
        positive = [p for p in pipelines if not p.negated]
        # the whole join (installs) is read from the query's inputs or a constant-bound
        # pattern when there is one: every stage after it then looks up few keys
        reader = next((p for p in positive if selective(p.source)), positive[0])
        return DeltaJoin(tuple(columns.items()), [p for p in pipelines if _can_change(p.source)], reader, strategy)

    def pipeline(self, strategy: Strategy, source: _Binding, kinds: dict[str, Kind]) -> tuple[Pipeline, dict[str, Kind]]:
        """The pipeline from ``source`` and the columns it binds, in the order it binds them."""
        bound: dict[str, Kind] = dict(source.node.columns)
        pipeline = Pipeline(source.node, source.position, source.negated, source.label)
        left = [b for b in self.bindings if b is not source and not b.negated]
        negs = [b for b in self.bindings if b is not source and b.negated]
        constraints = list(self.constraints)

        def settle() -> None:
            progress = True
            while progress:
                progress = False
                for c in list(constraints):
                    if not all(self.scope.col(v) in bound for v in self.inputs_of(c)):
                        continue
                    op = self.constraint(Shape(tuple(bound.items())), c)
                    pipeline.stages.append(Apply(op))
                    constraints.remove(c)
                    for name, kind in op.columns:
                        bound.setdefault(name, kind)
                    progress = True
                for b in [b for b in left if set(b.columns) <= bound.keys()]:
                    pipeline.stages.append(Lookup(self.face(b, b.columns), b.position, list(b.columns), b.label))
                    left.remove(b)
                    progress = True
                for b in [b for b in negs if set(b.columns) <= bound.keys()]:
                    pipeline.stages.append(Exclude(b.node, b.position, list(b.columns), b.label))
                    negs.remove(b)
                    progress = True

        settle()
        while left:
            if strategy == Strategy.WCO and self.extend_wco(pipeline, left, bound, kinds):
                settle()
                continue
            best = max(left, key=lambda b: (len(set(b.columns) & bound.keys()) > 0, len(set(b.columns) & bound.keys()),
                                            isinstance(b.node, Static), -len(set(b.columns) - bound.keys()),
                                            -b.position))
            on = [c for c in best.columns if c in bound]
            pipeline.stages.append(Lookup(self.face(best, on), best.position, on, best.label))
            left.remove(best)
            for name, kind in best.node.columns:
                bound.setdefault(name, kind)
            settle()
        if negs:
            raise QueryError(f"{negs[0].label} uses variables that no clause binds")
        if constraints:
            self.fail_unbound(constraints[0], set(bound))
        pipeline.order = [str(self.scope.var_of(c) or c) for c in bound]
        return pipeline, bound

    def extend_wco(self, pipeline: Pipeline, left: list[_Binding], bound: dict[str, Kind],
                   kinds: dict[str, Kind]) -> bool:
        """Add one Hector stage if some variable can be extended from the prefix."""
        candidates: dict[str, list[_Binding]] = {}
        for b in left:
            unbound = [c for c in b.columns if c not in bound]
            if len(unbound) == 1:
                candidates.setdefault(unbound[0], []).append(b)
        suitable = {x: bs for x, bs in candidates.items() if any(len(b.columns) > 1 for b in bs)} or candidates
        if not suitable:
            return False
        order = list(kinds)
        column = max(suitable, key=lambda x: (len(suitable[x]), -order.index(x) if x in order else 0))
        extenders = [self.extender(b, column, len(suitable[column]) > 1) for b in suitable[column]]
        pipeline.stages.append(Extend(column, extenders))
        for b in suitable[column]:
            left.remove(b)
        bound[column] = kinds[column]
        return True

    # ------------------------------------------------------------ constraints
    def constraint(self, shape: Shape, clause: Clause) -> Node:
        """A Filter or Bind over ``shape`` for a predicate, function or predicate-only not."""
        if isinstance(clause, Predicate):
            return self.filter(shape, clause)
        if isinstance(clause, FnCall):
            return self.bind(shape, clause)
        conditions = [self.filter(shape, c).condition for c in clause.clauses]
        return Filter(shape, f"NOT ({' AND '.join(f'({c})' for c in conditions)})", show(clause))


def _can_change(node: Node) -> bool:
    """Whether a binding can change after install (inputs and literal collections cannot)."""
    return not isinstance(node, Static)


def plan_delta(clauses: Sequence[Clause], sources: Sequence[Node], scope: Scope, pc: PlanContext,
               stack: tuple[str, ...], strategy: Strategy, label: str) -> Node:
    """Operators computing every binding of ``clauses`` with ``strategy`` (``delta`` or ``wco``)."""
    return _DeltaConjunction(clauses, sources, scope, pc, stack, strategy, label).plan()
