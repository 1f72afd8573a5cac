"""Rules planned once and maintained once for every query that calls them.

A registered rule called without bound arguments (or a recursive component of such
rules) defines one relation whatever query asks for it. The first query that calls it
plans it (with that query's join strategy) into a :class:`SharedRule`: the rule's
operators and the state they keep, owned by the rule rather than by the query (their
slots are allocated, and the rule registered, when that query is installed). Later
queries with the same strategy read the same operators: on install they see the rule's
maintained state as their initial change (nothing is recomputed), and in every epoch
the engine evaluates the rule's operators once for all the queries reading them. The
state is released when the last query using it closes.

Goal-directed calls (:mod:`factflow.planner.magic`) are not shared: their rewritten
rules depend on the call's seed, so each call keeps its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from factflow.dataflow.nodes import Node, Stateful
from factflow.dataflow.recursion import Fixpoint
from factflow.model.types import Kind
from factflow.planner.holdings import Holdings

if TYPE_CHECKING:  # pragma: no cover
    from factflow.dataflow.context import EpochContext

__all__ = ["SharedRule", "SharedRules"]


class SharedRule(Holdings):
    """The relations of one rule (or recursive component) planned with one join strategy,
    the state they hold, and the queries that read them."""

    def __init__(self, rules: list[str], strategy: str):
        super().__init__()
        self.rules = tuple(rules)
        self.strategy = strategy
        self.name = f"shared {'/'.join(self.rules)} ({strategy})"
        self.relations: dict[str, tuple[Node, list[Kind]]] = {}
        self.notes: list[tuple[str, str, str]] = []
        self.uses: list[SharedRule] = []  # the shared rules its bodies call
        self.users: set[str] = set()
        self.installed = False

    def stateful(self) -> list[Node]:
        """The operators the engine evaluates for this rule (those of the rules it uses included)."""
        seen: list[Node] = []
        for relation, _ in self.relations.values():
            for n in relation.walk():
                if isinstance(n, (Stateful, Fixpoint)) and n not in seen:
                    seen.append(n)
        return seen

    def present_as_installed(self, cx: "EpochContext") -> None:
        """Give an install evaluation the rule's maintained relations as they stand (their
        whole state is the installing query's change), so nothing of the rule is recomputed."""
        for relation, _ in self.relations.values():
            relation.present_as_installed(cx)  # type: ignore[attr-defined]

    def tuples(self) -> int:
        """Rows held in the rule's traces."""
        return sum(t.tuples for t, _ in self.traces)

    def to_data(self, ref) -> dict:
        """The rule as plain data (``ref`` numbers its relations' operators)."""
        return {"name": self.name, "rules": list(self.rules), "strategy": str(self.strategy),
                "relations": {rule: ref(node) for rule, (node, _) in self.relations.items()},
                "kinds": {rule: [k.value for k in kinds] for rule, (_, kinds) in self.relations.items()},
                "notes": [list(n) for n in self.notes], "uses": sorted(e.name for e in self.uses),
                "attributes": sorted(str.__str__(a) for a in self.attributes)}


class SharedRules:
    """The engine's shared rules, by (rule name, join strategy)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], SharedRule] = {}

    def get(self, rule: str, strategy: str) -> SharedRule | None:
        """The installed shared relation of ``rule`` planned with ``strategy``, if any."""
        return self._entries.get((rule, strategy))

    def current(self, entry: SharedRule) -> bool:
        """Whether ``entry`` can be installed with a query now: a planned rule whose rules
        no installed entry holds yet, or an installed entry still registered."""
        if entry.installed:
            return all(self._entries.get((rule, entry.strategy)) is entry for rule in entry.rules)
        return all((rule, entry.strategy) not in self._entries for rule in entry.rules)

    def entries(self) -> list[SharedRule]:
        """Every installed shared rule, each once."""
        return list(dict.fromkeys(self._entries.values()))

    def commit(self, user: str, used: list[SharedRule]) -> None:
        """Record that query ``user`` (now installed) reads ``used``; new entries become shared."""
        for entry in used:
            if not entry.installed:
                entry.installed = True
                for rule in entry.rules:
                    self._entries[(rule, entry.strategy)] = entry
            entry.users.add(user)

    def release(self, user: str) -> None:
        """Query ``user`` closed: release the rules no query reads any more."""
        for entry in self.entries():
            entry.users.discard(user)
            if not entry.users:
                entry.release()
                for rule in entry.rules:
                    del self._entries[(rule, entry.strategy)]
