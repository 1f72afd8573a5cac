"""State shared while one query is planned: schema, rules, shared rules, and the slots it gives out.

Planning is pure: it reads the schema, the rule store and the registry of shared rules
and allocates nothing (no SparkSession is needed). Where an operator will hold a handle,
a private trace or a constant relation, it gets a slot (:mod:`factflow.dataflow.slots`)
that installing allocates (:mod:`factflow.engine.allocation`).
"""

from __future__ import annotations

import re
from typing import Callable

from factflow.dataflow.nodes import Distinct, Node
from factflow.dataflow.slots import QUERY, HandleSlot, TraceSlot
from factflow.edn import Keyword
from factflow.errors import QueryError, UnknownAttributeError
from factflow.lang.ast import Rule
from factflow.lang.rules import RuleStore
from factflow.model.schema import Attribute, Schema
from factflow.model.types import Kind
from factflow.planner.shared import SharedRule, SharedRules
from factflow.planner.strategy import Strategy

__all__ = ["PlanContext"]


class PlanContext:
    """Everything the planner needs about the engine, and what the plan will hold.

    Slots name their owner: the query (:data:`~factflow.dataflow.slots.QUERY`), or, while
    a shared rule is planned (:meth:`shared_rule`), that rule. Column names and trace
    labels are numbered per owner, so that a shared rule is planned the same whichever
    query plans it first, and a query's plan is the same whether the shared rules it reads
    exist yet or not.
    """

    def __init__(self, schema: Schema, rules: RuleStore, semantics: str, strategy: Strategy = Strategy.BINARY,
                 shared_rules: SharedRules | None = None):
        self.schema = schema
        self.rules = rules
        self.semantics = semantics
        self.strategy = strategy  # the requested join strategy (see planner.strategy)
        self.strategies: list[tuple[str, str, str]] = []  # (conjunction, strategy, reason) as planned
        self.notes: list[tuple[str, str, str]] = []  # those of the query's own conjunctions
        self.rule_relations: dict[str, tuple] = {}
        self.local_rules: dict[str, tuple[Rule, ...]] = {}  # rules rewritten for this query (magic sets)
        self.goal_calls = 0  # goal-directed calls planned so far (numbers their rewritten rules)
        self.transient = False  # planning the bodies of a recursive component
        self.shared_rules = shared_rules  # None: every rule is planned privately (read only here)
        self.shared: list[SharedRule] = []  # shared rules the query reads (planned now or installed)
        self.attributes: set[Keyword] = set()  # attributes its operators (and those of its shared rules) read
        self._owner: SharedRule | None = None  # the shared rule being planned
        self._columns: dict[str, int] = {}  # per owner, columns given out
        self._labels: dict[str, set[str]] = {}  # per owner, trace labels given out

    @property
    def owner(self) -> str:
        """Who owns what is planned now: the shared rule being planned, else the query."""
        return self._owner.name if self._owner is not None else QUERY

    def shared_rule(self, name: str, members: list[str], plan: Callable[[], tuple[Node, list[Kind]]]
                    ) -> tuple[Node, list[Kind]]:
        """The relation of registered rule ``name`` (``members``: its recursive component, or
        itself), planned by ``plan`` unless a shared rule with this strategy is installed already."""
        if self.shared_rules is None or name in self.local_rules:
            return plan()
        entry = self.shared_rules.get(name, self.strategy)
        if entry is None:
            entry = SharedRule(members, self.strategy)
            saved_owner, saved_transient = self._owner, self.transient
            self._owner, self.transient = entry, False
            try:
                plan()
            finally:
                self._owner, self.transient = saved_owner, saved_transient
            entry.relations = {m: self.rule_relations[m] for m in members}
        else:
            self.strategies += [(c, s, f"{r}; shared rule" if s else r) for c, s, r in entry.notes]
            self.rule_relations.update(entry.relations)
        self._use(entry)
        return self.rule_relations[name]

    def _use(self, entry: SharedRule) -> None:
        """Record that what is planned now reads ``entry`` (and the shared rules it reads)."""
        if self._owner is not None and entry not in self._owner.uses:
            self._owner.uses.append(entry)
            self._owner.attributes |= entry.attributes
        pending = [entry]
        while pending:
            e = pending.pop()
            if e not in self.shared:
                self.shared.append(e)
                self.attributes |= e.attributes
                pending += e.uses

    def note_strategy(self, conjunction: str, strategy: str, reason: str) -> None:
        """Record how a conjunction is joined (an empty strategy notes a remark on it)."""
        self.strategies.append((conjunction, strategy, reason))
        (self._owner.notes if self._owner is not None else self.notes).append((conjunction, strategy, reason))

    def strategy_of(self, conjunction: str) -> str:
        """The strategy first noted for ``conjunction`` (the query's ``:where`` is ``query``)."""
        return next(s for c, s, _ in self.strategies if c == conjunction and s)

    def attribute(self, name: Keyword, where: str) -> Attribute:
        """Look up an attribute used by a clause (a QueryError naming it if it was never created)."""
        try:
            return self.schema.get(name, context=f"{where}: ")
        except UnknownAttributeError as exc:
            raise QueryError(str(exc)) from exc

    def bodies(self, name: str, where: str = "") -> tuple[Rule, ...]:
        """The bodies of rule ``name``: this query's own rewritten rules first, then the registered ones."""
        if name in self.local_rules:
            return self.local_rules[name]
        return self.rules.bodies(name, where)

    def arity(self, name: str, where: str = "") -> int:
        """The number of arguments of rule ``name``."""
        if name in self.rule_relations:
            return len(self.rule_relations[name][1])
        return len(self.bodies(name, where)[0].head)

    def add_rules(self, rules: dict[str, tuple[Rule, ...]]) -> None:
        """Add rules private to this query (rewritten from registered ones)."""
        self.local_rules.update(rules)

    def add_relation(self, name: str, node: Node, kinds: list[Kind]) -> None:
        """Make ``node`` callable as a rule without bodies (the seed of a goal-directed call)."""
        self.local_rules[name] = ()
        self.rule_relations[name] = (node, kinds)

    def handle(self, attribute: Attribute, face: str) -> HandleSlot:
        """A handle on one face of a shared attribute arrangement (a QueryError for a face
        the attribute's settings do not keep)."""
        attribute.require(face)
        if self._owner is not None:
            self._owner.attributes.add(attribute.name)
        self.attributes.add(attribute.name)
        return HandleSlot(str.__str__(attribute.name), attribute.id, face, self.owner)

    def private_trace(self, label: str, columns: tuple[tuple[str, Kind], ...], key: tuple[str, ...],
                      role: str) -> TraceSlot:
        """A trace private to this query or to the shared rule being planned (intermediate
        state or result); its label is made unique among its owner's."""
        taken = self._labels.setdefault(self.owner, set())
        if label in taken:
            label = next(f"{label} #{i}" for i in range(2, len(taken) + 2) if f"{label} #{i}" not in taken)
        taken.add(label)
        return TraceSlot(label, tuple(columns), tuple(key), role, self.owner)

    def distinct(self, node: Node, label: str) -> Distinct:
        """The set of ``node``'s tuples, its derivation counts kept in a private trace."""
        return Distinct(node, self.private_trace(label, node.columns, tuple(node.names), "intermediate"))

    def column(self, hint: str) -> str:
        """A Spark-safe column name that mentions ``hint`` (a variable name), numbered per
        owner: ``c<n>_`` for the query's, ``r<n>_`` for a shared rule's."""
        count = self._columns[self.owner] = self._columns.get(self.owner, 0) + 1
        clean = re.sub(r"[^A-Za-z0-9]", "_", hint.lstrip("?")).strip("_")[:24] or "x"
        return f"{'c' if self._owner is None else 'r'}{count}_{clean}"
