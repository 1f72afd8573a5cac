"""Turning a linear recursive rule around to suit the argument a call binds.

A transitive closure can be written left-linear, ``r(x,y) :- r(x,z), s(z,y)``, or
right-linear, ``r(x,y) :- s(x,z), r(z,y)``, with the base case ``r(x,y) :- s(x,y)``;
both define ``s+``. Magic sets keep the demand of a call at its bound argument only for
one of them: a bound source (``bf``) suits the left-linear form, a bound target (``fb``)
the right-linear one; the other form asks for the closure of every node reachable from
(or reaching) the argument. So a goal-directed call of such a rule in the unsuited form
is evaluated over the other form, as a rule private to the call.

Only the exact shape is recognized: one rule with one base body and one recursive body
whose non-recursive part, renamed, *is* the base body (data patterns, predicates,
function bindings and calls of other rules). Anything else keeps its written form.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from factflow.lang.ast import Clause, FnCall, Pattern, Predicate, Rule, RuleCall, Term, Var, binding_vars, clause_vars

if TYPE_CHECKING:  # pragma: no cover
    from factflow.planner.context import PlanContext

__all__ = ["turned_around"]


def _rename_term(term: Term, mapping: dict[Var, Var]) -> Term:
    return mapping.get(term, term) if isinstance(term, Var) else term


def _rename(clause: Clause, mapping: dict[Var, Var]) -> Clause | None:
    """``clause`` with variables renamed (simultaneously), or None for clauses not handled."""
    if isinstance(clause, Pattern):
        return replace(clause, e=_rename_term(clause.e, mapping), v=_rename_term(clause.v, mapping))
    if isinstance(clause, (Predicate, RuleCall)):
        return replace(clause, args=tuple(_rename_term(t, mapping) for t in clause.args))
    if isinstance(clause, FnCall) and not set(binding_vars(clause.binding)) & set(mapping):
        return replace(clause, args=tuple(_rename_term(t, mapping) for t in clause.args))
    return None


def _renamed(clauses: Sequence[Clause], mapping: dict[Var, Var]) -> list[Clause] | None:
    out = [_rename(c, mapping) for c in clauses]
    return None if any(c is None for c in out) else out  # type: ignore[return-value]


def turned_around(name: str, a: str, component: Sequence[str], pc: "PlanContext",
                  alias: str) -> tuple[Rule, ...] | None:
    """The bodies of ``name`` in the other linear form, named ``alias``, when the call's
    adornment ``a`` suits that form and not the written one; otherwise None."""
    if list(component) != [name] or a not in ("bf", "fb"):
        return None
    bodies = pc.bodies(name)
    if len(bodies) != 2:
        return None

    def recursive(body: Rule) -> bool:
        return any(isinstance(c, RuleCall) and c.name == name for c in body.body)

    base, rec = sorted(bodies, key=recursive)
    if recursive(base) or not recursive(rec) or base.required or rec.required:
        return None
    (bx, by), (x, y) = base.head, rec.head
    calls = [c for c in rec.body if isinstance(c, RuleCall) and c.name == name]
    if len(calls) != 1 or len(set(rec.head)) != 2 or len(set(base.head)) != 2:
        return None
    step = [c for c in rec.body if c is not calls[0]]
    first, second = calls[0].args
    if not isinstance(first, Var) or not isinstance(second, Var):
        return None
    if first == x and second not in (x, y):  # left-linear: r(x,y) :- r(x,z), s(z,y)
        if a != "fb":
            return None
        z, outer = second, x
        as_base = {z: bx, y: by}
    elif second == y and first not in (x, y):  # right-linear: r(x,y) :- s(x,z), r(z,y)
        if a != "bf":
            return None
        z, outer = first, y
        as_base = {x: bx, z: by}
    else:
        return None
    mentioned = {v for c in step for v in clause_vars(c)}
    if outer in mentioned or bx in mentioned - set(as_base) or by in mentioned - set(as_base):
        return None
    renamed = _renamed(step, as_base)
    if renamed is None or set(renamed) != set(base.body) or len(renamed) != len(base.body):
        return None
    if first == x:  # to right-linear: r(x,y) :- s(x,z), r(z,y)
        new_step = _renamed(step, {z: x, y: z})
        call = RuleCall(alias, (z, y), calls[0].form)
        new_body = tuple(new_step) + (call,)  # type: ignore[operator]
    else:  # to left-linear: r(x,y) :- r(x,z), s(z,y)
        new_step = _renamed(step, {x: z, z: y})
        call = RuleCall(alias, (x, z), calls[0].form)
        new_body = (call,) + tuple(new_step)  # type: ignore[operator]
    return (replace(base, name=alias), Rule(alias, (), (x, y), new_body, rec.form))
