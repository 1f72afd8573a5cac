"""Driver-side frames entering Spark: as DataFrames, or written inline into a statement."""

from __future__ import annotations

import datetime as dt
import math
import random

import pandas as pd
import pytest
from pyspark.sql import types as T

from factflow.arrangement.batch import local_relation
from factflow.arrangement.views import drop_view
from factflow.model.frames import INLINE_ROWS, LOCAL_RELATION_CELLS, consolidated, spark_frame, values_sql

NASTY = ["", "plain", "it's", "a'b\"c", "back\\slash", "\\'", "\\u0041", "new\nline\ttab\r", "\x00nul",
         "\u00e9\u4e2d\U0001F600", "`tick`", "-- not a comment", "/* nor this */", "'", "\\", "x" * 10_000]

SCHEMA = T.StructType([T.StructField("a", T.IntegerType()), T.StructField("e", T.LongType()),
                       T.StructField("d", T.DoubleType()), T.StructField("odd `name`", T.StringType()),
                       T.StructField("b", T.BooleanType()), T.StructField("t", T.TimestampNTZType())])


def _rows(frame) -> list[tuple]:
    """The rows of a Spark DataFrame, exactly (64-bit integers stay integers), NaN as a string."""
    table = frame.toArrow()
    columns = [[("nan" if isinstance(x, float) and math.isnan(x) else x) for x in c.to_pylist()] for c in table.columns]
    return list(zip(*columns))


def _edge_frame() -> pd.DataFrame:
    n = len(NASTY)
    return pd.DataFrame({
        "a": pd.array([1, -2**31, 2**31 - 1] + [None] * (n - 3), dtype="Int32"),
        "e": pd.array([-2**63, 2**63 - 1, 0, -1] + [None] * (n - 4), dtype="Int64"),
        "d": [1.5, 1e300, -0.0, math.inf, -math.inf, 5e-324, 1 / 3, 0.1] + [None] * (n - 8),
        "odd `name`": NASTY,
        "b": pd.array([True, False] + [None] * (n - 2), dtype="boolean"),
        "t": [dt.datetime(2020, 1, 2, 3, 4, 5, 678901), dt.datetime(1970, 1, 1)] + [None] * (n - 2),
    })


def test_an_inline_table_reads_the_rows_a_dataframe_would(spark):
    frame = _edge_frame()
    inline = spark.sql(f"SELECT * FROM {values_sql(frame, SCHEMA)}")
    assert inline.columns == SCHEMA.names
    assert [f.dataType for f in inline.schema.fields] == [f.dataType for f in SCHEMA.fields]
    assert _rows(inline) == _rows(spark_frame(spark, frame, SCHEMA))
    negative_zero = spark.sql(f"SELECT d FROM {values_sql(frame, SCHEMA)}").toArrow().column(0)[2].as_py()
    assert math.copysign(1, negative_zero) == -1


def test_strings_of_any_content_survive_inline(spark):
    rng = random.Random(11)
    alphabet = "'\\\"`\n\r\t\x00 ab;-*/\u00e9\u4e2d\U0001F600"
    strings = NASTY + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(40)]
    schema = T.StructType([T.StructField("s", T.StringType())])
    got = spark.sql(f"SELECT * FROM {values_sql(pd.DataFrame({'s': strings}), schema)}").toArrow()
    assert got.column("s").to_pylist() == strings


def test_an_empty_frame_is_an_empty_typed_relation(spark):
    inline = spark.sql(f"SELECT * FROM {values_sql(_edge_frame().iloc[:0], SCHEMA)}")
    assert inline.count() == 0
    assert [f.dataType for f in inline.schema.fields] == [f.dataType for f in SCHEMA.fields]


@pytest.mark.parametrize("rows", [1, INLINE_ROWS, INLINE_ROWS + 1])
def test_small_frames_go_inline_and_larger_ones_into_a_view(spark, rows):
    frame = pd.DataFrame({"e": range(rows), "v": [f"'{i}\\" for i in range(rows)]})
    schema = T.StructType([T.StructField("e", T.LongType()), T.StructField("v", T.StringType())])
    relation, view = local_relation(spark, frame, schema)
    try:
        assert (view is None) == (rows <= INLINE_ROWS)
        assert sorted(_rows(spark.sql(f"SELECT * FROM {relation}"))) == list(zip(range(rows), frame["v"]))
    finally:
        if view is not None:
            drop_view(spark, view)


def test_small_transactions_keep_strings_of_any_content(engine):
    engine.create_attribute(":doc/text", type="string")
    query = engine.query("[:find ?d ?t :where [?d :doc/text ?t]]", name="texts")
    views = _temp_views(engine.spark)
    engine.transact([[":db/add", i + 1, ":doc/text", s] for i, s in enumerate(NASTY)])
    assert sorted(query.results()) == sorted((i + 1, s) for i, s in enumerate(NASTY))
    engine.transact([[":db/retract", i + 1, ":doc/text", s] for i, s in enumerate(NASTY) if i % 2])
    assert sorted(query.results()) == sorted((i + 1, s) for i, s in enumerate(NASTY) if i % 2 == 0)
    # a few rows go inline, or into the engine's slots (their views last): no view per epoch
    assert all(v.startswith("ffbound") for v in _temp_views(engine.spark) - views)


def _temp_views(spark) -> set[str]:
    return {t.name for t in spark.catalog.listTables() if t.isTemporary}


def test_consolidation_tells_strings_apart_after_a_nul():
    # pandas' groupby takes "b" and "b\x00c" for one value; consolidation must not
    frame = pd.DataFrame({"e": pd.array([1, 9, 9, 9, 2**62, None, None], dtype="Int64"),
                          "v": ["", "\x00nul", "\x00nul", "", "b\x00c", "b", None],
                          "_diff": [1, 1, 1, -1, 1, 1, 2]})
    out = consolidated(frame, ["e", "v"], "_diff")
    assert out.dtypes.to_dict() == frame.dtypes.to_dict()
    got = {((None if pd.isna(e) else int(e)), v, d) for e, v, d in out.itertuples(index=False)}
    assert len(out) == len(got)
    assert got == {(1, "", 1), (9, "\x00nul", 2), (9, "", -1), (2**62, "b\x00c", 1), (None, "b", 1), (None, None, 2)}


def test_consolidation_drops_rows_that_cancel():
    frame = pd.DataFrame({"k": ["a", "a", "b"], "_t": [3, 3, 3], "_diff": [1, -1, 0]})
    assert consolidated(frame, ["k", "_t"], "_diff").empty
    assert consolidated(frame, [], "_diff").empty
    assert consolidated(frame.iloc[:1], [], "_diff")["_diff"].tolist() == [1]


def test_a_wide_frame_is_read_from_an_rdd_and_a_narrow_one_from_the_plan(spark):
    """What decides is the frame's cells, not its rows: the optimizer evaluates plans over a
    LocalRelation's rows on the driver, which a 60,000-row table of 16 columns made cost
    seconds per load."""
    def leaf(columns: int, rows: int) -> str:
        frame = pd.DataFrame({f"c{i}": range(rows) for i in range(columns)})
        plan = spark_frame(spark, frame)._jdf.queryExecution().analyzed().toString()
        return "LocalRelation" if "LocalRelation" in plan else "LogicalRDD" if "LogicalRDD" in plan else plan
    cells = LOCAL_RELATION_CELLS
    assert leaf(8, cells // 8) == "LocalRelation"
    assert leaf(8, cells // 8 + 1) == "LogicalRDD"
    assert leaf(16, cells // 8) == "LogicalRDD"
    wide = pd.DataFrame({f"c{i}": range(cells // 4) for i in range(8)})
    assert _rows(spark_frame(spark, wide)) == list(zip(*[range(cells // 4)] * 8))
