"""An installed query's dataflow: its plan, bound to what installing allocated for it."""

from __future__ import annotations

from factflow.dataflow.nodes import Stateful
from factflow.planner.holdings import Holdings
from factflow.planner.plan import Plan
from factflow.planner.shared import SharedRule

__all__ = ["Dataflow"]


class Dataflow:
    """A query installed from ``plan`` under ``name``: its operators (bound to the handles,
    traces and views in ``holdings``), and the shared rules it reads."""

    def __init__(self, plan: Plan, name: str, holdings: Holdings):
        self.plan = plan
        self.name = name
        self.holdings = holdings
        self.result = plan.result
        self.find = plan.find
        self.find_kind = plan.find_kind
        self.decoders = plan.decoders
        self.strategy = plan.strategy
        self.requested_strategy = plan.requested_strategy
        self.semantics = plan.semantics
        self.pulls = plan.pulls
        self.nodes = plan.nodes
        self.stateful = plan.stateful
        self.attributes = plan.attributes

    def pull_nodes(self) -> list[Stateful]:
        """The stateful operators of every pull stage (see :mod:`factflow.planner.pull`)."""
        return self.plan.pull_nodes()

    def outputs(self, subscribed: bool) -> list[Stateful]:
        """The operators whose changes an epoch must fetch for this query: the result when
        someone subscribes; with pulls, the result and every stage (their rows on the driver
        are kept up to date whether or not anyone subscribes)."""
        if self.pulls:
            return [self.result, *self.pull_nodes()]
        return [self.result] if subscribed else []

    @property
    def report_columns(self) -> list[str]:
        """Result columns in :find order."""
        return [col for _, col in self.find]

    def tuples(self, role: str) -> int:
        """Rows held in this query's private traces of ``role`` ('intermediate' or 'result')."""
        return sum(t.tuples for t, r in self.holdings.traces if r == role)

    def private_traces(self):
        """(trace, role) pairs private to this query."""
        return list(self.holdings.traces)

    def handles(self):
        """Every trace handle the query holds (those of the shared rules it reads not included)."""
        return list(self.holdings.handles)

    def shared_rules(self) -> list[SharedRule]:
        """The shared rules the query reads (see :mod:`factflow.planner.shared`)."""
        return list(self.plan.shared)

    def explain(self) -> str:
        """A readable description of the plan."""
        return self.plan.explain(self.name)

    def close(self) -> None:
        """Release every handle, private trace and view (shared rules are released by the
        engine when their last reader closes)."""
        self.holdings.release()
