"""Sideways information passing: the order in which a body's clauses use bound variables.

Given the variables bound before a body is evaluated (a goal's bound arguments, or the
marked heads a rederivation starts from), the relation clauses are taken in body order,
except that one sharing a variable with what is bound so far goes before one that does
not (the first such clause; if none, the first remaining clause). The planner joins in
clause order, so this order keeps every join connected to the bindings it starts from.
Filters, negations and functions are applied by the planner as soon as they are ready,
wherever they stand.
"""

from __future__ import annotations

from typing import Sequence

from factflow.lang.ast import Clause, FnCall, Not, Or, Pattern, RuleCall, Var, binding_vars, clause_vars, term_vars
from factflow.lang.rules import bound_vars

__all__ = ["is_relation", "needs", "close", "sips_order"]


def is_relation(clause: Clause) -> bool:
    """Whether the planner joins ``clause`` as a relation (rather than applying it as a filter)."""
    return isinstance(clause, (Pattern, RuleCall, Or)) or (isinstance(clause, FnCall) and clause.fn == "ground")


def needs(clause: Clause) -> set[Var]:
    """The variables a filter, negation or function reads."""
    if isinstance(clause, Not):
        return set(clause.join_vars) if clause.join_vars is not None else set(clause_vars(clause))
    return set(term_vars(clause.args))


def close(bound: set[Var], filters: Sequence[Clause]) -> set[Var]:
    """``bound`` plus the outputs of the functions among ``filters`` that become computable."""
    bound = set(bound)
    changed = True
    while changed:
        changed = False
        for c in filters:
            if isinstance(c, FnCall) and needs(c) <= bound and not set(binding_vars(c.binding)) <= bound:
                bound |= set(binding_vars(c.binding))
                changed = True
    return bound


def sips_order(body: Sequence[Clause], bound: set[Var]) -> list[Clause]:
    """The relation clauses of ``body`` in evaluation order from ``bound`` (see the module docs)."""
    remaining = [c for c in body if is_relation(c)]
    filters = [c for c in body if not is_relation(c)]
    order: list[Clause] = []
    bound = close(bound, filters)
    while remaining:
        pick = next((c for c in remaining if set(clause_vars(c)) & bound), remaining[0])
        remaining.remove(pick)
        order.append(pick)
        bound = close(bound | bound_vars([pick]), filters)
    return order
