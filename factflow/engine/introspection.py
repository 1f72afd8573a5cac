"""The engine's activity as facts (``Engine(introspection=True)``), like 3DF's logging sources.

The engine maintains reserved attributes (names under ``:factflow.``, which users can
neither create nor write) that ordinary queries read. Entity model, every attribute
cardinality one:

* one entity per arrangement: ``:factflow.arrangement/name`` (the name ``db.stats()``
  uses), ``/tuples`` (its rows), ``/role`` (``shared`` for an attribute index, else the
  role of a query's private trace: ``intermediate`` or ``result``) and, for a private
  one, ``/query`` (the query's name);
* one entity per installed query: ``:factflow.query/name``, ``/tuples`` (its
  intermediate rows, ``stats()["query_tuples"]``) and ``/results``
  (``stats()["result_tuples"]``);
* one entity per epoch: ``:factflow.epoch/number``, ``/seconds``, ``/jobs`` (Spark jobs
  up to the commit), ``/changes`` and ``/operations`` (as in its :class:`EpochReport`).

Timing: the facts describing epoch ``E`` (its report, and what the engine holds once it
and its maintenance are done, i.e. ``db.stats()`` between ``E`` and the next epoch) are
applied as part of epoch ``E + 1``'s transaction. A query over them therefore lags by one
epoch, epoch numbers stay the user's (introspection never runs an epoch of its own), and
nothing loops: facts produced by an epoch are only ever described by a later one, which
runs only when the user transacts. Values come from :func:`engine_stats` and the epoch
reports, which the driver already holds, and so are their effective changes (the engine
knows what it asserted): they are appended to the arrangements as they are, without
validation or a Spark job (:func:`factflow.engine.apply.apply_changes`). Arrangements and queries that go
away are retracted; epoch entities are kept, like ``db.epoch_log``. A query installed
with ``introspect=False`` is left out (its entity and its private arrangements). Shared
rule relations are not described (see ``stats()["shared_rules"]``).

Entity ids are negative, below ``-2**61`` (:data:`ENTITY_BASE`): users' entities should
stay above. Introspection facts describe one process: a durable engine neither logs nor
checkpoints them (the attributes themselves are in its catalog).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pandas as pd

from factflow.arrangement.batch import DIFF
from factflow.engine.reports import EpochReport, engine_stats
from factflow.model.schema import Attribute
from factflow.model.types import Kind

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.state import EngineState

__all__ = ["ATTRIBUTES", "ENTITY_BASE", "Introspection", "IntrospectionStep"]

ATTRIBUTES: dict[str, str] = {
    ":factflow.arrangement/name": "string",
    ":factflow.arrangement/tuples": "long",
    ":factflow.arrangement/role": "string",
    ":factflow.arrangement/query": "string",
    ":factflow.query/name": "string",
    ":factflow.query/tuples": "long",
    ":factflow.query/results": "long",
    ":factflow.epoch/number": "long",
    ":factflow.epoch/seconds": "double",
    ":factflow.epoch/jobs": "long",
    ":factflow.epoch/changes": "long",
    ":factflow.epoch/operations": "long",
}
"""The introspection attributes and their types (all cardinality one)."""

ENTITY_BASE = -(1 << 62)
"""Arrangement and query entities are ``ENTITY_BASE + n``; epoch ``E`` is ``ENTITY_BASE + 2**61 + E``."""

Facts = dict[tuple[int, str], Any]  # (entity, attribute) -> value


@dataclass
class IntrospectionStep:
    """The introspection changes to append with one epoch, and the facts held once it commits."""

    owner: "Introspection"
    changes: dict[int, pd.DataFrame]
    """Effective changes ``(e, v, _diff)`` per attribute id (see :func:`factflow.engine.apply.apply_changes`)."""
    facts: Facts
    reported: int

    def commit(self) -> None:
        """Record that the epoch carrying :attr:`ops` committed."""
        self.owner.held = self.facts
        self.owner.reported = self.reported


class Introspection:
    """Keeps the introspection attributes of one engine up to date (see the module doc)."""

    def __init__(self, state: "EngineState", log: Callable[[Attribute], None] | None = None):
        """Create (``log`` them, for a durable engine) and arrange the attributes unless they exist."""
        self.schema = state.schema
        for name, value_type in ATTRIBUTES.items():
            state.arrange(self.schema.create(name, value_type, "one", log=log, reserved=True))
        self.held: Facts = {}
        self.reported = 0  # the latest epoch described
        self._ids: dict[tuple[str, str], int] = {}

    def step(self, state: "EngineState", epoch_log: Sequence[EpochReport]) -> IntrospectionStep:
        """The operations describing what happened since the last committed step: the
        engine's holdings now, and every epoch report not yet described."""
        stats = engine_stats(state)
        facts: Facts = {}
        described = {n: q for n, q in state.queries.items() if q.introspect}
        for name, tuples in stats["arrangements"].items():
            self._describe_arrangement(facts, name, tuples, "shared", None)
        for query in described:
            entity = self._entity("query", query)
            facts[(entity, ":factflow.query/name")] = query
            facts[(entity, ":factflow.query/tuples")] = stats["query_tuples"][query]
            facts[(entity, ":factflow.query/results")] = stats["result_tuples"][query]
            for name, (role, tuples) in stats["query_arrangements"][query].items():
                self._describe_arrangement(facts, name, tuples, role, query)
        reported = self.reported
        epochs: Facts = {}
        for report in epoch_log:
            if report.epoch > self.reported:
                entity = ENTITY_BASE + (1 << 61) + report.epoch
                epochs[(entity, ":factflow.epoch/number")] = report.epoch
                epochs[(entity, ":factflow.epoch/seconds")] = float(report.seconds)
                epochs[(entity, ":factflow.epoch/jobs")] = len(report.jobs)
                epochs[(entity, ":factflow.epoch/changes")] = report.changes
                if report.operations is not None:
                    epochs[(entity, ":factflow.epoch/operations")] = report.operations
                reported = max(reported, report.epoch)
        # the facts the engine holds are known exactly, so are the effective changes
        rows: dict[str, list[tuple[int, Any, int]]] = defaultdict(list)
        for (e, a), old in self.held.items():
            if facts.get((e, a)) != old:
                rows[a].append((e, old, -1))
        for (e, a), new in facts.items():
            if self.held.get((e, a)) != new:
                rows[a].append((e, new, 1))
        for (e, a), new in epochs.items():
            rows[a].append((e, new, 1))
        changes = {self.schema.get(a).id: self._frame(a, r) for a, r in rows.items()}
        return IntrospectionStep(self, changes, facts, reported)

    def _frame(self, attribute: str, rows: list[tuple[int, Any, int]]) -> pd.DataFrame:
        kind = self.schema.get(attribute).kind
        values = pd.Series([v for _, v, _ in rows], dtype={Kind.LONG: "int64", Kind.DOUBLE: "float64"}.get(kind, object))
        return pd.DataFrame({"e": pd.Series([e for e, _, _ in rows], dtype="int64"), "v": values,
                             DIFF: pd.Series([d for _, _, d in rows], dtype="int64")})

    def _entity(self, kind: str, name: str) -> int:
        return self._ids.setdefault((kind, name), ENTITY_BASE + len(self._ids))

    def _describe_arrangement(self, facts: Facts, name: str, tuples: int, role: str, query: str | None) -> None:
        entity = self._entity("arrangement", name)
        facts[(entity, ":factflow.arrangement/name")] = name
        facts[(entity, ":factflow.arrangement/tuples")] = tuples
        facts[(entity, ":factflow.arrangement/role")] = role
        if query is not None:
            facts[(entity, ":factflow.arrangement/query")] = query
