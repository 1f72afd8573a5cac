"""Loading any Spark source as facts, in one epoch: one column per attribute, one for the entity.

``db.load(path, format="csv", entity="id", attributes={":person/name": "name"}, options={...})``
reads ``path`` with ``spark.read.format(format).options(**options).load(path)`` (or takes a
Spark DataFrame given instead of a path), converts the
entity column to entity ids and each mapped column to its attribute's type
(:func:`~factflow.model.types.typed_sql`), and checks every conversion: a value that does not
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

A load costs Spark jobs, not driver work per value, and few calls into Spark: the rows'
conversion, check and unpivot are SQL text over the source (a temp view, or for
:mod:`factflow.io.tables`' small pandas frames the driver's rows, bound to slots whose
statement's plan the engine keeps for the next load of the same tables), not columns built
a function at a time. A small one (at most ``EngineConfig.local_limit`` facts and rows: an
order with its line items) is checked and fetched to the driver in one statement, then
applied as a small transaction; a statement over rows the driver holds (a pandas frame's)
runs there without a Spark job (:func:`~factflow.arrangement.bound.collected`), one over
a Spark source runs one job. A larger one costs that job (which stops at the limit), the
check over all rows, one pass computing the effective changes of every attribute at
once, and one job per attribute arranging its changes (``benchmarks/tpch_stream.py``
measures it on TPC-H's tables).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from factflow.arrangement import bound
from factflow.arrangement.bound import collected
from factflow.arrangement.views import drop_view, register_view
from factflow.engine.session import label_jobs
from factflow.engine.transaction import SLOT, TX_SCHEMA, WideFrame, WideOps
from factflow.errors import LoadError, UnknownAttributeError
from factflow.model.frames import in_session
from factflow.model.schema import Attribute
from factflow.model.types import Kind, ident, sql_type, typed_sql
from factflow.text import plural

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.engine import Engine

__all__ = ["LoadReport", "load", "load_relation"]

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


def _column(schema: T.StructType, name: str, path: str) -> tuple[str, T.DataType]:
    """The column called ``name`` (dots and all) as SQL, and its type; LoadError if there is none."""
    if name not in schema.names:
        raise LoadError(f"load {path}: no column {name!r} (columns: {', '.join(schema.names)})")
    return ident(name), schema[name].dataType


def _resolved(db: "Engine", attributes: Mapping[str, str] | None, what: str) -> list[tuple[Attribute, str]]:
    """``attributes`` (``{attribute: column}``) with each attribute looked up in the schema."""
    if not attributes:
        raise LoadError(f"load {what}: no attributes given (map attribute names to columns)")
    resolved = []
    for name, column in attributes.items():
        try:
            resolved.append((db.schema.get(name), column))
        except UnknownAttributeError as exc:
            raise LoadError(f"load {what}: {exc}") from exc
    return resolved


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
    _resolved(db, attributes, what)  # an unknown attribute is refused before anything is read
    label_jobs(spark.sparkContext, "factflow-load", f"factflow load {what}")
    if isinstance(path, DataFrame):
        frame = path
    else:
        try:
            frame = spark.read.format(format).options(**{k: str(v) for k, v in (options or {}).items()}).load(path)
        except AnalysisException as exc:
            raise LoadError(f"load {path}: Spark cannot read it as {format}: {str(exc).splitlines()[0]}") from None
    view = register_view(in_session(frame, spark), "ff_load")
    try:
        return load_relation(db, view, frame.schema, what, entity, attributes, added, started)
    finally:
        drop_view(spark, view)


def load_relation(db: "Engine", relation: str, schema: T.StructType, what: str, entity: str,
                  attributes: Mapping[str, str], added: bool = True, started: float | None = None,
                  driver_rows: int | None = None) -> LoadReport:
    """:func:`load` of the rows of ``relation`` (SQL: a view's name or a parenthesized
    subquery) of Spark schema ``schema``, named ``what`` in errors; ``started`` (a
    ``time.perf_counter()``) is when the load began, for its report. ``driver_rows``: how
    many rows the relation has when the driver holds them all (written into it or bound:
    then a small load's fetch needs no limit, and runs on the driver without a Spark job,
    from a kept plan when a binder is active)."""
    started = time.perf_counter() if started is None else started
    spark = db.spark
    resolved = _resolved(db, attributes, what)
    label_jobs(spark.sparkContext, "factflow-load", f"factflow load {what}")
    raw_e, e_type = _column(schema, entity, what)
    columns = [f"{raw_e} AS {_RAW_ENTITY}", f"{typed_sql(raw_e, e_type, 'ref')} AS {_ENTITY}"]
    for i, (attribute, name) in enumerate(resolved):
        raw, source = _column(schema, name, what)
        columns += [f"{raw} AS {_RAW}{i}", f"{typed_sql(raw, source, attribute.value_type)} AS {_TYPED}{i}"]
    typed = f"(SELECT {', '.join(columns)} FROM {relation})"
    attributes_loaded = [a for a, _ in resolved]
    spark.sparkContext.setJobDescription(f"load {what}: check and fetch {plural(len(resolved), 'column')} if small")
    bounded = driver_rows is not None and driver_rows * (len(resolved) + 1) <= db.config.local_limit
    fetched = _fetch_if_small(spark, typed, attributes_loaded, added, None if bounded else db.config.local_limit)
    if fetched is None:
        spark.sparkContext.setJobDescription(f"load {what}: check {plural(len(resolved), 'column')}")
        summary = spark.sql(f"SELECT {', '.join(_checks(len(resolved)))} FROM {typed}").first()
    else:
        summary = _summary(fetched, len(resolved))
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
    if fetched is None:
        tx: WideFrame | WideOps = WideFrame(spark.sql(_wide(typed, attributes_loaded, added)), attributes_loaded,
                                            sum(facts.values()))
    else:
        cells = fetched.filter(pc.equal(fetched.column("k"), _FACT)).select(TX_SCHEMA.names)
        tx = WideOps(cells.to_pandas(integer_object_nulls=True), attributes_loaded)
    epoch = db.transact(tx)
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


#: what a row of :func:`_fetch_if_small`'s frame is: a fact, a value that did not convert, a source row
_FACT, _BAD, _ROW = 0, 1, 2


def _fetch_if_small(spark: SparkSession, typed: str, attributes: list[Attribute], added: bool,
                    local_limit: int | None) -> pa.Table | None:
    """:func:`load`'s check and its facts in one statement (``typed``: SQL of the converted
    rows), when they are few (``local_limit`` None: they are known to be): per source row one
    row of kind ``_ROW`` (``raw``: the entity as given when it did not convert), per cell one
    of kind ``_FACT`` (in the transaction's wide form, see :func:`_wide`) or ``_BAD`` (``i``
    the column's position, ``raw`` the value as given). None when there are more than
    ``local_limit`` such rows: then the check and the facts stay in Spark. (A statement
    with a limit runs as a Spark job even over rows the driver holds: Spark gathers the
    limited partitions through a shuffle.)"""
    def cell(kind: int, i: int, aid: int, value_kind: Kind | None, raw: str) -> str:
        return (f"named_struct('k', {kind}, 'i', {i}, 'a', CAST({aid} AS INT), {_value_slots(i, value_kind)}, "
                f"'raw', CAST({raw} AS STRING))")

    cells = [f"CASE WHEN {_TYPED}{i} IS NOT NULL THEN {cell(_FACT, i, a.id, a.kind, 'NULL')} "
             f"WHEN {_RAW}{i} IS NOT NULL THEN {cell(_BAD, i, a.id, None, f'{_RAW}{i}')} END"
             for i, a in enumerate(attributes)]
    cells.append(cell(_ROW, -1, 0, None, f"CASE WHEN {_ENTITY} IS NULL THEN coalesce(CAST({_RAW_ENTITY} AS STRING), "
                                         "'null') END"))
    text = _unpivot(typed, cells, added, ("k", "i", "raw"))
    if local_limit is None:
        binder = bound.current()
        return binder.run(text) if binder is not None else collected(spark.sql(text)).table
    table = collected(spark.sql(f"{text} LIMIT {local_limit + 1}")).table
    return table if table.num_rows <= local_limit else None


def _summary(fetched: pa.Table, columns: int) -> dict:
    """What :func:`_checks` computes, from the rows :func:`_fetch_if_small` fetched."""
    kind = fetched.column("k")
    rows = fetched.filter(pc.equal(kind, _ROW))
    bad_entities = rows.filter(pc.is_valid(rows.column("raw")))
    summary = {"rows": rows.num_rows, "e_bad": bad_entities.num_rows,
               "e_example": bad_entities.column("raw")[0].as_py() if bad_entities.num_rows else None}
    cells = fetched.filter(pc.less(kind, _ROW))
    counts = {(c["i"], c["k"]): c["k_count"] for c in cells.group_by(["i", "k"]).aggregate([("k", "count")]).to_pylist()}
    for i in range(columns):
        bad = counts.get((i, _BAD), 0)
        summary[f"n{i}"] = counts.get((i, _FACT), 0) + bad
        summary[f"bad{i}"] = bad
        if bad:
            first = cells.filter(pc.and_(pc.equal(cells.column("i"), i), pc.equal(cells.column("k"), _BAD))).slice(0, 1)
            summary[f"example{i}"] = {"value": first.column("raw")[0].as_py(), "entity": first.column("e")[0].as_py()}
    return summary


def _wide(typed: str, attributes: list[Attribute], added: bool) -> str:
    """SQL of the facts of :func:`load`'s converted rows (``typed``) in the transaction's wide
    form: per row, one row per non-NULL typed cell, with its attribute's id and the value in
    the column of its kind."""
    cells = [f"CASE WHEN {_TYPED}{i} IS NOT NULL THEN named_struct('a', CAST({attribute.id} AS INT), "
             f"{_value_slots(i, attribute.kind)}) END" for i, attribute in enumerate(attributes)]
    return _unpivot(typed, cells, added)


def _unpivot(typed: str, cells: list[str], added: bool, extra: Sequence[str] = ()) -> str:
    """SQL of one row per non-NULL ``cells`` (SQL of a ``named_struct`` with ``a``, the value
    slots and ``extra`` fields) of each of :func:`load`'s converted rows (``typed``): the
    wide form's columns (``a``, ``e``, ``op``, the value slots), then ``extra``."""
    fields = ["f.a", "e", f"CAST({1 if added else -1} AS INT) AS op", *(f"f.{SLOT[k]}" for k in Kind),
              *(f"f.{name}" for name in extra)]
    return (f"SELECT {', '.join(fields)} FROM (SELECT {_ENTITY} AS e, "
            f"explode(array_compact(array({', '.join(cells)}))) AS f FROM {typed})")


def _value_slots(i: int, kind: Kind | None) -> str:
    """``named_struct`` arguments of the wide form's value slots: typed column ``i`` in the
    slot of ``kind``, NULL in every other (in all of them when ``kind`` is None)."""
    return ", ".join(f"'{SLOT[k]}', CAST({f'{_TYPED}{i}' if k is kind else 'NULL'} AS {sql_type(k)})" for k in Kind)
