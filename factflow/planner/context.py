"""State shared while one query is synthesized: schema, arrangements, rules, and what it creates."""

from __future__ import annotations

import re
from typing import Callable

from pyspark.sql import SparkSession

from factflow.arrangement.attribute import AttributeArrangement
from factflow.arrangement.batch import Layout, register_view
from factflow.arrangement.trace import MergePolicy, Trace, TraceHandle
from factflow.dataflow.nodes import Distinct, Node
from factflow.edn import Keyword
from factflow.errors import QueryError, UnknownAttributeError
from factflow.lang.ast import Rule
from factflow.lang.rules import RuleStore
from factflow.model.schema import Attribute, Schema
from factflow.model.types import Kind
from factflow.planner.holdings import Holdings
from factflow.planner.shared import SharedRule, SharedRules
from factflow.planner.strategy import Strategy

__all__ = ["PlanContext"]


class PlanContext(Holdings):
    """Everything the planner needs about the engine, and a record of what it allocates.

    Handles and private traces created while planning are recorded so that a failed
    synthesis can release them (nothing of a rejected query remains) and a closed query
    can release exactly what it holds. While a shared rule is planned
    (:meth:`shared_rule`), what is created is recorded on the rule instead.
    """

    def __init__(self, spark: SparkSession, schema: Schema,
                 arrangement: Callable[[Attribute], AttributeArrangement], rules: RuleStore,
                 name: str, epoch: int, policy: MergePolicy, semantics: str, strategy: Strategy = Strategy.BINARY,
                 shared_rules: SharedRules | None = None):
        super().__init__(spark)
        self.schema = schema
        self._arrangement = arrangement
        self.rules = rules
        self.name = name
        self.epoch = epoch
        self.policy = policy
        self.semantics = semantics
        self.strategy = strategy  # the requested join strategy (see planner.strategy)
        self.strategies: list[tuple[str, str, str]] = []  # (conjunction, strategy, reason) as planned
        self.rule_relations: dict[str, tuple] = {}
        self.local_rules: dict[str, tuple[Rule, ...]] = {}  # rules rewritten for this query (magic sets)
        self.goal_calls = 0  # goal-directed calls planned so far (numbers their rewritten rules)
        self.transient = False  # planning the bodies of a recursive component
        self.shared_rules = shared_rules  # None: every rule is planned privately
        self.shared: list[SharedRule] = []  # shared rules the query reads (created or reused)
        self._owner: SharedRule | None = None  # the shared rule being planned
        self._columns = 0

    @property
    def owner(self) -> str:
        """Who owns what is created now: the shared rule being planned, else the query."""
        return self._owner.name if self._owner is not None else self.name

    def _holder(self) -> Holdings:
        return self._owner if self._owner is not None else self

    def shared_rule(self, name: str, members: list[str], plan: Callable[[], tuple[Node, list[Kind]]]
                    ) -> tuple[Node, list[Kind]]:
        """The relation of registered rule ``name`` (``members``: its recursive component, or
        itself), planned by ``plan`` unless a shared rule with this strategy exists already."""
        if self.shared_rules is None or name in self.local_rules:
            return plan()
        entry = self.shared_rules.get(name, self.strategy)
        if entry is None:
            entry = SharedRule(self.spark, members, self.strategy)
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
        if self._owner is not None:
            self._owner.notes.append((conjunction, strategy, reason))

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

    def handle(self, attribute: Attribute, face: str) -> TraceHandle:
        """A handle on one face of a shared attribute arrangement, at the install epoch."""
        trace = self._arrangement(attribute).index(face)
        h = trace.handle(self.epoch, self.owner)
        self._holder().handles.append(h)
        self._holder().attributes.add(attribute.name)
        self.attributes.add(attribute.name)
        return h

    def private_trace(self, label: str, columns: tuple[tuple[str, Kind], ...], key: tuple[str, ...],
                      role: str) -> Trace:
        """A trace private to this query or to the shared rule being planned (intermediate state or result)."""
        holder = self._holder()
        name = f"{self.owner}: {label}"
        taken = {t.name for t, _ in holder.traces}
        if name in taken:
            name = next(f"{name} #{i}" for i in range(2, len(taken) + 2) if f"{name} #{i}" not in taken)
        trace = Trace(self.spark, name, Layout(columns, key), self.policy, self.epoch)
        holder.traces.append((trace, role))
        return trace

    def distinct(self, node: Node, label: str) -> Distinct:
        """The set of ``node``'s tuples, its derivation counts kept in a private trace."""
        trace = self.private_trace(label, node.columns, tuple(node.names), "intermediate")
        return Distinct(node, trace, self.owner)

    def view(self, frame) -> str:
        """Register a constant frame of this query as a temp view (dropped on release)."""
        name = register_view(frame, prefix="ff_s")
        self._holder().views.append(name)
        return name

    def column(self, hint: str) -> str:
        """A fresh, Spark-safe column name that mentions ``hint`` (a variable name)."""
        self._columns += 1
        clean = re.sub(r"[^A-Za-z0-9]", "_", hint.lstrip("?")).strip("_")[:24] or "x"
        return f"c{self._columns}_{clean}"

    def release(self) -> None:
        """Release every handle and private trace created so far, and the shared rules
        planned for this query that were never installed."""
        for entry in self.shared:
            if not entry.installed:
                entry.release()
        super().release()
