"""Temp views: how relations held by Spark are named in factflow's SQL.

A view is *lasting* when it outlives the statement group that registered it (a stored
batch's, a query's constant relation): plans kept across epochs may read it until it is
dropped (see :mod:`factflow.arrangement.bound`).
"""

from __future__ import annotations

import itertools
import threading

from pyspark.sql import DataFrame, SparkSession

__all__ = ["register_view", "drop_view", "lasting_views", "one_partition", "PROBE_VIEW_PREFIX",
           "PARAMETERIZED_PROBE_PREFIX"]

#: how the views an evaluation registers for its probes are named (``EpochContext.register``)
PROBE_VIEW_PREFIX = "ff_q"
#: how a parameterized probe's view is named: for its definition, not in order
#: (:meth:`factflow.arrangement.bound.Binder.probe_view`)
PARAMETERIZED_PROBE_PREFIX = "ff_qp"

_VIEW_IDS = itertools.count(1)
_LASTING: set[str] = set()
_LOCK = threading.Lock()


def register_view(frame: DataFrame, prefix: str = "ff_b", lasting: bool = False) -> str:
    """Register ``frame`` as a uniquely named temp view; returns the name. ``lasting``: the
    view outlives the statement group registering it (see the module docstring)."""
    name = f"{prefix}{next(_VIEW_IDS)}"
    frame.createOrReplaceTempView(name)
    if lasting:
        with _LOCK:
            _LASTING.add(name)
    return name


def drop_view(spark: SparkSession, name: str) -> None:
    """Drop a temp view registered by :func:`register_view`."""
    with _LOCK:
        _LASTING.discard(name)
    spark.catalog.dropTempView(name)


def lasting_views() -> frozenset[str]:
    """The lasting views registered and not dropped yet."""
    with _LOCK:
        return frozenset(_LASTING)


def one_partition(relation: str) -> str:
    """SQL reading ``relation`` (a view name or a parenthesized subquery) as one partition,
    without a shuffle (a ``COALESCE(1)`` hint): how small relations enter a statement."""
    return f"(SELECT /*+ COALESCE(1) */ * FROM {relation})"
