"""Reading traces by key in small epochs: the SQL side of index probes.

Operators that read state by key (a delta pipeline's lookup into an attribute index, a
distinct operator's old counts, a worst-case optimal stage's counts, a join against a
privately arranged input) ask :func:`probe` first. In a small epoch, when the trace holds
a stored batch and the lookup's columns cover the trace's key, the lookup becomes a
probe inside the epoch's Spark statement (:class:`factflow.arrangement.index.Probe`): the
prefix relation is hashed by Spark, handed to the probe as Arrow batches, and the probe's
output is named for the SQL that follows. Otherwise :func:`probe` returns None and the
operator joins as before (a SQL join over the trace's batches, which is what small,
driver-held traces and bulk epochs want).
"""

from __future__ import annotations

from typing import Sequence

from factflow.arrangement.index import PROBE_HASH, TRACE_DIFF, Probe, hash_sql
from factflow.arrangement.trace import TraceHandle
from factflow.dataflow.context import EpochContext
from factflow.model.types import Kind

__all__ = ["probe", "TRACE_DIFF"]


def probe(cx: EpochContext, handle: TraceHandle, prefix: str, prefix_columns: Sequence[tuple[str, Kind]],
          on: Sequence[tuple[str, str]], values: Sequence[tuple[str, str]], as_of: int, how: str = "inner",
          present: bool = False) -> str | None:
    """The relation of ``prefix`` (columns ``prefix_columns`` and ``_diff``) probed against
    ``handle``'s trace as of ``as_of``, or None when a probe does not apply.

    ``on`` pairs prefix columns with the trace columns they must equal; ``values`` names
    trace columns to output (``(trace column, output name)``). Output: per ``how`` (see
    :class:`Probe`), the prefix's columns and ``_diff`` (or, for ``semi``, the matched
    keys), the values, and ``_tdiff``.
    """
    if not cx.probes:
        return None
    trace_of = {p: t for p, t in on}
    by_trace = {t: p for p, t in on}
    if any(k not in by_trace for k in handle.key):
        return None
    sources = handle.probe_sources(as_of)
    if sources is None:
        return None
    paths, local = sources
    columns = list(prefix_columns) + [("_diff", Kind.LONG)]
    spec = Probe(paths=paths, local=local, trace_schema=handle.layout.arrow_schema(), prefix_columns=columns,
                 hash_on=[(by_trace[k], k) for k in handle.key], join_on=[(p, trace_of[p]) for p, _ in on],
                 values=list(values), as_of=as_of, how=how, present=present)
    hashed = cx.frame(f"(SELECT *, {hash_sql([by_trace[k] for k in handle.key])} AS {PROBE_HASH} FROM {prefix})")
    return cx.register(spec.run(hashed))
