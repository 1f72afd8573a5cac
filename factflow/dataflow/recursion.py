"""Recursive rules: a fixed point per strongly connected component of rules, maintained by DRed.

A :class:`Fixpoint` holds the current set of every rule of one recursive component (one
private trace per rule) and, per epoch, brings them up to date with *delete and
rederive* over semi-naive iterations, each iteration one Spark statement:

1. **Overdelete.** The rule bodies' change under the epoch's input changes, with the
   recursive relations held at their old state, gives the derivations lost (bindings whose
   count drops). Their heads, then everything derivable from a deleted tuple in the old
   state, transitively, are marked deleted (``D``).
2. **Rederive.** Each body is planned a second time behind a *guard* holding the marked
   heads, so that only derivations of marked tuples are evaluated: a marked tuple with a
   derivation from the new inputs and the unmarked state (``S - D``) comes back (``R``).
3. **Insert.** Semi-naive iteration from ``S - D`` with the new inputs: the first delta is
   ``R`` plus the heads of derivations the input changes gained; each next delta is the
   heads derived from the previous delta that are not yet present.

The epoch's change is then ``(everything inserted) - D``. Work is proportional to the
derivations touched by the change (and by the overdeleted tuples), not to the size of the
relations; a retraction that other derivations still support is rederived, never lost.
Overdeletion is DRed's weakness: a retraction upstream of much of a closure marks all of
it, level by level, and then rederives nearly all of it (on a grid, or a dense random
graph, almost every tuple has another derivation). So once the marked tuples pass a
fraction of what the rules hold (``EngineConfig.recompute_fraction``), the epoch derives
the rules again from the new inputs, as an install does, and emits the new sets minus
the old: an epoch then costs about an install, not a multiple of it.
Installing is the insert phase from empty state. Differential dataflow's iteration
timestamps would avoid overdeletion, but need per-iteration versions of every
arrangement, which Spark batches make costly; DRed keeps only the rule sets themselves.

Each iteration is one statement for all rules of the component, fetched with one
collect (plus the broadcast jobs Spark runs for the small relations it joins); what the
iterations accumulate (deleted, inserted) is kept as one materialized relation per rule
and grown by concatenation, so an iteration's statement does not grow with the number
of iterations before it (grid150's closures take ~300). Where a materialized set lives is
the :class:`Materializer`'s business, not the algorithm's: a set within its share of what
a fetch may bring to the driver is held there, a larger one stays in Spark (as files,
see :mod:`factflow.arrangement.filed`), so a component whose sets outgrow the driver
iterates in Spark with the same statements. Membership tests against these
sets (a frontier minus what is present, a state minus what is deleted) are plain semi
and anti joins on whole rows: the sets hold each row once, so making their rows
distinct first, as :func:`zset.semijoin` does for arbitrary keys, would only add an
aggregation and a shuffle to every iteration (a fifth of grid150's install time). For the
same reason, where a statement is spread over partitions (not a small epoch's single
partition), a body's bindings are distributed by the rule's columns before they are
consolidated: consolidating them, taking their distinct heads and testing those against
the present set then need one shuffle of the bindings instead of three. Goal-directed calls
(:mod:`factflow.planner.magic`) reach this class as ordinary components of adorned and
magic rules, their seed a leaf relation like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from factflow.arrangement.batch import DIFF
from factflow.arrangement.trace import Trace, TraceHandle
from factflow.dataflow import zset
from factflow.dataflow.context import EpochContext, Version
from factflow.dataflow.nodes import Columns, Node, Scan, Static, Stateful
from factflow.dataflow.slots import TraceSlot
from factflow.dataflow.zset import ident

__all__ = ["Placeholder", "RuleOutput", "RecursiveBody", "Fixpoint", "Materializer"]



class Materializer(Protocol):
    """Where a fixpoint's iterations are materialized (the engine's evaluation provides
    it): on the driver when they are small, in Spark when they are not."""

    def collect(self, cx: EpochContext, relations: dict[str, tuple[str, Columns]],
                label: str) -> dict[str, tuple[str, int]]:
        """Evaluate ``relations`` (named in ``cx``), together where they are small; per key,
        the name of a materialized relation with the same rows, and its row count."""

    def concat(self, relations: list[str], columns: Columns) -> str:
        """One materialized relation holding the rows of materialized ``relations``
        (whether each is held on the driver or in Spark)."""


class Placeholder(Node):
    """A relation whose change and states the fixpoint sets for each iteration
    (a recursive rule's current set, or a guard of marked heads)."""

    def __init__(self, columns: Columns, label: str):
        self.columns = columns
        self.label = label

    def params(self, ref):
        return {"label": self.label}

    def empty_when_installed(self, empty):
        return True  # what the fixpoint's first iteration reads

    def _delta(self, cx):
        raise AssertionError(f"{self.label}: read outside its fixpoint")

    _read = _delta

    def describe(self):
        return f"Recursive reference {self.label}"


@dataclass
class RecursiveBody:
    """One body of a rule in the component: its plan, the same plan behind a guard, and
    which body columns carry the rule's arguments."""

    rule: str
    plan: Node
    guarded: Node
    guard: Placeholder
    head: list[str]
    guarded_head: list[str]
    guard_from: list[tuple[str, str]]  # (rule column, guard column) per distinct head variable


class Fixpoint(Node):
    """The fixed point of one recursive component of rules (see the module docs)."""

    def __init__(self, rules: dict[str, Columns], refs: dict[str, Placeholder], bodies: list[RecursiveBody],
                 slots: dict[str, TraceSlot], goal: str | None = None):
        self.rules = rules
        self.goal = goal
        self.refs = refs
        self.bodies = bodies
        self.trace_slots = slots
        self.writers: dict[str, Trace] = {}  # bound at install; appended to by the engine's evaluation only
        self.handles: dict[str, TraceHandle] = {}
        self.columns = ()
        self.outputs: dict[str, RuleOutput] = {name: RuleOutput(self, name) for name in rules}

    def inputs(self):
        return tuple(b.plan for b in self.bodies) + tuple(b.guarded for b in self.bodies)

    def empty_when_installed(self, empty):
        return all(empty(n) for n in self.inputs())  # from nothing, its iteration stops at once

    def slots(self):
        return list(self.trace_slots.values())

    def bind(self, alloc):
        for name, slot in self.trace_slots.items():
            self.writers[name], owner = alloc.trace(slot)
            self.handles[name] = self.writers[name].handle(self.writers[name].upper - 1, owner)

    def params(self, ref):
        bodies = [{"rule": b.rule, "plan": ref(b.plan), "guarded": ref(b.guarded), "guard": ref(b.guard),
                   "head": list(b.head), "guarded_head": list(b.guarded_head),
                   "guard_from": [list(pair) for pair in b.guard_from]} for b in self.bodies]
        return {"rules": {r: [[n, k.value] for n, k in cols] for r, cols in self.rules.items()},
                "refs": {r: ref(p) for r, p in self.refs.items()}, "bodies": bodies,
                "slots": {r: slot.to_data() for r, slot in self.trace_slots.items()}, "goal": self.goal}

    def describe(self):
        text = f"Fixpoint of {', '.join(self.rules)} (delete and rederive, semi-naive)"
        return text if self.goal is None else f"{text}; goal-directed: {self.goal}"

    # ------------------------------------------------------------ evaluation
    def _names(self, rule: str) -> list[str]:
        return [n for n, _ in self.rules[rule]]

    def _leaves(self) -> list[Node]:
        """Nodes the bodies read that the fixpoint does not evaluate itself."""
        def leaf(n: Node) -> bool:
            return isinstance(n, (Scan, Static, Stateful, RuleOutput))

        return [n for n in self.reachable(stop=leaf) if leaf(n)]

    def _sub(self, cx: EpochContext, leaves: str) -> EpochContext:
        """A context for one iteration: inputs as they changed (``actual``) or frozen at OLD or NEW."""
        sub = cx.child()
        for leaf in self._leaves():
            if leaves == "actual":
                entries = {"delta": leaf.delta(cx), "read-old": leaf.read(cx, Version.OLD),
                           "read-new": leaf.read(cx, Version.NEW)}
            else:
                version = Version.OLD if leaves == "old" else Version.NEW
                frozen = leaf.read(cx, version)
                entries = {"delta": None, "read-old": frozen, "read-new": frozen}
                if isinstance(leaf, Stateful):
                    state = leaf.state(cx, version)
                    entries.update({"state-old": state, "state-new": state})
            for what, relation in entries.items():
                sub.set(leaf, what, relation)
        return sub

    @staticmethod
    def _bind(sub: EpochContext, ref: Node, old: str, delta: str | None, new: str) -> None:
        sub.set(ref, "read-old", old)
        sub.set(ref, "delta", delta)
        sub.set(ref, "read-new", new)

    def _heads(self, sub: EpochContext, body: RecursiveBody, guarded: bool, sign: str,
               whole: bool = False) -> str | None:
        """Distinct rule tuples of the body's change (``whole``: of all its bindings as of NEW)
        with bindings of the given sign (``>`` or ``<``)."""
        plan, head = (body.guarded, body.guarded_head) if guarded else (body.plan, body.head)
        d = plan.read(sub, Version.NEW) if whole else plan.delta(sub)
        if d is None:
            return None
        if not sub.single_partition and head:
            d = sub.define(f"SELECT * FROM {d} DISTRIBUTE BY {', '.join(ident(c) for c in dict.fromkeys(head))}")
        bindings = sub.define(zset.consolidate(d, plan.names))
        names = self._names(body.rule)
        outs = [f"{ident(c)} AS {ident(n)}" for c, n in zip(head, names)]
        return sub.define(f"SELECT DISTINCT {', '.join(outs)}, CAST(1 AS BIGINT) AS {ident(DIFF)} "
                          f"FROM {bindings} WHERE {ident(DIFF)} {sign} 0")

    def _collect(self, sub: EpochContext, per_rule: dict[str, list[str]], minus: dict[str, str | None],
                 store: "Materializer", label: str) -> dict[str, tuple[str, int]]:
        """Materialize, with one job for all rules, per rule the distinct union of ``per_rule``
        relations minus the ``minus`` relation; rules with no rows are left out."""
        relations = {}
        for rule, parts in per_rule.items():
            if not parts:
                continue
            names = self._names(rule)
            rel = sub.define(f"SELECT DISTINCT * FROM ({zset.union(parts, names)})")
            if minus.get(rule) is not None:
                rel = sub.define(_filter(rel, minus[rule], names, anti=True))
            relations[rule] = (rel, self.rules[rule])
        return {r: got for r, got in store.collect(sub, relations, label).items() if got[1]}

    def _union(self, cx: EpochContext, rule: str, parts: Sequence[str | None]) -> str:
        """The union of disjoint sets of ``rule`` (None: empty)."""
        parts = [p for p in parts if p is not None]
        if not parts:
            return cx.define(zset.empty(self.rules[rule]))
        return cx.define(zset.union(parts, self._names(rule))) if len(parts) > 1 else parts[0]

    def _minus(self, cx: EpochContext, rule: str, relation: str, removed: str | None) -> str:
        if removed is None:
            return relation
        return cx.define(_filter(relation, removed, self._names(rule), anti=True))

    @staticmethod
    def _add(store: "Materializer", rule_columns: Columns, acc: str | None, new: str) -> str:
        """One materialized relation holding ``acc`` (disjoint from ``new``) and ``new``."""
        return new if acc is None else store.concat([acc, new], rule_columns)

    def old_state(self, cx: EpochContext, rule: str) -> str:
        """The set of ``rule`` as of the epoch before (empty when installing)."""
        def build() -> str:
            if cx.install:
                return cx.define(zset.empty(self.rules[rule]))
            return cx.define(zset.present(self.handles[rule].read(cx.old_epoch), self._names(rule)))
        return cx.memo(self, f"old-{rule}", build)

    def _lost(self, sub: EpochContext, within: dict[str, str]) -> dict[str, list[str]]:
        """Per rule, the heads of derivations the body changes in ``sub`` remove, kept if in ``within``."""
        lost: dict[str, list[str]] = {r: [] for r in self.rules}
        for b in self.bodies:
            h = self._heads(sub, b, False, "<")
            if h is not None:
                lost[b.rule].append(sub.define(_filter(h, within[b.rule], self._names(b.rule))))
        return lost

    def run(self, cx: EpochContext, store: "Materializer", label: str, recompute_fraction: float = 0.5,
            max_iterations: int = 100_000) -> dict[str, str]:
        """Bring every rule of the component up to date; returns each rule's change relation.

        Every iteration is one collect (``store.collect``) for all rules together; what
        the iterations accumulate (deleted and inserted tuples) is kept as one materialized
        relation per rule (``store.concat``), so each iteration's statement has the same
        size however many iterations came before. Once the overdeleted tuples pass
        ``recompute_fraction`` of the tuples the rules' traces hold, delete and rederive is
        abandoned: the rules are derived again from the new inputs (what an install does)
        and the change is the new sets minus the old, so an epoch never costs much more
        than recomputing (``float("inf")``: never recompute, ``0``: on any overdeletion).
        """
        rules = list(self.rules)
        old = {r: self.old_state(cx, r) for r in rules}
        deleted: dict[str, str | None] = {r: None for r in rules}
        rederived: dict[str, str | None] = {r: None for r in rules}
        recompute = False
        if not cx.install:
            # 1. overdelete
            sub = self._sub(cx, "actual")
            for r in rules:
                self._bind(sub, self.refs[r], old[r], None, old[r])
            frontier = self._collect(sub, self._lost(sub, old), {}, store, f"{label}: overdelete")
            held = sum(handle.tuples for handle in self.handles.values())
            overdeleted = 0
            iterations = 0
            while frontier:
                overdeleted += sum(rows for _, rows in frontier.values())
                if overdeleted > recompute_fraction * held:
                    recompute = True
                    break
                iterations += 1
                prior = dict(deleted)
                for r, (view, _) in frontier.items():
                    deleted[r] = self._add(store, self.rules[r], deleted[r], view)
                sub = self._sub(cx, "old")
                remaining = {}
                for r in rules:
                    before = self._minus(sub, r, old[r], prior[r])
                    remaining[r] = self._minus(sub, r, old[r], deleted[r])
                    delta = (sub.define(zset.select(frontier[r][0], self._names(r), diff=f"-{ident(DIFF)}"))
                             if r in frontier else None)
                    self._bind(sub, self.refs[r], before, delta, remaining[r])
                frontier = self._collect(sub, self._lost(sub, remaining), {}, store,
                                         f"{label}: overdelete {iterations}")
                if iterations > max_iterations:
                    raise AssertionError("overdeletion did not terminate")
            # 2. rederive
            if not recompute and any(d is not None for d in deleted.values()):
                sub = self._sub(cx, "new")
                for r in rules:
                    kept = self._minus(sub, r, old[r], deleted[r])
                    self._bind(sub, self.refs[r], kept, None, kept)
                for b in self.bodies:
                    marked = self._union(sub, b.rule, [deleted[b.rule]])
                    picks = ", ".join(f"{ident(n)} AS {ident(g)}" for n, g in b.guard_from)
                    guard = sub.define(_dedupe(f"(SELECT {picks} FROM {marked})", b.guard.names))
                    self._bind(sub, b.guard, sub.define(zset.empty(b.guard.columns)), guard, guard)
                back = {r: [] for r in rules}
                for b in self.bodies:
                    h = self._heads(sub, b, True, ">")
                    if h is not None:
                        back[b.rule].append(h)
                for r, (view, _) in self._collect(sub, back, {}, store, f"{label}: rederive").items():
                    rederived[r] = view
        # 3. insert (when recomputing: from empty sets, seeded by every binding of the bodies)
        if recompute:
            deleted = dict(old)
            current = {r: cx.define(zset.empty(self.rules[r])) for r in rules}
            sub = self._sub(cx, "new")
            for r in rules:
                self._bind(sub, self.refs[r], current[r], None, current[r])
        else:
            current = {r: self._minus(cx, r, old[r], deleted[r]) for r in rules}
            sub = self._sub(cx, "actual")
            for r in rules:
                seed_state = self._union(sub, r, [current[r], rederived[r]])
                self._bind(sub, self.refs[r], seed_state, None, seed_state)
        gained = {r: [rederived[r]] if rederived[r] is not None else [] for r in rules}
        for b in self.bodies:
            h = self._heads(sub, b, False, ">", whole=recompute)
            if h is not None:
                gained[b.rule].append(h)
        frontier = self._collect(sub, gained, current, store, f"{label}: {'recompute' if recompute else 'insert'}")
        inserted: dict[str, str | None] = {r: None for r in rules}
        iterations = 0
        while frontier:
            iterations += 1
            sub = self._sub(cx, "new")
            for r in rules:
                before = self._union(sub, r, [current[r], inserted[r]])
                if r in frontier:
                    after = self._union(sub, r, [before, frontier[r][0]])
                    self._bind(sub, self.refs[r], before, frontier[r][0], after)
                else:
                    self._bind(sub, self.refs[r], before, None, before)
            for r, (view, _) in frontier.items():
                inserted[r] = self._add(store, self.rules[r], inserted[r], view)
            derived = {r: [] for r in rules}
            for b in self.bodies:
                h = self._heads(sub, b, False, ">")
                if h is not None:
                    derived[b.rule].append(h)
            present = {r: self._union(sub, r, [current[r], inserted[r]]) for r in rules}
            frontier = self._collect(sub, derived, present, store, f"{label}: insert {iterations}")
            if iterations > max_iterations:
                raise AssertionError("semi-naive iteration did not terminate")
        changes = {}
        for r in rules:
            names = self._names(r)
            parts = [inserted[r]] if inserted[r] is not None else []
            if deleted[r] is not None:
                parts.append(cx.define(zset.select(deleted[r], names, diff=f"-{ident(DIFF)}")))
            if parts:
                changes[r] = cx.define(zset.consolidate(f"({zset.union(parts, names)})", names))
        return changes


def _filter(relation: str, rows: str, names: Sequence[str], anti: bool = False) -> str:
    """Rows of ``relation`` that are (with ``anti``: are not) in the set ``rows`` of the same rule.

    Unlike :func:`zset.semijoin` the keys are not made distinct first: they are whole rows
    of a set, and a DISTINCT would cost every iteration an aggregation and a shuffle
    inside the job that broadcasts them.
    """
    condition = " AND ".join(f"t.{ident(n)} = k.{ident(n)}" for n in names)
    kind = "LEFT ANTI" if anti else "LEFT SEMI"
    return f"SELECT t.* FROM {relation} t {kind} JOIN {rows} k ON {condition}"


def _dedupe(relation: str, names: Sequence[str]) -> str:
    outs = [ident(n) for n in names] + [f"CAST(1 AS BIGINT) AS {ident(DIFF)}"]
    return f"SELECT DISTINCT {', '.join(outs)} FROM {relation}"


class RuleOutput(Node):
    """One rule of a :class:`Fixpoint` as a set-valued relation for the operators that use it."""

    def __init__(self, fixpoint: Fixpoint, rule: str):
        self.fixpoint = fixpoint
        self.rule = rule
        self.columns = fixpoint.rules[rule]

    def inputs(self):
        return (self.fixpoint,)

    def empty_when_installed(self, empty):
        return empty(self.fixpoint)

    def params(self, ref):
        return {"rule": self.rule}

    def _delta(self, cx):
        raise AssertionError(f"rule {self.rule} read before its fixpoint ran")

    def _read(self, cx, version):
        raise AssertionError(f"rule {self.rule} read before its fixpoint ran")

    def publish(self, cx: EpochContext, change: str | None) -> None:
        """Record this epoch's change (a materialized relation) and the states it implies."""
        old = self.fixpoint.old_state(cx, self.rule)
        cx.set(self, "delta", change)
        cx.set(self, "read-old", old)
        if change is None:
            cx.set(self, "read-new", old)
        else:
            both = zset.union([old, change], self.names)
            cx.set(self, "read-new", cx.define(zset.present(f"({both})", self.names)))

    def present_as_installed(self, cx: EpochContext) -> None:
        """For an install evaluation that must not rerun the (already maintained) fixpoint:
        the rule's current set is the change, its old set empty."""
        present = cx.define(zset.present(self.fixpoint.handles[self.rule].read(cx.epoch), self.names))
        cx.set(self, "delta", present)
        cx.set(self, "read-old", cx.define(zset.empty(self.columns)))
        cx.set(self, "read-new", present)

    def describe(self):
        return f"Rule {self.rule} (recursive)"
