"""The rule store: ``register`` only stores rules; queries synthesize what they depend on.

Rules are checked for shape and safety when registered (every head variable must be
bound by the body, unless the head lists it as required ``[?x]``), and so is every call
between rules known by then (registered before or in the same registration): it must give
the callee as many arguments as it takes, and no rule may negate a rule that depends on it
(negation through recursion is not stratifiable). A call of a rule not registered yet is
allowed (a rule may refer to rules registered later): it is checked when its callee is
registered, and the planner checks every call again when a query needs it.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping, Sequence

from factflow import edn
from factflow.errors import RuleError
from factflow.lang.ast import (
    FnCall, Or, Pattern, Predicate, Rule, RuleCall, Var, binding_vars, clause_vars, nested, show, term_vars,
)
from factflow.lang.parser import parse_rules
from factflow.text import plural

__all__ = ["RuleStore", "bound_vars", "calls", "check_arity", "check_stratified", "recursive_component", "rule_calls"]


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


def calls(clauses) -> Iterator[tuple[RuleCall, bool]]:
    """Every rule invocation in ``clauses``, including those nested in not / or, with
    whether a not encloses it."""
    return ((c, negated) for c, negated in nested(clauses) if isinstance(c, RuleCall))


def rule_calls(clauses) -> list[RuleCall]:
    """Every rule invocation in ``clauses``, including those nested in not / or."""
    return [c for c, _ in calls(clauses)]


def check_arity(call: RuleCall, arity: int, where: str) -> None:
    """Reject ``call`` (RuleError) unless it gives its rule the ``arity`` arguments it takes."""
    if len(call.args) != arity:
        raise RuleError(f"{where}: rule {call.name} takes {plural(arity, 'argument')}, got {len(call.args)}")


def recursive_component(name: str, callees: Callable[[str], Iterable[str]]) -> list[str]:
    """The rules mutually recursive with ``name``, sorted (empty if ``name`` does not reach
    itself), following ``callees`` (the names a rule calls)."""
    def reach(n: str) -> set[str]:
        seen, stack = set(), [n]
        while stack:
            for m in callees(stack.pop()):
                if m not in seen:
                    seen.add(m)
                    stack.append(m)
        return seen

    reached = reach(name)
    if name not in reached:
        return []
    return sorted(m for m in reached if name in reach(m))


def check_stratified(component: Sequence[str], bodies: Callable[[str], Sequence[Rule]]) -> None:
    """Reject a recursive component whose rules negate one another (RuleError naming the
    cycle); ``bodies`` gives a rule's bodies."""
    members = set(component)
    for rule in component:
        for body in bodies(rule):
            for call, negated in calls(body.body):
                if negated and call.name in members:
                    raise RuleError(f"rules {' -> '.join(component)} are not stratifiable: {rule} negates {call.name}, "
                                    f"which depends on {rule} ({show(body)})")


class RuleStore:
    """Registered rules by name; each name maps to its bodies (a disjunction)."""

    def __init__(self) -> None:
        self._rules: dict[str, tuple[Rule, ...]] = {}
        self.texts: list[str] = []  # every registration that added rules, in order (EDN text)

    def register(self, text_or_form, log: Callable[[str], None] | None = None) -> list[str]:
        """Parse, check and store rules; returns the names defined. All or nothing.

        Besides each rule's own shape and safety, the calls between known rules are checked
        (see the module docs): a RuleError names the rule, the call and the arity, or the
        cycle through a negation. When the rules add something, ``log`` is called with their
        EDN text once every check passed and before they are stored (if it raises, nothing
        is stored); registering known rules again changes nothing."""
        return self._add(text_or_form, log, check_calls=True)

    def restore(self, text: str) -> list[str]:
        """Store rules a state directory logged as registered (see
        :mod:`factflow.engine.durability`), with the checks of each rule on its own but not
        those of the calls between rules: an older factflow registered without them, and its
        state directory must still open (a query calling such rules is still refused by the
        planner)."""
        return self._add(text, None, check_calls=False)

    def _add(self, text_or_form, log: Callable[[str], None] | None, check_calls: bool) -> list[str]:
        rules = parse_rules(text_or_form)
        if not rules:
            raise RuleError("no rules given")
        grouped: dict[str, list[Rule]] = {}
        for r in rules:
            grouped.setdefault(r.name, []).append(r)
        for name, bodies in grouped.items():
            arity = {len(b.head) for b in bodies}
            if len(arity) != 1:
                raise RuleError(f"rule {name} is defined with different numbers of arguments "
                                f"({' and '.join(str(n) for n in sorted(arity))})")
            for body in bodies:
                _check_safety(body)
            existing = self._rules.get(name)
            if existing is not None and existing != tuple(bodies):
                raise RuleError(f"rule {name} is already registered with a different definition")
        if all(self._rules.get(name) == tuple(bodies) for name, bodies in grouped.items()):
            return list(grouped)
        if check_calls:
            _check_calls({name for name in grouped if name not in self._rules},
                         {**self._rules, **{name: tuple(bodies) for name, bodies in grouped.items()}})
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


def _check_calls(new: set[str], known: Mapping[str, tuple[Rule, ...]]) -> None:
    """Reject calls between ``known`` rules that can never run, where the caller or the
    callee is one of the ``new`` rules: a wrong number of arguments, or a negation through
    recursion. Calls of rules not known yet are left for when they are registered."""
    for caller, bodies in known.items():
        for body in bodies:
            for call, _ in calls(body.body):
                callee = known.get(call.name)
                if callee is not None and (caller in new or call.name in new):
                    check_arity(call, len(callee[0].head), f"rule {caller}, {show(call)}")

    def callees(name: str) -> set[str]:
        return {call.name for body in known[name] for call, _ in calls(body.body) if call.name in known}

    checked: set[str] = set()
    for name in sorted(new):
        if name not in checked:
            component = recursive_component(name, callees)
            check_stratified(component, known.__getitem__)
            checked.update(component)


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
