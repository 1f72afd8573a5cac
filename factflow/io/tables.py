"""Relational tables as facts: an entity per row, an attribute per column.

A :class:`Table` says how one relational table maps to facts, and :func:`load_table`
(:func:`load_tables` for several tables in one epoch) applies its rows (from files, a
Spark DataFrame or a pandas frame) through :meth:`Engine.load <factflow.Engine.load>`, so
a table costs what a load costs:

* **Attributes**: column ``c`` of table ``t`` is the attribute ``:t/c``, typed from the
  column's Spark type (integers ``long``; floats and decimals ``double``; text ``string``;
  dates and timestamps ``instant``, a date at midnight UTC; booleans ``boolean``) with
  cardinality one: a row has one value per column. NULL cells are no facts.
* **Entities**: a row's entity id is a 64-bit hash of the table's name and its primary key
  (Spark's ``xxhash64``, fixed seed, over the key's values with integers as ``BIGINT`` and
  anything else as text): stable across loads, machines and Spark versions, so the same
  row always has the same entity, a row can be retracted by loading it again with
  ``added=False``, and composite keys (TPC-H's ``lineitem(orderkey, linenumber)``) need
  nothing special. Two keys of a table hash to one id with a probability of about
  ``n * n / 2**65`` for ``n`` rows (2 in a million for the 8.7 million rows of TPC-H at
  scale factor 1).
* **Foreign keys** are ``ref`` attributes: a column (or several) naming another table's key
  holds that row's entity id, computed by the same hash, so ``[?l :lineitem/l_orderkey
  ?o] [?o :orders/o_orderdate ?d]`` joins a line item to its order. A reference over
  several columns (``lineitem(partkey, suppkey)`` to ``partsupp``) is an attribute of its
  own, named in :attr:`Table.references`. The key columns themselves stay attributes with
  their values (``:orders/o_orderkey``), for queries that show or compare them.

``benchmarks/tpch/schema.py`` maps the eight TPC-H tables this way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from factflow.arrangement.batch import local_relation
from factflow.arrangement.views import drop_view, register_view
from factflow.dataflow.zset import literal
from factflow.errors import LoadError, SchemaError
from factflow.io.load import LoadReport, load_relation
from factflow.model.frames import in_session, pandas_schema, spark_frame
from factflow.model.types import FRACTIONAL_TYPES, INTEGRAL_TYPES, Kind, ident

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.engine import Engine

__all__ = ["Reference", "Table", "entity_id", "table_attributes", "create_table", "load_table", "load_tables"]

_ENTITY = "__entity"


@dataclass(frozen=True)
class Reference:
    """A foreign key: ``columns`` of this table hold the key of a row of ``table`` (in the
    order of that table's key)."""

    table: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """How a relational table becomes facts (see the module docstring).

    ``name`` is the attributes' namespace; ``key`` the primary key's columns; ``references``
    maps attribute names (without namespace) to foreign keys: a one-column reference named
    after its column makes that column a ``ref`` attribute, any other name adds a ``ref``
    attribute over the reference's columns; ``columns`` restricts the table to those columns
    (default: all); ``types`` overrides a column's value type."""

    name: str
    key: tuple[str, ...]
    references: Mapping[str, Reference] = field(default_factory=dict)
    columns: tuple[str, ...] | None = None
    types: Mapping[str, str] = field(default_factory=dict)

    def attribute(self, column: str) -> str:
        """The attribute of ``column`` (or of a reference): ``:<table>/<column>``."""
        return f":{self.name}/{column}"


def entity_id(table: str, parts: Sequence[str]) -> str:
    """SQL of the entity id of the row of ``table`` whose key has the values ``parts`` (SQL
    expressions): ``xxhash64`` of the table's name and the key, see the module docstring;
    NULL when a part of the key is."""
    missing = " OR ".join(f"{part} IS NULL" for part in parts)
    return f"CASE WHEN NOT ({missing}) THEN xxhash64({literal(table, Kind.STRING)}, {', '.join(parts)}) END"


def _key_part(schema: T.StructType, column: str) -> str:
    """SQL of a key column as it is hashed: integers as BIGINT, anything else as text."""
    if isinstance(schema[column].dataType, INTEGRAL_TYPES):
        return f"CAST({ident(column)} AS BIGINT)"
    return f"CAST({ident(column)} AS STRING)"


def _value_type(data_type: T.DataType, where: str) -> str:
    if isinstance(data_type, INTEGRAL_TYPES):
        return "long"
    if isinstance(data_type, FRACTIONAL_TYPES):
        return "double"
    if isinstance(data_type, (T.StringType, T.CharType, T.VarcharType)):
        return "string"
    if isinstance(data_type, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        return "instant"
    if isinstance(data_type, T.BooleanType):
        return "boolean"
    raise SchemaError(f"{where}: no attribute type holds Spark's {data_type.simpleString()}; "
                      "leave the column out (Table.columns) or give its type (Table.types)")


def _columns(table: Table, schema: T.StructType) -> list[str]:
    names = list(table.columns) if table.columns is not None else schema.names
    wanted = set(names) | set(table.key) | {c for r in table.references.values() for c in r.columns}
    missing = sorted(wanted - set(schema.names))
    if missing:
        raise LoadError(f"table {table.name}: no column {', '.join(map(repr, missing))} "
                        f"(columns: {', '.join(schema.names)})")
    return names


def table_attributes(table: Table, schema: T.StructType) -> dict[str, str]:
    """The attributes of ``table`` for rows of Spark schema ``schema``: ``{name: value type}``."""
    out = {}
    for column in _columns(table, schema):
        reference = table.references.get(column)
        if reference is not None and reference.columns == (column,):
            out[table.attribute(column)] = "ref"
        else:
            out[table.attribute(column)] = table.types.get(column) or _value_type(
                schema[column].dataType, f"table {table.name}, column {column!r}")
    for name, reference in table.references.items():
        if reference.columns != (name,):
            out[table.attribute(name)] = "ref"
    return out


def create_table(db: "Engine", table: Table, schema: T.StructType) -> dict[str, str]:
    """Create the attributes of ``table`` (those that exist already are kept when their type
    matches: a SchemaError names one that does not); returns them as :func:`table_attributes`."""
    attributes = table_attributes(table, schema)
    for name, value_type in attributes.items():
        if name in db.schema:
            existing = db.schema.get(name)
            if existing.value_type != value_type:
                raise SchemaError(f"table {table.name}: attribute {name} exists with type {existing.value_type}, "
                                  f"the table needs {value_type}")
            continue
        db.create_attribute(name, type=value_type, semantics="one")
    return attributes


def load_table(db: "Engine", source: str | Sequence[str] | DataFrame | pd.DataFrame, table: Table,
               format: str = "parquet", options: Mapping[str, str] | None = None, added: bool = True) -> LoadReport:
    """Apply the rows of ``source`` (files read with Spark's ``format`` reader, a Spark
    DataFrame or a pandas frame) as facts of ``table`` in one epoch, as :meth:`Engine.load`
    applies a source; its attributes are created first when missing (:func:`create_table`).
    ``added=False`` retracts the rows' facts."""
    return load_tables(db, [(source, table)], format, options, added)


def load_tables(db: "Engine", sources: Sequence[tuple[str | Sequence[str] | DataFrame | pd.DataFrame, Table]],
                format: str = "parquet", options: Mapping[str, str] | None = None, added: bool = True) -> LoadReport:
    """Apply the rows of several tables, ``(source, table)`` pairs as :func:`load_table`
    takes them, in one epoch: an order and its line items arrive (or are retracted)
    together, so no query ever shows one without the other. A LoadError, changing nothing,
    for no sources or a table given twice."""
    if not sources:
        raise LoadError("load_tables: no tables given")
    names = [table.name for _, table in sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise LoadError(f"load_tables: table {', '.join(twice)} given twice (union its rows into one source)")
    views: list[str] = []
    with db.loading():
        try:
            facts = [_facts(db, source, table, format, options, views) for source, table in sources]
            if len(facts) == 1:
                relation, schema, attributes = facts[0]
            else:
                relation, schema, attributes = _union(facts)
            what = ", ".join(f"table {table.name}" for _, table in sources)
            held = sum(len(source) for source, _ in sources) if all(
                _driver_rows(db, source) for source, _ in sources) else None
            return load_relation(db, relation, schema, what, _ENTITY, attributes, added, driver_rows=held)
        finally:
            for view in views:
                drop_view(db.spark, view)


def _facts(db: "Engine", source: str | Sequence[str] | DataFrame | pd.DataFrame, table: Table, format: str,
           options: Mapping[str, str] | None, views: list[str]) -> tuple[str, T.StructType, dict[str, str]]:
    """The rows of ``source`` as SQL (a parenthesized subquery) with their entity id (column
    ``_ENTITY``), reference ids and the table's columns, its schema, and the column each
    attribute of ``table`` takes its values from; the table's attributes are created first
    when missing. A small pandas frame (:func:`_driver_rows`) is read as the driver's rows
    (:func:`~factflow.arrangement.batch.local_relation`: bound to a slot of the active binder,
    or written into the text); any other source through a temp view. Temp views registered
    are appended to ``views``."""
    spark = db.spark
    if _driver_rows(db, source):
        schema = pandas_schema(source)
        rows, view = local_relation(spark, source, schema, "ff_table")
        if view is not None:
            views.append(view)
    else:
        if isinstance(source, pd.DataFrame):
            frame = spark_frame(spark, source)
        elif isinstance(source, DataFrame):
            frame = in_session(source, spark)
        else:
            frame = spark.read.format(format).options(**{k: str(v) for k, v in (options or {}).items()}).load(source)
        schema = frame.schema
        rows = register_view(frame, "ff_table")
        views.append(rows)
    create_table(db, table, schema)
    columns, ids = {}, {}
    for column in _columns(table, schema):
        reference = table.references.get(column)
        if reference is not None and reference.columns == (column,):
            ids[f"__ref_{column}"] = entity_id(reference.table, [_key_part(schema, column)])
            columns[table.attribute(column)] = f"__ref_{column}"
        else:
            columns[table.attribute(column)] = column
    for name, reference in table.references.items():
        if reference.columns != (name,):
            ids[f"__ref_{name}"] = entity_id(reference.table, [_key_part(schema, c) for c in reference.columns])
            columns[table.attribute(name)] = f"__ref_{name}"
    ids[_ENTITY] = entity_id(table.name, [_key_part(schema, c) for c in table.key])
    plain = list(dict.fromkeys(c for c in columns.values() if c not in ids))
    selected = [f"{expr} AS {ident(name)}" for name, expr in ids.items()] + [ident(c) for c in plain]
    fields = [T.StructField(name, T.LongType()) for name in ids] + [schema[c] for c in plain]
    return f"(SELECT {', '.join(selected)} FROM {rows})", T.StructType(fields), columns


def _driver_rows(db: "Engine", source: object) -> bool:
    """Whether ``source`` is a pandas frame whose load is small (at most ``local_limit``
    cells and rows), read as the driver's rows; a larger one goes through Spark in parallel."""
    return isinstance(source, pd.DataFrame) and len(source) * (len(source.columns) + 1) <= db.config.local_limit


def _union(facts: Sequence[tuple[str, T.StructType, dict[str, str]]]) -> tuple[str, T.StructType, dict[str, str]]:
    """Several tables' :func:`_facts` as one relation: the entity column, then each table's
    columns under a name of their own (NULL in the other tables' rows)."""
    aliased = []  # per table: {column: alias}
    fields = [T.StructField(_ENTITY, T.LongType())]
    attributes = {}
    for i, (_, schema, columns) in enumerate(facts):
        aliases = {column: f"__t{i}_{n}" for n, column in enumerate(dict.fromkeys(columns.values()))}
        aliased.append(aliases)
        fields += [T.StructField(alias, schema[column].dataType) for column, alias in aliases.items()]
        attributes.update({attribute: aliases[column] for attribute, column in columns.items()})
    parts = []
    for i, (relation, _, _) in enumerate(facts):
        cells = [ident(_ENTITY)]
        for j, aliases in enumerate(aliased):
            for column, alias in aliases.items():
                value = ident(column) if i == j else f"CAST(NULL AS {facts[j][1][column].dataType.simpleString()})"
                cells.append(f"{value} AS {alias}")
        parts.append(f"SELECT {', '.join(cells)} FROM {relation}")
    return f"({' UNION ALL '.join(parts)})", T.StructType(fields), attributes
