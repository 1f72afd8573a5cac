"""Loading any Spark source as facts, in one epoch: one column per attribute, one for the entity.

``db.load(path, format="csv", entity="id", attributes={":person/name": "name"}, options={...})``
reads ``path`` with ``spark.read.format(format).options(**options).load(path)``, converts the
entity column to entity ids and each mapped column to its attribute's type
(:func:`typed_column`), and checks every conversion in one Spark job: a value that does not
convert rejects the load (:class:`LoadError` naming the attribute, the column, how many
rows, and an example value with its entity), as does a missing or non-integer entity id
(naming an example). Rows are named by their entity, not by their position: a source
Spark reads has no row order it keeps across jobs (files are listed and split in any
order), and numbering the rows would cost a pass over all of them. NULL cells are
skipped (no fact). The typed columns are then unpivoted into one ``(e, a, v)`` frame (the
values as text when the attributes' kinds differ, which the transaction converts back
exactly) and applied with one :meth:`Engine.transact`: one epoch, all or nothing.
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
from factflow.errors import LoadError, UnknownAttributeError
from factflow.model.types import Kind, kind_of_type, spark_type
from factflow.text import plural

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.engine import Engine

__all__ = ["LoadReport", "load", "typed_column"]

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_FRACTIONAL = (T.FloatType, T.DoubleType, T.DecimalType)


@dataclass
class LoadReport:
    """What :meth:`Engine.load` applied: the ``epoch``, the ``rows`` read, per attribute the
    values given (``facts``; its effective changes may be fewer, e.g. facts already present)
    and the ``seconds`` it took."""

    epoch: int
    rows: int
    facts: dict[str, int]
    seconds: float


def typed_column(column: Column, source: T.DataType, value_type: str) -> Column:
    """``column`` (of Spark type ``source``) converted to ``value_type``; NULL where a value
    does not convert. Text is parsed as Spark's ``try_cast`` does; a number never comes from a
    boolean, a long or ref only from an integral value; an instant comes from a timestamp or
    date, from an integer or a text of digits (milliseconds since the epoch, as LDBC writes
    them) or from an ISO-8601 text (UTC); a double is never NaN."""
    kind = kind_of_type(value_type)
    target = spark_type(kind)
    if kind is Kind.STRING:
        return column.cast(target)
    if isinstance(source, T.BooleanType) and kind is not Kind.BOOLEAN:
        return F.lit(None).cast(target)
    if kind is Kind.INSTANT:
        if isinstance(source, (T.TimestampType, T.TimestampNTZType, T.DateType)):
            return column.cast(target)
        if isinstance(source, _INTEGRAL):
            return F.timestamp_millis(column).cast(target)
        if isinstance(source, T.StringType):
            text = F.trim(column)
            return F.when(text.rlike(r"^-?[0-9]+$"), F.timestamp_millis(text.try_cast("long")).cast(target)) \
                .otherwise(text.try_cast(target))
        return F.lit(None).cast(target)
    typed = column.try_cast(target)
    if kind is Kind.LONG and isinstance(source, _FRACTIONAL):
        typed = F.when(typed.cast(source) == column, typed)
    if kind is Kind.DOUBLE:
        typed = F.when(~F.isnan(typed), typed)
    return typed


def _column(frame: DataFrame, name: str, path: str) -> tuple[Column, T.DataType]:
    """The column called ``name`` (dots and all) and its type; LoadError if there is none."""
    if name not in frame.columns:
        raise LoadError(f"load {path}: no column {name!r} (columns: {', '.join(frame.columns)})")
    return F.col("`" + name.replace("`", "``") + "`"), frame.schema[name].dataType


def load(db: "Engine", path: str | Sequence[str], format: str = "csv", entity: str = "id",
         attributes: Mapping[str, str] | None = None, options: Mapping[str, str] | None = None) -> LoadReport:
    """Read ``path`` with Spark's reader for ``format`` (and ``options``) and apply, in one
    epoch, a fact ``[row[entity] attribute row[column]]`` per ``attribute: column`` of
    ``attributes`` and per row whose cell is not NULL; see the module docstring."""
    started = time.perf_counter()
    spark = db.spark
    if not attributes:
        raise LoadError(f"load {path}: no attributes given (map attribute names to columns)")
    resolved = []
    for name, column in attributes.items():
        try:
            resolved.append((db.schema.get(name), column))
        except UnknownAttributeError as exc:
            raise LoadError(f"load {path}: {exc}") from exc
    label_jobs(spark.sparkContext, "factflow-load", f"factflow load {path}")
    try:
        frame = spark.read.format(format).options(**{k: str(v) for k, v in (options or {}).items()}).load(path)
    except AnalysisException as exc:
        raise LoadError(f"load {path}: Spark cannot read it as {format}: {str(exc).splitlines()[0]}") from None
    raw_e, e_type = _column(frame, entity, path)
    e = typed_column(raw_e, e_type, "ref")
    checks = [F.count(F.lit(1)).alias("rows"), F.count(F.when(e.isNull(), 1)).alias("e_bad"),
              F.first(F.when(e.isNull(), F.coalesce(raw_e.cast("string"), F.lit("null"))), ignorenulls=True)
              .alias("e_example")]
    typed = []
    for i, (attribute, name) in enumerate(resolved):
        raw, source = _column(frame, name, path)
        value = typed_column(raw, source, attribute.value_type)
        bad = raw.isNotNull() & value.isNull()
        checks += [F.count(raw).alias(f"n{i}"), F.count(F.when(bad, 1)).alias(f"bad{i}"),
                   F.first(F.when(bad, F.struct(raw.cast("string").alias("value"), e.alias("entity"))),
                           ignorenulls=True).alias(f"example{i}")]
        typed.append(value)
    spark.sparkContext.setJobDescription(f"load {path}: check {plural(len(resolved), 'column')}")
    summary = frame.agg(*checks).first()
    if summary["e_bad"]:
        raise LoadError(f"load {path}: entity column {entity!r}: {plural(summary['e_bad'], 'row')} with a missing "
                        f"or non-integer entity id, e.g. {summary['e_example']!r}")
    errors = [f"{attribute.name} (column {name!r}): {plural(summary[f'bad{i}'], 'row')} not convertible to "
              f"{attribute.value_type}, e.g. {summary[f'example{i}']['value']!r} (entity "
              f"{summary[f'example{i}']['entity']})"
              for i, (attribute, name) in enumerate(resolved) if summary[f"bad{i}"]]
    if errors:
        raise LoadError(f"load {path} rejected, nothing applied: {'; '.join(errors)}")
    kinds = {attribute.kind for attribute, _ in resolved}
    common = spark_type(kinds.pop()) if len(kinds) == 1 else T.StringType()
    wide = frame.select(e.alias("e"), *(v.cast(common).alias(f"c{i}") for i, v in enumerate(typed)))
    names = F.create_map(*(x for i, (attribute, _) in enumerate(resolved)
                           for x in (F.lit(f"c{i}"), F.lit(str(attribute.name)))))
    facts = wide.unpivot(["e"], [f"c{i}" for i in range(len(resolved))], "column", "v") \
        .where(F.col("v").isNotNull()).select("e", names[F.col("column")].alias("a"), "v")
    epoch = db.transact(facts)
    return LoadReport(epoch, summary["rows"], {str(a.name): summary[f"n{i}"] for i, (a, _) in enumerate(resolved)},
                      time.perf_counter() - started)
