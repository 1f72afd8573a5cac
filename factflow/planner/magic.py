"""Goal-directed evaluation of recursive rules: the magic-sets rewriting (demand transformation).

A call such as ``(reach 1 ?x)``, or ``(reach ?s ?x)`` with ``?s`` bound by the clauses
before it, needs only the facts of ``reach`` relevant to those bindings. Following
Bancilhon, Maier, Sagiv and Ullman's *magic sets* (as in the 3DF/Shared Arrangements
"top-down" queries), the call's recursive component is rewritten, for this call only,
into

- *adorned* rules ``reach[bf]`` (``b``: the argument is bound when the rule is used,
  ``f``: free), one per (rule, adornment) the call can reach, each body guarded by
- *magic* rules ``magic-reach[bf]`` holding the bindings the adorned rule is asked for:
  for every call of a component rule inside an adorned body, the demand it receives is
  the magic guard of the body joined with the clauses evaluated before the call;
- one *seed* rule: ``magic-reach[bf]`` contains the call's bound arguments, taken from
  its constants and from the distinct projection of the bound columns of the clauses
  before the call (a relation of the query that changes with the data).

A body that calls its own adorned rule with the head's bound arguments unchanged (the
recursive step of a linear closure) drops its magic guard: every tuple of the adorned
rule already has its bound arguments in the magic set (each body either is guarded or
inherits them from such a call), so the guard would filter nothing and only cost every
iteration a join (and a Spark broadcast job). The guard still heads the prefix from which
the body's other calls get their demand.

Sideways information passing follows :func:`~factflow.planner.sips.sips_order` (body
order, but a relation clause sharing a variable with what is bound goes first). This keeps the demand
narrow (``reach(?a, 5)`` through ``edge(?a ?c), reach(?c ?b)`` passes ``?b`` to the
recursive call instead of every edge) and lets the planner, which joins in clause
order, start every body from its small magic guard. The adorned and magic rules are
planned together as one :class:`~factflow.dataflow.recursion.Fixpoint`, whose
delete-and-rederive iterations then maintain them under changes of the data and of
the seed alike (a retracted seed overdeletes its demand and what it derived).

The demand follows the shape of the rules, as in every magic-sets rewriting: a
left-linear ``tc(a,b) :- tc(a,c), edge(c,b)`` called as ``tc(x,?)`` asks only for
``x``, but a right-linear one asks for the closure of every node reachable from ``x``
(all of it relevant, but quadratic on dense graphs); to a bound target it is the reverse.
A rule of exactly that transitive-closure shape is therefore turned around first when
its written form does not suit the call (:mod:`factflow.planner.linear`).
Same generation asks for every ancestor of its argument. Each goal-directed call has its
own rewritten rules and state (the seed is the call's); the registered non-recursive
rules their bodies call are shared with other queries like any rule called without
bound arguments (:mod:`factflow.planner.shared`).

The rewriting is skipped (the call is evaluated bottom-up in full) when no argument is
bound, when a recursive call inside the component would receive no bound argument, when
a component rule is called inside ``or``, and inside a recursive component itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from factflow.dataflow.nodes import Bind, Node, Project
from factflow.dataflow.zset import ident, literal
from factflow.errors import QueryError
from factflow.lang.ast import BindScalar, Clause, Const, FnCall, Rule, RuleCall, Var, term_vars
from factflow.lang.rules import bound_vars, check_stratified, rule_calls
from factflow.model.types import Kind, kind_of_python_value
from factflow.planner.linear import turned_around
from factflow.planner.recursion import component_of, infer_kinds, plan_component
from factflow.planner.relations import static_relation
from factflow.planner.sips import close, is_relation, needs, sips_order

if TYPE_CHECKING:  # pragma: no cover
    from factflow.planner.conjunction import Scope
    from factflow.planner.context import PlanContext

__all__ = ["adornment", "rewrite", "goal_relation"]


def adornment(args: Sequence, bound: set[Var]) -> str:
    """``b``/``f`` per argument: bound if a constant or a variable in ``bound``."""
    return "".join("b" if isinstance(t, Const) or (isinstance(t, Var) and t in bound) else "f" for t in args)


class _Names:
    """Names of the rewritten rules of one goal-directed call (``#n`` keeps calls apart), and
    for each the registered rule and adornment it stands for."""

    def __init__(self, tag: int):
        self.tag = tag
        self.origin: dict[str, tuple[str, str, bool]] = {}  # name -> (rule, adornment, is magic)

    def adorned(self, rule: str, a: str) -> str:
        name = f"{rule}[{a}]#{self.tag}"
        self.origin[name] = (rule, a, False)
        return name

    def magic(self, rule: str, a: str) -> str:
        name = f"magic-{rule}[{a}]#{self.tag}"
        self.origin[name] = (rule, a, True)
        return name

    def kinds(self, name: str, kinds: dict[str, list[Kind]]) -> list[Kind]:
        """The argument kinds of a rewritten rule, given those of the registered rules."""
        rule, a, magic = self.origin[name]
        return [k for k, x in zip(kinds[rule], a) if x == "b"] if magic else kinds[rule]

    def seed(self, rule: str, a: str) -> str:
        return f"seed-{rule}[{a}]#{self.tag}"


def rewrite(name: str, a: str, component: Sequence[str], pc: "PlanContext", names: _Names) \
        -> dict[str, tuple[Rule, ...]] | None:
    """The adorned and magic rules for calling ``name`` with adornment ``a`` (None if the
    call is not worth rewriting, see the module docs). The seed rule is not included."""
    members = set(component)
    rules: dict[str, list[Rule]] = {}
    todo, seen = [(name, a)], {(name, a)}
    while todo:
        rule, a = todo.pop()
        adorned = names.adorned(rule, a)
        rules.setdefault(adorned, [])
        for body in pc.bodies(rule):
            nested = rule_calls([c for c in body.body if not isinstance(c, RuleCall)])
            if any(c.name in members for c in nested):
                return None  # a component rule called inside or / not
            head = body.head
            guard = RuleCall(names.magic(rule, a), tuple(v for v, x in zip(head, a) if x == "b"))
            filters = [c for c in body.body if not is_relation(c)]
            bound = close({v for v, x in zip(head, a) if x == "b"}, filters)
            prefix: list[Clause] = [guard]
            implied = False  # the guard holds for every binding of a call of this very adorned rule
            for clause in sips_order(body.body, bound):
                if isinstance(clause, RuleCall) and clause.name in members:
                    b = adornment(clause.args, bound)
                    if "b" not in b:
                        return None
                    implied = implied or (clause.name == rule and b == a and guard.args == tuple(
                        t for t, x in zip(clause.args, b) if x == "b"))
                    if (clause.name, b) not in seen:
                        seen.add((clause.name, b))
                        todo.append((clause.name, b))
                    demand = _magic_rule(names.magic(clause.name, b), clause, b, prefix, filters, bound)
                    if demand is not None:
                        rules.setdefault(demand.name, []).append(demand)
                    clause = RuleCall(names.adorned(clause.name, b), clause.args, clause.form)
                prefix.append(clause)
                bound = close(bound | bound_vars([clause]), filters)
            clauses = prefix[1:] if implied else prefix
            rules[adorned].append(Rule(adorned, (), head, tuple(clauses + filters), body.form))
    return {n: tuple(bodies) for n, bodies in rules.items()}


def _magic_rule(name: str, call: RuleCall, b: str, prefix: list[Clause], filters: list[Clause],
                bound: set[Var]) -> Rule | None:
    """``name(bound arguments of call) :- prefix, the filters it can evaluate`` (None if trivial)."""
    head: list[Var] = []
    grounds: list[Clause] = []
    for i, (term, x) in enumerate(zip(call.args, b)):
        if x != "b":
            continue
        if isinstance(term, Const):
            var = Var(f"?magic-arg-{i + 1}")
            grounds.append(FnCall("ground", (term,), BindScalar(var)))
            term = var
        head.append(term)
    guard = prefix[0]
    if len(prefix) == 1 and not grounds and isinstance(guard, RuleCall) and guard.name == name \
            and tuple(head) == guard.args:
        return None  # magic(X) :- magic(X)
    ready = [c for c in filters if needs(c) <= bound]
    return Rule(name, (), tuple(head), tuple(prefix + grounds + ready), call.form)


def goal_relation(clause: RuleCall, left: Node | None, scope: "Scope", pc: "PlanContext",
                  stack: tuple[str, ...], where: str) -> tuple[Node, list[Kind]] | None:
    """The relation of a goal-directed call of a recursive rule, or None to evaluate it in full.

    ``left`` is what the conjunction has joined before the call: the bound variables are
    those it carries, and it supplies the seed of their values.
    """
    from factflow.planner.conjunction import rule_relation

    if pc.transient:
        return None
    component = component_of(clause.name, pc, where)
    if not component:
        return None
    bound_cols = set(left.names) if left is not None else set()
    a = adornment(clause.args, {v for v in term_vars(clause.args) if scope.col(v) in bound_cols})
    if "b" not in a:
        return None
    check_stratified(component, pc.bodies)
    pc.goal_calls += 1
    turned = turned_around(clause.name, a, component, pc, f"{clause.name}-turned")
    if turned is not None:
        pc.add_rules({turned[0].name: turned})
        clause = RuleCall(turned[0].name, clause.args, clause.form)
        component = [clause.name]
    names = _Names(pc.goal_calls)
    rules = rewrite(clause.name, a, component, pc, names)
    if rules is None:
        return None
    kinds = infer_kinds(list(component), pc, lambda n: rule_relation(n, pc, stack, where)[1], where)
    seed_name, magic = names.seed(clause.name, a), names.magic(clause.name, a)
    positions = [i for i, x in enumerate(a) if x == "b"]
    seed_kinds = [kinds[clause.name][i] for i in positions]
    seed, shown = _seed(clause, positions, seed_kinds, left, scope, pc, where)
    pc.add_relation(seed_name, seed, seed_kinds)
    seed_vars = tuple(Var(f"?seed-{i + 1}") for i in positions)
    rules[magic] = rules.get(magic, ()) + (Rule(magic, (), seed_vars, (RuleCall(seed_name, seed_vars),)),)
    pc.add_rules(rules)
    all_kinds = {rule: names.kinds(rule, kinds) for rule in rules}
    goal = f"{where} as {names.adorned(clause.name, a)}, seeded with {shown}"
    return plan_component(names.adorned(clause.name, a), sorted(rules), pc, stack, where, all_kinds, goal)


def _seed(clause: RuleCall, positions: list[int], kinds: list[Kind], left: Node | None, scope: "Scope",
          pc: "PlanContext", where: str) -> tuple[Node, str]:
    """The call's bound argument values: a relation over fresh columns, and how to show it."""
    variables = [t for t in term_vars(clause.args[i] for i in positions)]
    if variables:
        base: Node = Project(left, [scope.col(v) for v in variables])
    else:
        base = static_relation(pc, [], [()], {}, {}, f"{where} constants")
    columns, shown = [], []
    for i, kind in zip(positions, kinds):
        term = clause.args[i]
        column = pc.column(f"seed_{i + 1}")
        if isinstance(term, Var):
            found = left.kind_of(scope.col(term))
            if found != kind:
                raise QueryError(f"{where}: {term} is a {found.value} but rule {clause.name} takes a "
                                 f"{kind.value} as argument {i + 1}")
            value = ident(scope.col(term))
        else:
            ckind = kind_of_python_value(term.value)
            if ckind is None or not (ckind == kind or (ckind.numeric and kind.numeric)):
                raise QueryError(f"{where}: {term} does not match the rule's {kind.value} argument")
            value = literal(term.value, kind)
        base = Bind(base, column, kind, value, f"seed argument {i + 1} of {where}")
        columns.append(column)
        shown.append(str(term))
    seed: Node = Project(base, columns)
    if variables:
        seed = pc.distinct(seed, f"seed of {where}")
        return seed, f"the distinct bindings of {', '.join(shown)} before the call"
    return seed, f"({' '.join(shown)})"
