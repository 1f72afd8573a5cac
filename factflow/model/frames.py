"""Driver-side pandas frames to Spark DataFrames, independent of the session's Arrow setting.

``spark.createDataFrame(pandas_frame)`` converts through Arrow only when
``spark.sql.execution.arrow.pyspark.enabled`` is true; otherwise it checks every cell in
Python and rejects what pandas uses for missing values in typed columns (``<NA>`` in a
nullable Int64 or boolean column, ``NaN`` in an integer column with gaps). factflow
builds a pyarrow Table with the Spark schema's Arrow types instead, which Spark takes
through the same Arrow path whatever that setting says.

A large frame becomes a DataFrame over an RDD of its Arrow batches, never a
``LocalRelation``: Spark turns an Arrow payload of less than
``spark.sql.execution.arrow.localRelationThreshold`` (48 MB) into a ``LocalRelation``,
whose rows live in the logical plan itself, and every plan built over it pays for them on
the driver (the optimizer evaluates projections and filters over the rows, the cache
manager compares plans row by row). A transaction of 842,450 facts spent over 400 s
there, in a dozen statements over its rows; over an RDD the same plans cost milliseconds.

A small frame can instead be written into a statement's text as an inline table
(:func:`values_sql`): Spark parses a few rows faster than it creates a DataFrame and a
temp view for them.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from factflow.model.types import ident

__all__ = ["spark_frame", "pandas_schema", "arrow_table", "values_sql", "in_session", "consolidated", "INLINE_ROWS", "LOCAL_RELATION_CELLS"]

#: Driver-side relations of at most this many rows enter statements as inline tables
#: (:func:`values_sql`). On this project's 2-core machine (``benchmarks/inline_relations.py``),
#: a statement reading 1 to 64 rows of four columns ran 15-30 ms sooner with them inline
#: than through ``createDataFrame`` and a temp view; from 256 rows on it was not reliably
#: sooner, and at 1,024 rows it was slower.
INLINE_ROWS = 64

#: Driver-side frames of more cells (rows times columns) than this become DataFrames over an
#: RDD of their Arrow batches, not ``LocalRelation`` plans (see the module docstring). Up to
#: it a ``LocalRelation`` costs little and saves a job: an epoch's local changes of 10,000
#: operations (8 columns) stay below it. The driver's cost of a ``LocalRelation`` grows with
#: its cells, not its rows: TPC-H lineitem at scale factor 0.01 (60,175 rows, 16 columns)
#: loaded in 12.5 s from a ``LocalRelation`` and in 6.6 s from an RDD, orders (15,000 rows,
#: 9 columns) in 3.8 s and 2.9 s.
LOCAL_RELATION_CELLS = 131_072
_LOCAL_RELATION_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"
_DECIMAL_PRECISION = 38  # Spark's largest
_BATCH_ROWS = "spark.sql.execution.arrow.maxRecordsPerBatch"


def spark_frame(spark: SparkSession, frame: pd.DataFrame, schema: T.StructType | None = None) -> DataFrame:
    """A Spark DataFrame of ``frame``'s columns named in ``schema``, typed as ``schema`` says
    (without a schema: every column, typed as Arrow converts it).

    Timestamps are truncated to microseconds, as Spark's own Arrow conversion does (with
    ``spark.sql.execution.pandas.convertToArrowArraySafely`` at its default, false). An
    empty frame gives an empty DataFrame whatever dtypes pandas gave its empty columns. A
    frame of more than :data:`LOCAL_RELATION_CELLS` cells is read from an RDD (see the
    module docstring).
    """
    schema = pandas_schema(frame) if schema is None else schema
    table = arrow_table(frame, schema)
    if table.num_rows * max(table.num_columns, 1) <= LOCAL_RELATION_CELLS:
        return spark.createDataFrame(table, schema=schema)
    # Session settings, read while the frame is created: no LocalRelation, and one Arrow
    # batch (a partition) per task slot rather than one per 10,000 rows
    batch_rows = -(-table.num_rows // spark.sparkContext.defaultParallelism)
    settings = {_LOCAL_RELATION_THRESHOLD: "0", _BATCH_ROWS: str(batch_rows)}
    conf = spark.conf
    before = {key: conf.get(key, None) for key in settings}
    for key, value in settings.items():
        conf.set(key, value)
    try:
        return spark.createDataFrame(table, schema=schema)
    finally:
        for key, value in before.items():
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)


def pandas_schema(frame: pd.DataFrame) -> T.StructType:
    """The Spark schema of ``frame``'s columns, typed as Arrow converts them (naive
    timestamps as ``TIMESTAMP_NTZ``), decimals with the largest precision: Arrow gives a
    column of Python decimals the precision its values need, and a schema that changes with
    the values would change the text of every statement over them (and so the plans kept)."""
    schema = from_arrow_schema(pa.Schema.from_pandas(frame, preserve_index=False), prefer_timestamp_ntz=True)
    return T.StructType([T.StructField(f.name, T.DecimalType(_DECIMAL_PRECISION, f.dataType.scale), f.nullable)
                         if isinstance(f.dataType, T.DecimalType) else f for f in schema.fields])


def values_sql(frame: pd.DataFrame, schema: T.StructType) -> str:
    """A parenthesized SQL relation holding ``frame``'s rows, typed and named as ``schema``
    says (as :func:`spark_frame` would), written out as an inline table: no call into
    Spark. Meant for at most :data:`INLINE_ROWS` rows; the text grows with the rows.

    Arrow renders the cells a column at a time as string literals (escaped, or ``NULL``),
    which Spark casts to the column's type: exact for 64-bit integers and doubles
    (shortest round-trip text), infinities and NaN included.
    """
    table = arrow_table(frame, schema)
    types = [field.dataType.simpleString() for field in schema.fields]
    if table.num_rows == 0:
        nulls = [f"CAST(NULL AS {t}) AS {ident(f.name)}" for t, f in zip(types, schema.fields)]
        return f"(SELECT {', '.join(nulls)} WHERE FALSE)"
    slots = [f"c{i}" for i in range(len(types))]
    casts = [f"CAST({c} AS {t}) AS {ident(f.name)}" for c, t, f in zip(slots, types, schema.fields)]
    cells = [_literals(column) for column in table.columns]
    rows = pc.binary_join_element_wise(*cells, ", ")
    body = "), (".join(rows.to_pylist())
    return f"(SELECT {', '.join(casts)} FROM VALUES ({body}) AS t({', '.join(slots)}))"


def _literals(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """SQL string literals of a column's values (``NULL`` for nulls)."""
    text = column if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) \
        else column.cast(pa.string())
    text = pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), "'", "\\'")
    return pc.fill_null(pc.binary_join_element_wise("'", text, "'", ""), "NULL")


def arrow_table(frame: pd.DataFrame, schema: T.StructType) -> pa.Table:
    """``frame`` as an Arrow table with the Arrow types of ``schema`` (timestamps truncated to
    microseconds)."""
    arrow_schema = to_arrow_schema(schema)
    if len(frame) == 0:
        return arrow_schema.empty_table()
    return pa.Table.from_pandas(frame, schema=arrow_schema, preserve_index=False, safe=False)


def consolidated(frame: pd.DataFrame, names: Sequence[str], diff: str) -> pd.DataFrame:
    """``frame`` projected onto ``names`` and ``diff``, diffs summed per distinct row, rows
    whose sum is zero dropped (a fresh index; the columns keep their dtypes).

    Rows with strings are grouped by Arrow: pandas hashes strings as C strings, so its
    ``groupby``, ``duplicated`` and ``factorize`` take ``"b"`` and ``"b\\x00c"`` for one value.
    Other rows are grouped by pandas, which is faster for small frames.
    """
    names = list(names)
    nonzero = frame[diff].to_numpy() != 0
    if not nonzero.all():
        frame = frame.loc[nonzero, names + [diff]]
    elif list(frame.columns) != names + [diff]:
        frame = frame[names + [diff]]
    if len(frame) <= 1:
        return frame.reset_index(drop=True)
    if not names:
        total = frame[diff].sum()
        return pd.DataFrame({diff: [total] if total else []}, dtype=frame[diff].dtype)
    if not any(pd.api.types.is_object_dtype(frame[n]) or pd.api.types.is_string_dtype(frame[n]) for n in names):
        summed = frame.groupby(names, sort=False, dropna=False, as_index=False)[diff].sum()
        return summed[summed[diff] != 0].reset_index(drop=True)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    summed = table.group_by(names, use_threads=False).aggregate([(diff, "sum")])
    summed = summed.rename_columns(names + [diff])
    out = summed.filter(pc.not_equal(summed[diff], 0)).to_pandas(integer_object_nulls=True)
    retyped = {name: dtype for name, dtype in frame.dtypes.items() if out[name].dtype != dtype}
    return out.astype(retyped) if retyped else out


def in_session(frame: DataFrame, spark: SparkSession) -> DataFrame:
    """``frame`` as a DataFrame of ``spark``: itself when it already is one; otherwise (a
    Structured Streaming micro-batch lives in a clone of the stream's session, whose temp
    views the engine's SQL cannot see) the same rows, handed over inside the JVM."""
    if frame.sparkSession._jsparkSession.equals(spark._jsparkSession):
        return frame
    jdf = spark._jsparkSession.createDataFrame(frame._jdf.rdd(), frame._jdf.schema())
    return DataFrame(jdf, spark)
