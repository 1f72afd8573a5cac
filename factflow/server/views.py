"""Read-only views of a server's engine for the ops ``epochs``, ``queries``, ``plan`` and ``state``.

The console (:mod:`factflow.console`) reads what it shows through these ops; any client
may. Each reports what the engine already holds (its epoch reports, installed queries and
their plans, ``Engine.stats()`` and ``Engine.holdings()``), without a Spark job and
without touching a row: they run on the command thread like every op that reads the
engine, and cost it a few milliseconds. A tenant may read only ``queries``, which shows it
the published queries it may join and its own connections' interests in them; the other
views are an admin's (:data:`factflow.server.tenants.TENANT_OPS`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Callable

from factflow.engine.engine import Engine
from factflow.engine.query import Query
from factflow.engine.reports import EpochReport
from factflow.server.interests import Interests, Listener
from factflow.server.lifting import LIFT_PREFIX
from factflow.server.protocol import ProtocolError

__all__ = ["Views", "MAX_EPOCHS"]

#: The most epoch reports one ``epochs`` reply carries.
MAX_EPOCHS = 1000


class Views:
    """The read-only views of one server; ``listeners()`` gives its connected clients."""

    def __init__(self, engine: Engine, interests: Interests, listeners: Callable[[], list[Listener]]):
        self.engine = engine
        self.interests = interests
        self._listeners = listeners
        self._last_change: dict[str, int] = {}  # query -> the latest epoch that changed its result
        self._followed = 0  # epoch reports read into _last_change

    def epochs(self, since: int | None, limit: int) -> dict[str, Any]:
        """The reports of the epochs after ``since`` (all kept ones if None), the latest
        ``limit`` of them (at most :data:`MAX_EPOCHS`), oldest first."""
        log = self.engine.epoch_log
        start = 0 if since is None else bisect.bisect_right(log, since, key=lambda r: r.epoch)
        start = max(start, len(log) - max(0, min(limit, MAX_EPOCHS)))
        return {"epoch": self.engine.epoch, "epochs": [_report(r) for r in log[start:]]}

    def queries(self, listener: Listener) -> dict[str, Any]:
        """Every installed query with what the console lists; a tenant gets the published
        queries it may join, each with its own connections interested in it, and nothing else."""
        published = self.interests.published()
        interested = defaultdict(list)
        for other in self._listeners():
            if not listener.restricted or other.tenant == listener.tenant:
                for name in other.queries.copy():
                    interested[name].append(other.client_id)
        if listener.restricted:
            return {"epoch": self.engine.epoch, "queries": [
                {"name": name, "tenant_routed": p["tenant_routed"], "interested": sorted(interested.get(name, []))}
                for name, p in sorted(published.items())]}
        self._follow()
        stats = self.engine.stats()
        counts = self.interests.counts()
        rows = []
        for name, query in self.engine.queries.items():
            plan = query.plan
            rows.append({
                "name": name, "clients": counts.get(name, 0), "interested": sorted(interested.get(name, [])),
                "rows": stats["result_tuples"].get(name, 0), "intermediate": stats["query_tuples"].get(name, 0),
                "installed_at": query.installed_at, "installed_time": query.installed_time,
                "last_change": self._last_change.get(name), "strategy": str(plan.strategy),
                "joins": [[conjunction, str(strategy)] for conjunction, strategy, _ in plan.strategies if strategy],
                "durable": query.durable, "published": name in published, "lifted": _lifted(query),
                **_source(query)})
        return {"epoch": self.engine.epoch, "queries": rows}

    def plan(self, name: str) -> dict[str, Any]:
        """The plan of the installed query ``name``: its data (``Plan.to_data()``), its
        strategies with their reasons, its ``explain`` text, and whether it is published or
        the dataflow of lifted interests (which clients join by name alone, or not at all)."""
        query = self.engine.queries.get(name)
        if query is None:
            raise ProtocolError("not-found", f"no query named {name!r} is installed")
        plan = query.plan
        return {"name": name, "plan": plan.to_data(), "explain": query.explain(),
                "strategies": [[c, str(s), r] for c, s, r in plan.strategies],
                "published": name in self.interests.published(), "lifted": _lifted(query), **_source(query)}

    def state(self) -> dict[str, Any]:
        """Every arrangement with its rows, batches, bytes and readers (``Engine.holdings()``)."""
        return {"epoch": self.engine.epoch, "arrangements": self.engine.holdings()}

    def _follow(self) -> None:
        """Read the epoch reports not read yet into the latest change of each query."""
        log = self.engine.epoch_log
        for report in log[self._followed:]:
            for name in report.changed:
                self._last_change[name] = report.epoch
        self._followed = len(log)
        installed = self.engine.queries
        self._last_change = {n: e for n, e in self._last_change.items() if n in installed}


def _source(query: Query) -> dict[str, Any]:
    """What a query was installed from (its text, inputs and join) and its columns."""
    source = query.plan.source
    return {"text": source.query if isinstance(source.query, str) else str(source.query),
            "inputs": list(source.inputs), "join": source.join, "columns": query.columns}


def _lifted(query: Query) -> bool:
    """Whether ``query`` is the dataflow of lifted interests (it reads the server's parameters)."""
    return any(str(attribute).startswith(LIFT_PREFIX) for attribute in query.plan.attributes)


def _report(report: EpochReport) -> dict[str, Any]:
    """An epoch report as JSON (query names counted, not listed: an epoch may touch thousands)."""
    return {"epoch": report.epoch, "time": report.time, "seconds": report.seconds, "operations": report.operations,
            "changes": report.changes, "queries": len(report.queries), "changed": len(report.changed),
            "phases": dict(report.phases), "merges": report.merges, "statements": report.statements,
            "plans_reused": report.plans_reused, "analyses_reused": report.analyses_reused,
            "kept_in_spark": list(report.kept_in_spark),
            "rows_read": report.rows_read,
            "jobs": [{"id": j.id, "description": j.description, "tasks": j.tasks, "seconds": j.seconds,
                      "rows_read": j.rows_read, "rows_shuffled": j.rows_shuffled} for j in report.jobs],
            "on_driver": [{"description": r.description, "seconds": r.seconds, "rows_read": r.rows_read}
                          for r in report.on_driver],
            "maintenance_jobs": len(report.maintenance_jobs)}
