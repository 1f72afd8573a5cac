"""A query plan: the operators of a query as plain data, before anything is allocated.

:func:`factflow.planner.synthesis.plan_query` makes a :class:`Plan` from the query text,
its inputs, the join strategy and the semantics, reading only the schema, the rule store
and the registry of shared rules: no SparkSession, no handle, trace or view. Where an
operator will hold something, it holds a slot (:mod:`factflow.dataflow.slots`);
:func:`factflow.engine.install.install` allocates the slots and evaluates the query.

A plan is inspectable (:meth:`Plan.to_data`: nested dicts and lists of strings, numbers,
booleans and None, with every operator, its parameters, columns, slots and inputs, and
the strategies chosen with their reasons), comparable (``==``, :meth:`Plan.fingerprint`)
and serializable (``json.dumps(plan.to_data())``). Column names and trace labels are
numbered deterministically per owner, so the same text, inputs, strategy and semantics
planned against the same schema and rules give equal plans, whether or not the shared
rules they read are installed yet; the query's name is not part of its plan.

A plan also keeps what it was planned from (:attr:`Plan.source`: the text, inputs and
join strategy asked for), outside its data: ``Engine.query(plan)`` plans the source on
that engine and installs the result only when it equals the plan given. So a plan made by
an engine with another schema or other rules is refused, a plan made by another engine
with the same ones is installed, and the plan object itself is never bound to Spark state:
it can be installed again, under another name or on another engine.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from factflow.dataflow.nodes import Node, Stateful
from factflow.dataflow.recursion import Fixpoint
from factflow.edn import Keyword
from factflow.lang.ast import FindElement, Query
from factflow.planner.pull import PullField, PullPlan
from factflow.planner.shared import SharedRule

__all__ = ["Plan", "PlanSource"]

#: the version of the layout :meth:`Plan.to_data` writes
FORMAT = 1


class _Operators:
    """Numbers operators as they are first met (inputs before the operators reading them)."""

    def __init__(self) -> None:
        self.numbers: dict[int, int] = {}
        self.rows: list[dict] = []
        self.nodes: list[Node] = []

    def ref(self, node: Node) -> int:
        """The number of ``node``, its data recorded on first use."""
        if id(node) not in self.numbers:
            data = node.plan_data(self.ref)
            self.numbers[id(node)] = len(self.rows)
            self.rows.append(data)
            self.nodes.append(node)
        return self.numbers[id(node)]


def _fields(fields: Sequence[PullField]) -> list[dict]:
    return [{"key": f.key, "attribute": str.__str__(f.attribute.name) if f.attribute is not None else None,
             "nested": _fields(f.nested) if f.nested is not None else None} for f in fields]


def _pull(pull: PullPlan, ref: Callable[[Node], int]) -> dict:
    return {"element": str(pull.element), "column": pull.column, "fields": _fields(pull.fields),
            "paths": [{"keys": list(keys), "steps": [str.__str__(a.name) for a in path.steps], "node": ref(path.node)}
                      for keys, path in pull.paths.items()]}


@dataclass(frozen=True)
class PlanSource:
    """What a plan was planned from: the query (text or parsed form), the values of its
    ``:in`` bindings and the join strategy asked for (the semantics is in the plan)."""

    query: str | Query
    inputs: tuple[Any, ...]
    join: str


class Plan:
    """The planned dataflow of a query: its operators (with slots), result, ``:find``,
    strategies and the shared rules it reads; equal to another plan exactly when their
    canonical data (:meth:`to_data`) is equal."""

    def __init__(self, result: Stateful, find: list[tuple[FindElement, str]], find_kind: str,
                 decoders: dict[str, Callable], strategy: str, requested: str, semantics: str,
                 pulls: Sequence[PullPlan], strategies: list[tuple[str, str, str]],
                 notes: list[tuple[str, str, str]], shared: list[SharedRule], attributes: set[Keyword]):
        self.result = result
        self.find = find
        self.find_kind = find_kind
        self.decoders = dict(decoders)
        self.strategy = strategy
        self.requested_strategy = requested
        self.semantics = semantics
        #: the pull expressions of :find, whose stages are maintained beside the result
        self.pulls = list(pulls)
        #: (conjunction, strategy, reason) as planned, those of shared rules included (for explain)
        self.strategies = list(strategies)
        self.notes = list(notes)
        #: the shared rules the query reads: installed ones, and those installing it creates
        self.shared = list(shared)
        self.attributes = set(attributes)
        self.nodes: list[Node] = list({id(n): n for root in [result, *self.pull_nodes()] for n in root.walk()}
                                      .values())
        self.stateful: list[Node] = [n for n in self.nodes if isinstance(n, (Stateful, Fixpoint))]
        self._fingerprint: str | None = None
        #: what the plan was planned from (set by :func:`~factflow.planner.synthesis.plan_query`)
        self.source: PlanSource | None = None

    def pull_nodes(self) -> list[Stateful]:
        """The stateful operators of every pull stage (see :mod:`factflow.planner.pull`)."""
        return [n for p in self.pulls for n in p.nodes()]

    def to_data(self) -> dict:
        """The plan as plain data (JSON-serializable): operators are listed inputs first and
        referred to by their position in ``operators``."""
        return self._encode()[0]

    def operators(self) -> list[Node]:
        """Every operator of the plan, as numbered in :meth:`to_data` (those of the shared
        rules it reads, and those only a delta join's install pipeline reads, included)."""
        return self._encode()[1].nodes

    def _encode(self) -> tuple[dict, _Operators]:
        table = _Operators()
        result = table.ref(self.result)
        pulls = [_pull(p, table.ref) for p in self.pulls]
        shared = [e.to_data(table.ref) for e in sorted(self.shared, key=lambda e: e.name)]
        return {
            "format": FORMAT,
            "semantics": self.semantics,
            "join": str(self.requested_strategy),
            "strategy": str(self.strategy),
            "find_kind": self.find_kind,
            "find": [[str(e), column] for e, column in self.find],
            "result": result,
            "pulls": pulls,
            "strategies": [list(n) for n in self.notes],
            "shared_rules": shared,
            "attributes": sorted(str.__str__(a) for a in self.attributes),
            "operators": table.rows,
        }, table

    def fingerprint(self) -> str:
        """A stable digest of the plan (SHA-256 of its canonical JSON)."""
        if self._fingerprint is None:
            text = json.dumps(self.to_data(), sort_keys=True, separators=(",", ":"), allow_nan=True)
            self._fingerprint = hashlib.sha256(text.encode()).hexdigest()
        return self._fingerprint

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def explain(self, name: str) -> str:
        """A readable description of the plan of query ``name``."""
        lines = [
            f"query {name}",
            f"  strategy: {self.strategy} (requested {self.requested_strategy})",
            f"  semantics: {self.semantics}",
            f"  find ({self.find_kind}): {' '.join(str(v) for v, _ in self.find)}",
            "  conjunctions:",
        ]
        for conjunction, strategy, reason in self.strategies:
            lines.append(f"    {conjunction}: {strategy + ' (' + reason + ')' if strategy else reason}")
        lines.append("  plan:")
        seen: set[int] = set()

        def render(node: Node, depth: int) -> None:
            pad = "    " + "  " * depth
            if id(node) in seen:
                lines.append(f"{pad}(shared) {node.describe()}")
                return
            seen.add(id(node))
            cols = ", ".join(f"{n}:{k.value}" for n, k in node.columns)
            lines.append(f"{pad}{node.describe()}  [{cols}]")
            lines.extend(f"{pad}  | {line}" for line in node.details())
            for child in node.inputs():
                render(child, depth + 1)

        render(self.result, 0)
        for pull in self.pulls:
            lines.append(f"  pull {pull.element} (entities from {pull.column}):")
            for path in pull.paths.values():
                lines.append(f"    stage {path.label}")
                render(path.node, 1)
        return "\n".join(lines)
