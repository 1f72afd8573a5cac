"""What it takes to install a query again: its definition, kept by durable engines.

A query installed with ``durable=True`` on an engine with a ``state_dir`` has its
definition (name, query text, inputs, join strategy, semantics, sinks, granularity,
introspection, slack, and the labels its installer kept with it) logged in the catalog
(see :mod:`factflow.engine.durability`); an engine reopening the directory installs it
again, so the query (and what reads it: subscribers, server clients) continues from the
recovered epoch. Inputs are kept as EDN text, which round-trips every value an input can
hold (numbers, strings, booleans, keywords, instants, collections).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from factflow import edn
from factflow.errors import EdnSyntaxError, QueryError
from factflow.io.sinks import Sink

__all__ = ["QueryDefinition", "labels_of"]


@dataclass(frozen=True)
class QueryDefinition:
    """A query as installed: everything :meth:`factflow.Engine.query` was given."""

    name: str
    text: str
    inputs: tuple[Any, ...]
    join: str
    semantics: str
    sinks: tuple[Sink, ...] = ()
    granularity: float | None = None
    introspect: bool = True
    slack: int = 0
    labels: tuple[tuple[str, str], ...] = ()  # (key, value) pairs, sorted: what the installer keeps with it

    @classmethod
    def of(cls, name: str, text: str, inputs: Sequence[Any], join: str, semantics: str,
           sinks: Sequence[Sink] = (), granularity: float | None = None, introspect: bool = True,
           slack: int = 0, labels: Mapping[str, str] | None = None) -> "QueryDefinition":
        """The definition of a query being installed; raises :class:`QueryError` when an
        input cannot be kept (a value EDN cannot write back)."""
        written = edn.write(list(inputs))
        try:
            kept = tuple(edn.read(written))
        except EdnSyntaxError:
            kept = None
        if kept is None or edn.write(list(kept)) != written:
            raise QueryError(f"the inputs of durable query {name!r} cannot be kept: {written} does not round-trip "
                             "through EDN")
        return cls(name, text, kept, join, semantics, tuple(sinks), granularity, introspect, slack,
                   labels_of(labels))

    def same_settings(self, other: "QueryDefinition") -> bool:
        """Whether both have the same name, sinks, granularity, introspection and slack (whether
        they are the same query is for their plans to say: see :mod:`factflow.planner.plan`)."""
        query = ("text", "inputs", "join", "semantics")
        return ({k: v for k, v in self.to_json().items() if k not in query}
                == {k: v for k, v in other.to_json().items() if k not in query})

    def to_json(self) -> dict:
        """The definition as a JSON object (for log records and checkpoint manifests)."""
        return {"name": self.name, "text": self.text, "inputs": edn.write(list(self.inputs)), "join": self.join,
                "semantics": self.semantics, "granularity": self.granularity, "introspect": self.introspect,
                "slack": self.slack, "labels": dict(self.labels),
                "sinks": [{"path": s.path, "format": s.format, "mode": s.mode} for s in self.sinks]}

    @classmethod
    def from_json(cls, body: dict) -> "QueryDefinition":
        """The definition :meth:`to_json` wrote."""
        return cls(body["name"], body["text"], tuple(edn.read(body["inputs"])), body["join"], body["semantics"],
                   tuple(Sink(**s) for s in body.get("sinks", [])), body.get("granularity"), body.get("introspect", True),
                   body.get("slack", 0), labels_of(body.get("labels")))


def labels_of(labels: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """``labels`` as sorted pairs of strings; :class:`QueryError` for anything else."""
    if not labels:
        return ()
    if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise QueryError(f"labels must map strings to strings, not {labels!r}")
    return tuple(sorted(labels.items()))
