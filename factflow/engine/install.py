"""Installing a query (interest): allocating its plan and computing its state as of the closed epoch.

Planning (:func:`factflow.planner.synthesis.plan_query`) allocates nothing; installing a
plan allocates its slots (:mod:`factflow.engine.allocation`): handles on the shared
arrangements as of the closed epoch ``t``, private traces, views of constant relations,
and the shared rules the plan creates. Its stateful operators are then evaluated once
from that state, and from then on maintained by every epoch that changes an attribute it
reads. Over state of at most ``EngineConfig.local_limit`` rows in all (the traces the
query reads) that evaluation runs as a small epoch's does: each round one statement in one
partition, fetched to the driver with one job and appended as local batches; over more,
every stateful operator is checkpointed in Spark. A rule relation another query already
maintains (see :mod:`factflow.planner.shared`) is not computed again: the new dataflow
reads its maintained state. A query that reuses no maintained rule has nothing to compute
when none of its stateful operators can get a row (:func:`produces_nothing`): every path to
each from a constant relation (an input, a literal collection, a ``ground`` value) or from
an attribute with rows passes through a join with an attribute without rows (a join with
nothing has no rows), not only through unions or the left sides of negations. Such a query
is installed without a Spark job: the 22 TPC-H queries, installed on tables without rows,
took 41-48 s when each was evaluated, 22-24 s when only those reading no constant skipped
it (the six joining a literal collection or a ``ground`` value took 1.6-7 s each), and now
about a second in all. A query that fails to install leaves nothing behind.
"""

from __future__ import annotations

from factflow.dataflow.context import EpochContext
from factflow.dataflow.nodes import Node
from factflow.engine.allocation import Allocation
from factflow.engine.dataflow import Dataflow
from factflow.engine.session import label_jobs
from factflow.engine.state import EngineState
from factflow.errors import QueryError
from factflow.planner.holdings import Holdings
from factflow.planner.plan import Plan

__all__ = ["install", "produces_nothing"]


def install(state: EngineState, plan: Plan, name: str, group_prefix: str) -> Dataflow:
    """Install ``plan`` as the query ``name`` (checked free by the caller) and compute its
    state as of ``state.epoch``, with jobs in the group ``<group_prefix>-<name>``.

    Returns the dataflow, its handles advanced to the epoch and its shared rules committed;
    registering the query, and the maintenance of the traces it filled (merges, index
    files: see :mod:`factflow.engine.maintenance`), are the caller's. A QueryError, allocating nothing, for a plan
    installed already or one whose shared rules the registry no longer matches (plan again).
    """
    if plan.result.writer is not None:
        raise QueryError(f"query {name}: its plan is installed already; plan the query again")
    stale = next((e for e in plan.shared if not state.shared.current(e)), None)
    if stale is not None:
        raise QueryError(f"query {name}: {stale.name} has been installed or released since the query was "
                         "planned; plan the query again")
    holdings = Holdings(state.spark)
    allocation = Allocation(state, name, holdings, [e for e in plan.shared if not e.installed])
    label_jobs(state.spark.sparkContext, f"{group_prefix}-{name}", f"install query {name}")
    try:
        allocation.bind(plan)
        dataflow = Dataflow(plan, name, holdings)
        handles, traces = state.held_by([dataflow])
        held = sum(h.tuples for h in handles) + sum(t.tuples for t in traces)
        reused = [e for e in dataflow.shared_rules() if e.installed]
        if not reused and produces_nothing(plan):
            for trace in traces:  # what an evaluation appending no rows records
                trace.advance_upper(state.epoch + 1)
        else:
            cx = EpochContext(state.epoch, state.spark, install=True, small=held <= state.config.local_limit)
            for entry in reused:
                entry.present_as_installed(cx)
            state.evaluate([dataflow], cx, subscribed=set(), settled=[n for e in reused for n in e.stateful()])
    except BaseException:
        allocation.release()
        raise
    state.shared.commit(name, dataflow.shared_rules())
    for h in handles:
        h.advance(state.epoch)
    return dataflow


def produces_nothing(plan: Plan) -> bool:
    """Whether no stateful operator of ``plan`` (its traces new) can get rows when it is
    installed over what its patterns' attributes hold now, so that the install has nothing
    to compute: its constants and the attributes with rows reach none of them but through
    joins with attributes without rows. Each operator judges itself from its inputs
    (:meth:`~factflow.dataflow.nodes.Node.empty_when_installed`): a pattern is empty if its
    attribute has no rows, a join if any side is, a union if every part is, a negation if
    its left side is, a per-row or stateful operator if its input is, a recursive component
    if every body is with its recursive references empty; a constant relation, or an
    operator that does not say, is not."""
    known: dict[int, bool] = {}

    def empty(node: Node) -> bool:
        if id(node) not in known:
            known[id(node)] = False  # a cycle (recursion reaches its fixpoint again) is not proven empty
            known[id(node)] = node.empty_when_installed(empty)
        return known[id(node)]

    return all(empty(n) for n in plan.stateful)
