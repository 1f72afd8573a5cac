"""Driver-side pandas frames to Spark DataFrames, independent of the session's Arrow setting.

``spark.createDataFrame(pandas_frame)`` converts through Arrow only when
``spark.sql.execution.arrow.pyspark.enabled`` is true; otherwise it checks every cell in
Python and rejects what pandas uses for missing values in typed columns (``<NA>`` in a
nullable Int64 or boolean column, ``NaN`` in an integer column with gaps). factflow
builds a pyarrow Table with the Spark schema's Arrow types instead, which Spark takes
through the same Arrow path whatever that setting says.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

__all__ = ["spark_frame", "in_session"]


def spark_frame(spark: SparkSession, frame: pd.DataFrame, schema: T.StructType) -> DataFrame:
    """A Spark DataFrame of ``frame``'s columns named in ``schema``, typed as ``schema`` says.

    Timestamps are truncated to microseconds, as Spark's own Arrow conversion does (with
    ``spark.sql.execution.pandas.convertToArrowArraySafely`` at its default, false). An
    empty frame gives an empty DataFrame whatever dtypes pandas gave its empty columns.
    """
    arrow_schema = to_arrow_schema(schema)
    if len(frame) == 0:
        table = arrow_schema.empty_table()
    else:
        table = pa.Table.from_pandas(frame, schema=arrow_schema, preserve_index=False, safe=False)
    return spark.createDataFrame(table, schema=schema)


def in_session(frame: DataFrame, spark: SparkSession) -> DataFrame:
    """``frame`` as a DataFrame of ``spark``: itself when it already is one; otherwise (a
    Structured Streaming micro-batch lives in a clone of the stream's session, whose temp
    views the engine's SQL cannot see) the same rows, handed over inside the JVM."""
    if frame.sparkSession._jsparkSession.equals(spark._jsparkSession):
        return frame
    jdf = spark._jsparkSession.createDataFrame(frame._jdf.rdd(), frame._jdf.schema())
    return DataFrame(jdf, spark)
