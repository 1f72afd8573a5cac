"""The rule store: ``register`` only stores rules; queries synthesize what they depend on.

Rules are checked for shape and safety when registered (every head variable must be
bound by the body, unless the head lists it as required ``[?x]``) but their names are
resolved only when a query needs them, so a rule may refer to rules registered later.
"""

from __future__ import annotations

from typing import Callable

from factflow import edn
from factflow.errors import RuleError
from factflow.lang.ast import (
    FnCall, Not, Or, Pattern, Predicate, Rule, RuleCall, Var, binding_vars, clause_vars, show, term_vars,
)
from factflow.lang.parser import parse_rules

__all__ = ["RuleStore", "bound_vars", "rule_calls"]


def bound_vars(clauses) -> set[Var]:
    """Variables that ``clauses`` can bind on their own (patterns, rule calls, fn outputs, or)."""
    bound: set[Var] = set()
    for c in clauses:
        if isinstance(c, (Pattern, RuleCall)):
            bound |= set(clause_vars(c))
        elif isinstance(c, FnCall):
            bound |= set(binding_vars(c.binding))
        elif isinstance(c, Or):
            per_branch = [bound_vars(b) for b in c.branches]
            common = set.intersection(*per_branch) if per_branch else set()
            if c.join_vars is not None:
                common &= set(c.join_vars)
            bound |= common
    return bound


def rule_calls(clauses) -> list[RuleCall]:
    """Every rule invocation in ``clauses``, including those nested in not / or."""
    out: list[RuleCall] = []
    for c in clauses:
        if isinstance(c, RuleCall):
            out.append(c)
        elif isinstance(c, Not):
            out += rule_calls(c.clauses)
        elif isinstance(c, Or):
            for b in c.branches:
                out += rule_calls(b)
    return out


class RuleStore:
    """Registered rules by name; each name maps to its bodies (a disjunction)."""

    def __init__(self) -> None:
        self._rules: dict[str, tuple[Rule, ...]] = {}
        self.texts: list[str] = []  # every registration that added rules, in order (EDN text)

    def register(self, text_or_form, log: Callable[[str], None] | None = None) -> list[str]:
        """Parse, check and store rules; returns the names defined. All or nothing.

        When the rules add something, ``log`` is called with their EDN text before they are
        stored (if it raises, nothing is stored); registering known rules again changes nothing."""
        rules = parse_rules(text_or_form)
        if not rules:
            raise RuleError("no rules given")
        grouped: dict[str, list[Rule]] = {}
        for r in rules:
            grouped.setdefault(r.name, []).append(r)
        for name, bodies in grouped.items():
            arity = {len(b.head) for b in bodies}
            if len(arity) != 1:
                raise RuleError(f"rule {name} is defined with different numbers of arguments")
            for body in bodies:
                _check_safety(body)
            existing = self._rules.get(name)
            if existing is not None and existing != tuple(bodies):
                raise RuleError(f"rule {name} is already registered with a different definition")
        if all(self._rules.get(name) == tuple(bodies) for name, bodies in grouped.items()):
            return list(grouped)
        text = text_or_form if isinstance(text_or_form, str) else edn.write(text_or_form)
        if log is not None:
            log(text)
        for name, bodies in grouped.items():
            self._rules[name] = tuple(bodies)
        self.texts.append(text)
        return list(grouped)

    def bodies(self, name: str, where: str = "") -> tuple[Rule, ...]:
        """The bodies of rule ``name`` (RuleError naming it if unknown)."""
        try:
            return self._rules[name]
        except KeyError:
            raise RuleError(f"unknown rule {name}{' in ' + where if where else ''}; register it first") from None

    def __contains__(self, name: str) -> bool:
        return name in self._rules

    def names(self) -> list[str]:
        """Registered rule names."""
        return sorted(self._rules)


def _check_safety(rule: Rule) -> None:
    bound = bound_vars(rule.body) | set(rule.required)
    for v in rule.free:
        if v not in bound:
            raise RuleError(f"rule {rule.name}: head variable {v} is not bound by the body {show(rule)}")
    for c in rule.body:
        if isinstance(c, Predicate):
            missing = [v for v in term_vars(c.args) if v not in bound]
            if missing:
                raise RuleError(f"rule {rule.name}: {show(c)} uses {missing[0]}, which nothing in the rule binds")
