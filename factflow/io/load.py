"""Loading any Spark source as facts, in one epoch: one column per attribute, one for the entity.

``db.load(path, format="csv", entity="id", attributes={":person/name": "name"}, options={...})``
reads ``path`` with ``spark.read.format(format).options(**options).load(path)`` (or takes a
Spark DataFrame given instead of a path), converts the
entity column to entity ids and each mapped column to its attribute's type
(:func:`~factflow.model.types.typed_column`), and checks every conversion in one Spark job: a value that does not
convert rejects the load (:class:`LoadError` naming the attribute, the column, how many
rows, and an example value with its entity), as does a missing or non-integer entity id
(naming an example). Rows are named by their entity, not by their position: a source
Spark reads has no row order it keeps across jobs (files are listed and split in any
order), and numbering the rows would cost a pass over all of them. NULL cells are
skipped (no fact). The typed columns are then unpivoted by Spark into the transaction's
wide form (:class:`~factflow.engine.transaction.WideFrame`: attribute, entity and each
value in the column of its type), which one :meth:`Engine.transact` applies without
converting or checking the values again: one epoch, all or nothing. ``added=False``
retracts the facts instead (a table's rows removed by the rows themselves).

A load costs Spark jobs, not driver work per value: the check, one pass computing the
effective changes of every attribute at once, and one job per attribute arranging its
changes (``benchmarks/tpch_stream.py`` measures it on TPC-H's tables).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from factflow.engine.session import label_jobs
from factflow.engine.transaction import SLOT, WideFrame
from factflow.errors import LoadError, UnknownAttributeError
from factflow.model.schema import Attribute
from factflow.model.types import Kind, ident, sql_type, typed_column
from factflow.text import plural

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.engine import Engine

__all__ = ["LoadReport", "load"]

#: columns of the frame :func:`load` checks and unpivots: the entity id as given and as
#: converted, and per mapped column ``i`` its value as given and as converted (SQL text over
#: these names is one call into Spark; building the same from Column objects took thousands)
_RAW_ENTITY, _ENTITY, _RAW, _TYPED = "_raw_e", "_e", "_raw", "_typed"


@dataclass
class LoadReport:
    """What :meth:`Engine.load` applied: the ``epoch``, the ``rows`` read, per attribute the
    values given (``facts``; its effective changes may be fewer, e.g. facts already present)
    and the ``seconds`` it took."""

    epoch: int
    rows: int
    facts: dict[str, int]
    seconds: float


def _column(frame: DataFrame, name: str, path: str) -> tuple[Column, T.DataType]:
    """The column called ``name`` (dots and all) and its type; LoadError if there is none."""
    if name not in frame.columns:
        raise LoadError(f"load {path}: no column {name!r} (columns: {', '.join(frame.columns)})")
    return F.col(ident(name)), frame.schema[name].dataType


def load(db: "Engine", path: str | Sequence[str] | DataFrame, format: str = "csv", entity: str = "id",
         attributes: Mapping[str, str] | None = None, options: Mapping[str, str] | None = None,
         added: bool = True) -> LoadReport:
    """Read ``path`` with Spark's reader for ``format`` (and ``options``), or take the Spark
    DataFrame given as ``path``, and apply, in one epoch, a fact ``[row[entity] attribute
    row[column]]`` per ``attribute: column`` of ``attributes`` and per row whose cell is not
    NULL (retracted instead when ``added`` is false); see the module docstring."""
    started = time.perf_counter()
    spark = db.spark
    what = "a DataFrame" if isinstance(path, DataFrame) else path
    if not attributes:
        raise LoadError(f"load {what}: no attributes given (map attribute names to columns)")
    resolved = []
    for name, column in attributes.items():
        try:
            resolved.append((db.schema.get(name), column))
        except UnknownAttributeError as exc:
            raise LoadError(f"load {what}: {exc}") from exc
    label_jobs(spark.sparkContext, "factflow-load", f"factflow load {what}")
    if isinstance(path, DataFrame):
        frame = path
    else:
        try:
            frame = spark.read.format(format).options(**{k: str(v) for k, v in (options or {}).items()}).load(path)
        except AnalysisException as exc:
            raise LoadError(f"load {path}: Spark cannot read it as {format}: {str(exc).splitlines()[0]}") from None
    raw_e, e_type = _column(frame, entity, what)
    columns = [raw_e.alias(_RAW_ENTITY), typed_column(raw_e, e_type, "ref").alias(_ENTITY)]
    for i, (attribute, name) in enumerate(resolved):
        raw, source = _column(frame, name, what)
        columns += [raw.alias(f"{_RAW}{i}"), typed_column(raw, source, attribute.value_type).alias(f"{_TYPED}{i}")]
    typed = frame.select(*columns)
    spark.sparkContext.setJobDescription(f"load {what}: check {plural(len(resolved), 'column')}")
    summary = typed.selectExpr(*_checks(len(resolved))).first()
    if summary["e_bad"]:
        raise LoadError(f"load {what}: entity column {entity!r}: {plural(summary['e_bad'], 'row')} with a missing "
                        f"or non-integer entity id, e.g. {summary['e_example']!r}")
    errors = [f"{attribute.name} (column {name!r}): {plural(summary[f'bad{i}'], 'row')} not convertible to "
              f"{attribute.value_type}, e.g. {summary[f'example{i}']['value']!r} (entity "
              f"{summary[f'example{i}']['entity']})"
              for i, (attribute, name) in enumerate(resolved) if summary[f"bad{i}"]]
    if errors:
        raise LoadError(f"load {what} rejected, nothing applied: {'; '.join(errors)}")
    facts = {str(a.name): summary[f"n{i}"] for i, (a, _) in enumerate(resolved)}
    epoch = db.transact(WideFrame(_wide(typed, [a for a, _ in resolved], added), [a for a, _ in resolved],
                                  sum(facts.values())))
    return LoadReport(epoch, summary["rows"], facts, time.perf_counter() - started)


def _checks(columns: int) -> list[str]:
    """Aggregates over :func:`load`'s typed frame: its rows, the entity ids and values that
    did not convert, and an example of each."""
    checks = ["count(1) AS rows", f"count(CASE WHEN {_ENTITY} IS NULL THEN 1 END) AS e_bad",
              f"first(CASE WHEN {_ENTITY} IS NULL THEN coalesce(CAST({_RAW_ENTITY} AS STRING), 'null') END, true) "
              "AS e_example"]
    for i in range(columns):
        bad = f"{_RAW}{i} IS NOT NULL AND {_TYPED}{i} IS NULL"
        checks += [f"count({_RAW}{i}) AS n{i}", f"count(CASE WHEN {bad} THEN 1 END) AS bad{i}",
                   f"first(CASE WHEN {bad} THEN named_struct('value', CAST({_RAW}{i} AS STRING), 'entity', {_ENTITY}) "
                   f"END, true) AS example{i}"]
    return checks


def _wide(typed: DataFrame, attributes: list[Attribute], added: bool) -> DataFrame:
    """The facts of :func:`load`'s typed frame in the transaction's wide form: per row, one
    row per non-NULL typed cell, with its attribute's id and the value in the column of its kind."""
    cells = []
    for i, attribute in enumerate(attributes):
        slots = ", ".join(f"'{SLOT[k]}', CAST({f'{_TYPED}{i}' if k is attribute.kind else 'NULL'} AS {sql_type(k)})"
                          for k in Kind)
        cells.append(f"CASE WHEN {_TYPED}{i} IS NOT NULL THEN named_struct('a', CAST({attribute.id} AS INT), {slots}) END")
    return (typed.selectExpr(f"{_ENTITY} AS e", f"explode(array_compact(array({', '.join(cells)}))) AS f")
            .selectExpr("f.a", "e", f"CAST({1 if added else -1} AS INT) AS op", *(f"f.{SLOT[k]}" for k in Kind)))
