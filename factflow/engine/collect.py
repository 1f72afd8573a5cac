"""Collecting many differently shaped relations with a single Spark job.

Every relation is mapped onto one wide schema (a tag column plus typed slots per kind),
the relations are unioned, and the union is fetched once as Arrow. The driver then cuts
the Arrow table back into one pandas frame per input, with the original column names and
exact types (Arrow keeps 64-bit integers exact where pandas would turn nullable ones
into floats).

What one fetch brings to the driver is bounded in rows: every relation gets an equal
share of the limit and is read through ``LIMIT share + 1`` inside the statement, so a
relation with more rows sends one row more than its share (Spark stops producing its
rows there) and is reported as over the limit instead of being returned. Each relation
has its own limit, rather than one limit over the union, so that the caller knows which
relations to keep in Spark, and because Spark plans a relation's limit as a limit per
partition followed by a global one, which needs no exchange for a relation a small
statement computes in one partition (what a shuffle with one partition yields): the
fetch stays one job with the stages it had, where a limit over the union adds an
exchange into one partition, a stage, to every fetch. The bound holds where Spark's own
``spark.driver.maxResultSize`` cannot: that is checked on the driver once a task's
result has arrived, too late when one task's result is larger than the driver's heap.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from factflow.arrangement import bound
from factflow.dataflow.context import EpochContext
from factflow.dataflow.zset import ident
from factflow.model.types import Kind, sql_type

__all__ = ["Collector"]

_TAG = "_tag"
_PREFIX = {Kind.LONG: "l", Kind.DOUBLE: "d", Kind.STRING: "s", Kind.BOOLEAN: "b", Kind.INSTANT: "t"}


class Collector:
    """Gathers relations to fetch together; ``run`` returns them as pandas frames, in order."""

    def __init__(self) -> None:
        self._items: list[tuple[str, tuple[tuple[str, Kind], ...]]] = []

    def add(self, relation: str, columns: Sequence[tuple[str, Kind]]) -> int:
        """Queue a relation (with exactly ``columns``); returns its position in the result."""
        self._items.append((relation, tuple(columns)))
        return len(self._items) - 1

    def __len__(self) -> int:
        return len(self._items)

    def run(self, spark: SparkSession, cx: EpochContext, limit: int,
            description: str = "collect") -> list[pd.DataFrame | None]:
        """Fetch every queued relation (named in ``cx``) in one Spark job, at most ``limit``
        rows in all: a relation with more than ``limit // len(self)`` rows (at least 1) is
        None in the result, its rows left in Spark."""
        if not self._items:
            return []
        share = max(limit // len(self._items), 1)
        width: dict[Kind, int] = {}
        for _, columns in self._items:
            counts: dict[Kind, int] = {}
            for _, kind in columns:
                counts[kind] = counts.get(kind, 0) + 1
            for kind, n in counts.items():
                width[kind] = max(width.get(kind, 0), n)
        slots = [(f"{_PREFIX[k]}{i}", k) for k in Kind for i in range(width.get(k, 0))]
        wide = []
        mappings = []
        for tag, (relation, columns) in enumerate(self._items):
            used: dict[Kind, int] = {}
            mapping: dict[str, str] = {}
            for name, kind in columns:
                i = used.get(kind, 0)
                used[kind] = i + 1
                mapping[f"{_PREFIX[kind]}{i}"] = name
            mappings.append(mapping)
            exprs = [f"{tag} AS {_TAG}"]
            for slot, kind in slots:
                source = ident(mapping[slot]) if slot in mapping else "NULL"
                exprs.append(f"CAST({source} AS {sql_type(kind)}) AS {slot}")
            wide.append(f"SELECT {', '.join(exprs)} FROM (SELECT * FROM {relation} LIMIT {share + 1})")
        spark.sparkContext.setJobDescription(description)
        table = bound.run(spark, cx.statement(" UNION ALL ".join(f"({w})" for w in wide)), cx.persist_shared)
        out = []
        tags = table.column(_TAG)
        for tag, mapping in enumerate(mappings):
            part = table.filter(pc.equal(tags, pa.scalar(tag, tags.type))) if len(mappings) > 1 else table
            names = list(mapping)
            if part.num_rows > share:
                out.append(None)
                continue
            part = part.select(names).rename_columns([mapping[n] for n in names])
            out.append(part.to_pandas())
        return out
