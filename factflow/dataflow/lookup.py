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

A lookup that multiplies the diffs of prefix and trace rows (:func:`probe_product`: a
delta pipeline's lookups and validations, a join against an arranged input) is recorded
with the evaluation; a lookup whose prefix is such a product, keyed by LONG columns, joins
the probe that made it in one :class:`factflow.arrangement.index.ProbeChain`, so that a
pipeline's lookups run in one Python worker, rows between them never passing through Spark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import pandas as pd
from pyspark.sql import types as T

from factflow.arrangement import bound
from factflow.arrangement.batch import DIFF
from factflow.arrangement.index import (PROBE_HASH, PROBE_PARAMETERS, PROBE_PART, TRACE_DIFF, ParameterizedProbes,
                                        Probe, ProbeChain, Probes, TaggedProbes, hash_sql, partition_hash_sql)
from factflow.arrangement.trace import TraceHandle
from factflow.dataflow import zset
from factflow.dataflow.context import EpochContext
from factflow.dataflow.zset import ident
from factflow.model.types import Kind

__all__ = ["probe", "probe_product", "probe_tagged", "TRACE_DIFF"]

_PARAMETERS_SCHEMA = T.StructType([T.StructField(PROBE_PARAMETERS, T.BinaryType(), True)])

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame


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
    spec = _spec(cx, handle, prefix_columns, on, values, as_of, how, present)
    return None if spec is None else _run(cx, ProbeChain([spec]), _hashed(prefix, spec))


def probe_product(cx: EpochContext, handle: TraceHandle, prefix: str, prefix_columns: Sequence[tuple[str, Kind]],
                  on: Sequence[tuple[str, str]], values: Sequence[tuple[str, str]], as_of: int,
                  present: bool = False) -> str | None:
    """``prefix`` joined with ``handle``'s trace as of ``as_of`` by a probe, as a Z-set:
    the prefix's columns, the values' output names, and ``_diff``, the product of the prefix
    row's and the trace row's diffs; None when a probe does not apply (see :func:`probe`
    for ``on``, ``values`` and ``present``). When ``prefix`` is itself such a product (of this
    evaluation), the probe continues the chain that made it."""
    spec = _spec(cx, handle, prefix_columns, on, values, as_of, "inner", present)
    if spec is None:
        return None
    before = cx.chains.get(prefix)
    if before is not None and spec.hashes_in_task():
        source, chain = before[0], before[1].then(spec)
    else:
        source, chain = _hashed(prefix, spec), ProbeChain([spec])
    names = [n for n, _ in prefix_columns] + [out for _, out in values]
    product = cx.define(zset.select(_run(cx, chain, source), names, diff=f"{ident(DIFF)} * {ident(TRACE_DIFF)}"))
    cx.chains[product] = (source, chain)
    return product


def probe_tagged(cx: EpochContext, prefix: str, tag: str, key: str, handles: dict[int, TraceHandle], value: str,
                 columns: dict[int, str], value_columns: Sequence[tuple[str, Kind]],
                 as_of: int) -> tuple[str | None, set[int]]:
    """The rows of ``prefix`` (columns ``tag``, ``key``, a LONG, and ``_diff``) whose tag is
    ``t`` looked up by ``key`` in ``handles[t]``'s trace as of ``as_of``, each trace's column
    ``value`` going to output column ``columns[t]``, every handle a probe applies to in one
    Python worker (:class:`factflow.arrangement.index.TaggedProbes`). Returns the relation
    (``tag``, ``key``, ``value_columns``, ``_tdiff``) and the tags it covers: (None, no
    tags) when a probe applies to none."""
    specs = {t: spec for t, handle in handles.items()
             if (spec := _spec(cx, handle, [(key, Kind.LONG)], [(key, key)], [(value, value)], as_of, "semi",
                               False)) is not None}
    if not specs:
        return None, set()
    probes = TaggedProbes(specs, tag, {t: columns[t] for t in specs}, list(value_columns))
    return _run(cx, probes, _hashed(prefix, next(iter(specs.values())))), set(specs)


def _spec(cx: EpochContext, handle: TraceHandle, prefix_columns: Sequence[tuple[str, Kind]],
          on: Sequence[tuple[str, str]], values: Sequence[tuple[str, str]], as_of: int, how: str,
          present: bool) -> Probe | None:
    """The probe of ``handle``'s trace, or None when a probe does not apply: outside small
    epochs, when ``on`` does not cover the trace's key, or when the trace has no stored batch."""
    if not cx.probes:
        return None
    trace_of = {p: t for p, t in on}
    by_trace = {t: p for p, t in on}
    if any(k not in by_trace for k in handle.key):
        return None
    sources = handle.probe_sources(as_of)
    if sources is None:
        return None
    files, local = sources
    columns = list(prefix_columns) + [("_diff", Kind.LONG)]
    return Probe(files=files, local=local, trace_schema=handle.layout.arrow_schema(), prefix_columns=columns,
                 hash_on=[(by_trace[k], k) for k in handle.key], join_on=[(p, trace_of[p]) for p, _ in on],
                 values=list(values), as_of=as_of, how=how, present=present, cache_bytes=handle.cache_bytes)


def _hashed(prefix: str, spec: Probe) -> str:
    """``prefix`` with ``_ph`` and ``_pp``, the hashes of the probe's key columns that index
    files are sorted and partitioned by, computed by Spark."""
    keys = [p for p, _ in spec.hash_on]
    return f"(SELECT *, {hash_sql(keys)} AS {PROBE_HASH}, {partition_hash_sql(keys)} AS {PROBE_PART} FROM {prefix})"


def _run(cx: EpochContext, probes: Probes, source: str) -> str:
    """The view of ``probes`` over the relation ``source`` (hashed, see :func:`_hashed`).

    While a binder is active (a small epoch that keeps its plans, see
    :mod:`factflow.arrangement.bound`) and the relations are read as one partition, the
    probes are parameterized (:class:`~factflow.arrangement.index.ParameterizedProbes`):
    their parameters are bound to the binder's next slot and their view is the binder's,
    named for its definition, so that statements reading it can be kept and run again in
    later epochs. (Their input is one partition; a step spread over the session's partitions
    keeps its probes as they were.)"""
    binder = bound.current()
    if binder is None or not cx.single_partition:
        return cx.register(probes.run(cx.frame(source)))
    parameters = binder.relation(pd.DataFrame({PROBE_PARAMETERS: [ParameterizedProbes.parameters_of(probes)]}),
                                 _PARAMETERS_SCHEMA)
    parameterized = ParameterizedProbes.of(probes)
    text = cx.view_statement(f"SELECT * FROM {source}")

    def build() -> "DataFrame":
        rows = cx.spark.sql(f"SELECT * FROM {parameters}").unionByName(cx.spark.sql(text), allowMissingColumns=True)
        return parameterized.run(rows.coalesce(1))

    view, frame = binder.probe_view(f"{parameterized!r}\n{parameters}\n{text}", build)
    return cx.reads_probe(view, frame)
