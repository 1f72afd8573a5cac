"""Installing a query (interest): planning its dataflow and computing its state as of the closed epoch.

A query installed at epoch ``t`` reads the shared arrangements as of ``t``: its stateful
operators are evaluated once from that state (checkpointed in Spark), and from then on
maintained by every epoch that changes an attribute it reads. A rule relation another query
already maintains (see :mod:`factflow.planner.shared`) is not computed again: the new
dataflow reads its maintained state. A query that fails to plan or install leaves nothing
behind.
"""

from __future__ import annotations

from typing import Any, Sequence

from factflow.dataflow.context import EpochContext
from factflow.engine.state import EngineState
from factflow.errors import QueryError
from factflow.lang.parser import parse_query
from factflow.lang.rules import RuleStore
from factflow.planner.context import PlanContext
from factflow.planner.synthesis import Dataflow, synthesize

__all__ = ["install"]


def install(state: EngineState, rules: RuleStore, group_prefix: str, query: str, name: str | None,
            inputs: Sequence[Any], join: str, semantics: str) -> Dataflow:
    """Plan ``query`` (named ``name``, or the next free ``q<n>``) and compute its state as of
    ``state.epoch``, with jobs in the group ``<group_prefix>-<name>``.

    Returns the dataflow (named as the query), its handles advanced to the epoch and its
    shared rules committed; registering the query is the caller's.
    """
    if semantics not in ("set", "multiset"):
        raise QueryError(f"semantics must be 'set' or 'multiset', not {semantics!r}")
    name = state.query_name(name)
    parsed = parse_query(query)
    pc = PlanContext(state.spark, state.schema, state.arrangement_of, rules, name, state.epoch,
                     state.policy, semantics, shared_rules=state.shared)
    state.spark.sparkContext.setJobGroup(f"{group_prefix}-{name}", f"install query {name}", interruptOnCancel=False)
    try:
        dataflow = synthesize(parsed, tuple(inputs), pc, join)
        cx = EpochContext(state.epoch, state.spark, install=True)
        reused = [e for e in dataflow.shared_rules() if e.installed]
        for entry in reused:
            entry.present_as_installed(cx)
        state.evaluate([dataflow], cx, subscribed=set(), settled=[n for e in reused for n in e.stateful()])
        handles, traces = state.held_by([dataflow])
        for trace in traces:
            trace.maintain()
    except BaseException:
        pc.release()
        raise
    state.shared.commit(name, dataflow.shared_rules())
    for h in handles:
        h.advance(state.epoch)
    return dataflow
