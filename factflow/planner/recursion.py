"""Planning a recursive component of rules into a :class:`Fixpoint`.

A rule is recursive when it can reach itself through rule calls; the rules that reach
each other form a component, evaluated together. Negation through a component's own
rules is not stratifiable and rejected with the cycle named (as ``register`` does when
the rules are known then, see :mod:`factflow.lang.rules`). The types of the rules'
arguments are inferred from the data patterns and the other rules they call before the
bodies are planned, since a body reads the component's relations before they exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from factflow.dataflow.recursion import Fixpoint, Placeholder, RecursiveBody
from factflow.errors import RuleError
from factflow.lang.ast import RuleCall, Var, show
from factflow.lang.rules import calls, check_stratified, recursive_component
from factflow.model.types import Kind
from factflow.planner.sips import is_relation, sips_order

if TYPE_CHECKING:  # pragma: no cover
    from factflow.planner.context import PlanContext

__all__ = ["component_of", "infer_kinds", "plan_component"]


def component_of(name: str, pc: "PlanContext", where: str) -> list[str]:
    """The rules mutually recursive with ``name`` (empty if ``name`` is not recursive); a
    RuleError for a rule on the way that is not registered."""
    return recursive_component(name, lambda n: {c.name for body in pc.bodies(n, where) for c, _ in calls(body.body)})


def infer_kinds(component: list[str], pc: "PlanContext", rule_kinds: Callable[[str], list[Kind]],
                where: str) -> dict[str, list[Kind]]:
    """The argument kinds of every rule of ``component``, from its data patterns and the kinds
    (``rule_kinds``) of the rules outside it that it calls."""
    from factflow.planner.conjunction import pattern_kinds
    arity = {r: len(pc.bodies(r)[0].head) for r in component}
    kinds: dict[str, list[Kind | None]] = {r: [None] * arity[r] for r in component}
    changed = True
    while changed:
        changed = False
        for rule in component:
            for body in pc.bodies(rule):
                known: dict[Var, Kind] = dict(pattern_kinds(body.body, pc))
                for c in body.body:
                    if isinstance(c, RuleCall):
                        callee = kinds[c.name] if c.name in kinds else rule_kinds(c.name)
                        for term, k in zip(c.args, callee):
                            if isinstance(term, Var) and k is not None:
                                known.setdefault(term, k)
                for i, v in enumerate(body.head):
                    if kinds[rule][i] is None and v in known:
                        kinds[rule][i] = known[v]
                        changed = True
    for rule, ks in kinds.items():
        for i, k in enumerate(ks):
            if k is None:
                raise RuleError(f"cannot infer the type of argument {i + 1} of recursive rule {rule} ({where})")
    return kinds  # type: ignore[return-value]


def plan_component(name: str, component: list[str], pc: "PlanContext", stack: tuple[str, ...], where: str,
                   kinds: dict[str, list[Kind]] | None = None, goal: str | None = None):
    """Plan ``component`` as one fixpoint; registers each rule's relation in ``pc.rule_relations``.

    ``kinds`` gives the rules' argument kinds when the caller knows them (else they are
    inferred); ``goal`` describes the goal-directed call the rules were rewritten for."""
    from factflow.planner.conjunction import Scope, plan_conjunction, rule_relation

    check_stratified(component, pc.bodies)
    if kinds is None:
        kinds = infer_kinds(component, pc, lambda n: rule_relation(n, pc, stack, where)[1], where)
    columns = {r: tuple((pc.column(f"{r}_{i}"), k) for i, k in enumerate(kinds[r])) for r in component}
    refs = {r: Placeholder(columns[r], r) for r in component}
    for r in component:
        pc.rule_relations[r] = (refs[r], kinds[r])
    bodies: list[RecursiveBody] = []
    saved, pc.transient = pc.transient, True
    try:
        for rule in component:
            for body in pc.bodies(rule):
                scope = Scope(pc)
                plan = plan_conjunction(body.body, [], scope, pc, stack + (rule,))
                for v in body.head:
                    if scope.col(v) not in plan.names:
                        raise RuleError(f"rule {rule}: head variable {v} is not bound by {show(body)}")
                head = [scope.col(v) for v in body.head]
                if [plan.kind_of(c) for c in head] != kinds[rule]:
                    raise RuleError(f"rule {rule}: its bodies bind arguments of different types ({show(body)})")
                guarded_scope = Scope(pc)
                distinct_vars = list(dict.fromkeys(body.head))
                guard_cols = tuple((guarded_scope.col(v), kinds[rule][body.head.index(v)]) for v in distinct_vars)
                guard = Placeholder(guard_cols, f"guard of {rule}")
                ordered = sips_order(body.body, set(body.head)) + [c for c in body.body if not is_relation(c)]
                guarded = plan_conjunction(ordered, [guard], guarded_scope, pc, stack + (rule,))
                guard_from = [(columns[rule][body.head.index(v)][0], guarded_scope.col(v)) for v in distinct_vars]
                guarded_head = [guarded_scope.col(v) for v in body.head]
                bodies.append(RecursiveBody(rule, plan, guarded, guard, head, guarded_head, guard_from))
    finally:
        pc.transient = saved
    slots = {r: pc.private_trace(f"rule {r}", columns[r], tuple(n for n, _ in columns[r]), "intermediate")
             for r in component}
    fixpoint = Fixpoint(columns, refs, bodies, slots, goal)
    for r in component:
        pc.rule_relations[r] = (fixpoint.outputs[r], kinds[r])
    return pc.rule_relations[name]
