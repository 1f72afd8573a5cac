"""Transactions: from user input to the effective changes of each attribute.

A transaction arrives as a list of ``[op e a v]`` operations, EDN text of such a list,
or a pandas / Spark DataFrame with columns ``e``, ``a``, ``v`` and optionally a boolean
``added``. It is first brought into one *wide* Spark frame: attribute id, entity, sign
(+1 assert, -1 retract) and the value in the slot of its kind. Then a single Spark plan
checks the transaction against Datomic's rules and computes, for every attribute, the
changes the transaction really makes given the attribute's current state and semantics:

* ``set``: asserting a present fact or retracting an absent one changes nothing;
* ``one``: asserting a new value for an entity also retracts its current value;
* ``raw``: every assertion adds an occurrence, every retraction removes one (if any).

Errors found by Spark (conflicts inside the transaction, bad values in bulk input) come
back as rows with an ``err`` message; the engine rejects the whole transaction if any.

A DataFrame has columns ``e``, ``a``, ``v`` and optionally ``added``, no others (an
unknown column is rejected by name rather than ignored), and an error names the row it
found wrong as a list's error names the operation's index: by its position (0-based,
whatever a pandas frame's index), ``row 3 (entity 7)``, for a pandas frame and a small
Spark frame (its position as fetched to the driver, the order ``toPandas()`` shows). A
large Spark frame's rows are named by their entity, attribute and value instead: Spark
keeps no row order a user could count by across jobs (files are listed and split in any
order, shuffles reorder), and numbering the rows would cost a pass over all of them.

A Spark DataFrame's values are converted by Spark (``try_cast`` to each attribute's type)
when it is large, and when its ``v`` column is text whatever its size (what file and
socket sources carry: ``"42"`` for a long, ``"2021-03-04T05:06:07"`` for an instant);
a small one with typed values is checked on the driver like a pandas frame. A DataFrame
of another session (a Structured Streaming micro-batch's) is handed over to the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from factflow import edn
from factflow.edn import Keyword, Symbol
from factflow.arrangement.batch import DIFF, local_relation
from factflow.arrangement.index import TRACE_DIFF
from factflow.arrangement.views import register_view
from factflow.errors import EdnSyntaxError, TransactionError, UnknownAttributeError
from factflow.model.frames import in_session
from factflow.model.schema import Attribute, Schema
from factflow.dataflow.context import EpochContext
from factflow.dataflow.statement import Statement
from factflow.model.types import FRACTIONAL_TYPES, Kind, coerce_value, kind_of_type, python_type_name, spark_type, sql_type, typed_sql
from factflow.text import plural

__all__ = ["PreparedTransaction", "WideOps", "WideFrame", "prepare", "read_ops", "read_wide", "combine", "effective_changes", "changes_relation", "fact_operations", "format_errors", "SLOT", "TX_SCHEMA", "ERR"]

SLOT = {Kind.LONG: "vl", Kind.DOUBLE: "vd", Kind.STRING: "vs", Kind.BOOLEAN: "vb", Kind.INSTANT: "vt"}
ERR = "err"
_PROBLEM = "_problem"  # what is wrong with a row of Spark input (NULL when nothing is)
_COLUMNS = ("e", "a", "v", "added")
_OPS = {":db/add": 1, ":db/retract": -1}
TX_SCHEMA = T.StructType(
    [T.StructField("a", T.IntegerType(), False), T.StructField("e", T.LongType(), True),
     T.StructField("op", T.IntegerType(), False)]
    + [T.StructField(SLOT[k], spark_type(k), True) for k in Kind]
)
_MAX_ERRORS = 5
_IN_LIST_LIMIT = 2000  # above this many entities, restrict state reads with a join instead


@dataclass
class PreparedTransaction:
    """A transaction in wide form, with what the driver already knows about it."""

    frame: DataFrame | None  # Spark input (checked lazily); None when the rows are ``local``
    attributes: list[Attribute]
    rows: int | None  # None when unknown (Spark input, whose rows may carry a ``_problem``)
    small: bool       # small enough to collect its effective changes to the driver
    entities: dict[int, list[int]] | None = None  # entity ids per attribute id, when known
    local: pd.DataFrame | None = None  # the rows in ``TX_SCHEMA``'s columns, when on the driver

    def relation(self, spark: SparkSession) -> tuple[str, str | None]:
        """SQL reading the transaction's rows, and the temp view to drop afterwards (None
        when a few rows are written inline)."""
        if self.local is not None:
            return local_relation(spark, self.local, TX_SCHEMA, prefix="ff_tx")
        view = register_view(self.frame, prefix="ff_tx")
        return view, view


def prepare(tx: Any, schema: Schema, spark: SparkSession, local_limit: int) -> PreparedTransaction:
    """Validate what can be checked without data and build the wide transaction frame."""
    if isinstance(tx, WideOps):
        return _from_wide(tx, local_limit)
    if isinstance(tx, WideFrame):
        if tx.rows <= local_limit:
            spark.sparkContext.setJobDescription("fetch a small transaction")
            return _from_wide(tx.fetch(), local_limit)
        return PreparedTransaction(in_session(tx.frame, spark).select(*TX_SCHEMA.names), tx.attributes, tx.rows, False)
    if isinstance(tx, (DataFrame, pd.DataFrame)):
        _check_columns(tx.columns)
    if isinstance(tx, DataFrame):
        tx = in_session(tx, spark)
        if tx.limit(local_limit + 1).count() <= local_limit:  # a small epoch: take the driver path
            spark.sparkContext.setJobDescription("fetch a small transaction DataFrame")
            if "v" in tx.columns and isinstance(tx.schema["v"].dataType, T.StringType):
                return _from_wide(_fetch_text(tx, schema, spark), local_limit)
            return _from_pandas(tx.toArrow().to_pandas(), schema, local_limit)
        return _from_spark(tx, schema, spark, small=False)
    if isinstance(tx, pd.DataFrame):
        return _from_pandas(tx, schema, local_limit)
    if isinstance(tx, (str, list, tuple)):
        return _from_wide(read_ops(tx, schema), local_limit)
    raise _unsupported(tx)


def read_wide(tx: Any, schema: Schema, spark: SparkSession, local_limit: int) -> WideOps:
    """A transaction in any input form checked against the schema (operations, attributes,
    value types) and held on the driver in wide form, to be applied later (event time).

    A Spark DataFrame is fetched to the driver; one of more than ``local_limit`` rows is
    rejected (a bulk load is applied at once, in transaction time)."""
    if isinstance(tx, WideOps):
        return tx
    if isinstance(tx, (DataFrame, pd.DataFrame)):
        _check_columns(tx.columns)
    if isinstance(tx, DataFrame):
        tx = in_session(tx, spark)
        spark.sparkContext.setJobDescription("fetch a buffered transaction DataFrame")
        if tx.limit(local_limit + 1).count() > local_limit:
            raise TransactionError(f"a transaction DataFrame of more than {plural(local_limit, 'row')} (EngineConfig.local_limit) "
                                   "cannot be buffered for an event time; load it in transaction time or in parts")
        text = "v" in tx.columns and isinstance(tx.schema["v"].dataType, T.StringType)
        tx = _fetch_text(tx, schema, spark) if text else tx.toArrow().to_pandas()  # text converted as in prepare
    if isinstance(tx, (pd.DataFrame, WideOps)):
        wide = tx if isinstance(tx, WideOps) else _wide_from_pandas(tx, schema)
        frame = wide.frame.astype(object)
        return WideOps(frame.where(frame.notna(), None), wide.attributes)
    if isinstance(tx, (str, list, tuple)):
        return read_ops(tx, schema)
    raise _unsupported(tx)


def _check_columns(columns: Sequence[Any]) -> None:
    """Reject a transaction DataFrame that lacks column e, a or v, or has any column but
    those and ``added``, naming the columns."""
    missing = [c for c in ("e", "a", "v") if c not in columns]
    if missing:
        raise TransactionError(f"a transaction DataFrame needs columns e, a, v (and optionally added); "
                               f"{plural(len(missing), 'column')} missing: {', '.join(missing)}")
    unknown = [repr(c) for c in columns if c not in _COLUMNS]
    if unknown:
        raise TransactionError(f"a transaction DataFrame has columns e, a, v and optionally added, no others; "
                               f"{plural(len(unknown), 'unknown column')}: {', '.join(unknown)}")


def _row(position: int, entity: Any = None) -> str:
    """How an error names a row of a DataFrame: its position (0-based) and its entity, if any."""
    return f"row {position}" + (f" (entity {entity})" if entity is not None else "")


def _unsupported(tx: Any) -> TransactionError:
    return TransactionError(
        f"a transaction must be a list of [op e a v] operations, EDN text, or a pandas/Spark DataFrame; "
        f"got {type(tx).__name__}"
    )


# ------------------------------------------------------------------ input forms

def _wide_pandas(a, e, op, values: dict[Kind, list]) -> pd.DataFrame:
    """The wide frame; value slots stay Python objects (a slot of ints and Nones would
    otherwise become float64 and round longs beyond 2**53)."""
    data = {"a": pd.Series(a, dtype="int32"), "e": pd.Series(e, dtype="int64"), "op": pd.Series(op, dtype="int32")}
    n = len(a)
    for kind in Kind:
        data[SLOT[kind]] = pd.Series(values.get(kind, [None] * n), dtype=object)
    return pd.DataFrame(data)


@dataclass
class WideOps:
    """A list of operations checked against the schema, in wide form on the driver (no Spark yet)."""

    frame: pd.DataFrame
    attributes: list[Attribute]

    def columns(self) -> dict[str, list]:
        """The operations column by column: ``a``, ``e``, ``op`` and the value slots (None where empty)."""
        frame = self.frame[["a", "e", "op", *SLOT.values()]].astype(object)
        return {name: values.tolist() for name, values in frame.where(frame.notna(), None).items()}

    @classmethod
    def from_columns(cls, columns: dict[str, list], schema: Schema) -> "WideOps":
        """Operations from what :meth:`columns` gave (their attributes looked up by id in ``schema``)."""
        frame = _wide_pandas(columns["a"], columns["e"], columns["op"], {k: columns[SLOT[k]] for k in Kind})
        return cls(frame, [schema.by_id(int(a)) for a in dict.fromkeys(columns["a"])])


@dataclass
class WideFrame:
    """Operations typed and checked in Spark already, in wide form: a Spark frame with
    ``TX_SCHEMA``'s columns (``a``, ``e``, ``op`` and the value slots, only the slot of each
    row's attribute set), the attributes it touches and its number of rows. What
    :func:`factflow.io.load.load` builds: a bulk one is applied without converting or
    checking its values again."""

    frame: DataFrame
    attributes: list[Attribute]
    rows: int

    def fetch(self) -> WideOps:
        """The operations on the driver."""
        frame = self.frame.select(*TX_SCHEMA.names).toArrow().to_pandas(integer_object_nulls=True)
        return WideOps(frame, self.attributes)


def read_ops(tx: Any, schema: Schema) -> WideOps:
    """Check a transaction given as a list of ``[op e a v]`` operations (or EDN text of one)
    against the schema, on the driver; raises :class:`TransactionError` naming the first bad one."""
    if isinstance(tx, str):
        try:
            tx = edn.read(tx)
        except EdnSyntaxError as exc:
            raise TransactionError(f"malformed transaction EDN: {exc}") from exc
    if not isinstance(tx, (list, tuple)):
        raise TransactionError(f"a transaction must be a list of [op e a v] operations; got {type(tx).__name__}")
    a_ids: list[int] = []
    entities: list[int] = []
    signs: list[int] = []
    values = {k: [] for k in Kind}
    touched: dict[int, Attribute] = {}
    for i, op in enumerate(tx):
        where = f"operation {i} {_show(op)}"
        if not isinstance(op, (list, tuple)) or len(op) != 4:
            raise TransactionError(f"{where}: expected [op entity attribute value]")
        kind_kw, e, a, v = op
        sign = _OPS.get(str.__str__(kind_kw) if isinstance(kind_kw, str) else None)
        if sign is None:
            raise TransactionError(f"{where}: unknown operation {kind_kw!r}; use :db/add or :db/retract")
        ok, e_norm = coerce_value(e, "ref")
        if not ok:
            raise TransactionError(f"{where}: entity id must be a 64-bit integer, got {e!r}")
        try:
            attribute = schema.get(a)
        except UnknownAttributeError as exc:
            raise TransactionError(f"{where}: {exc}") from exc
        ok, value = coerce_value(v, attribute.value_type)
        if not ok:
            raise TransactionError(
                f"{where}: {v!r} ({python_type_name(v)}) is not a valid {attribute.value_type} value for {attribute.name}"
            )
        touched[attribute.id] = attribute
        a_ids.append(attribute.id)
        entities.append(e_norm)
        signs.append(sign)
        for kind in Kind:
            values[kind].append(value if kind is attribute.kind else None)
    return WideOps(_wide_pandas(a_ids, entities, signs, values), list(touched.values()))


def combine(parts: Sequence[WideOps]) -> WideOps:
    """Several checked transactions as one (for group commit; see :mod:`factflow.engine.group`)."""
    attributes = {a.id: a for part in parts for a in part.attributes}
    column = {name: [x for part in parts for x in part.frame[name].tolist()] for name in ["a", "e", "op", *SLOT.values()]}
    frame = _wide_pandas(column["a"], column["e"], column["op"], {k: column[SLOT[k]] for k in Kind})
    return WideOps(frame, list(attributes.values()))


def _from_wide(wide: WideOps, local_limit: int) -> PreparedTransaction:
    frame = wide.frame
    small = len(frame) <= local_limit  # only a small transaction's state is read by its entities
    return PreparedTransaction(None, wide.attributes, len(frame), small,
                               _entities_by_attribute(frame) if small else None, local=frame)


def _entities_by_attribute(frame: pd.DataFrame) -> dict[int, list[int]]:
    """The distinct entity ids each attribute's operations touch."""
    return {int(a): group.unique().tolist() for a, group in frame.groupby("a")["e"]}




def _from_pandas(tx: pd.DataFrame, schema: Schema, local_limit: int) -> PreparedTransaction:
    return _from_wide(_wide_from_pandas(tx, schema), local_limit)


def _wide_from_pandas(tx: pd.DataFrame, schema: Schema) -> WideOps:
    """A pandas transaction checked against the schema, in wide form (typed columns); a
    TransactionError names the first row found wrong, by position and entity."""
    if tx.empty:
        return WideOps(_wide_pandas([], [], [], {}), [])
    tx = tx.reset_index(drop=True)  # rows are matched (and named) by position, whatever index the caller's frame has
    entities = _entities(tx["e"])

    def where(position: int) -> str:
        return f"transaction DataFrame, {_row(position, entities[position])}"

    if tx["a"].isna().any():
        raise TransactionError(f"{where(_first(tx['a'].isna()))}: missing attribute name in column a")
    names = tx["a"].astype(str)
    attributes: dict[str, Attribute] = {}
    for name in pd.unique(names):
        try:
            attributes[name] = schema.get(name)
        except UnknownAttributeError as exc:
            raise TransactionError(f"{where(_first(names == name))}: {exc}") from exc
    if "added" in tx.columns:
        added = tx["added"]
        if not pd.api.types.is_bool_dtype(added.dtype) or added.isna().any():
            for position, flag in enumerate(added.tolist()):
                if not isinstance(flag, (bool, np.bool_)):
                    raise TransactionError(f"{where(position)}: column added must be true or false, got {flag!r}")
        signs = np.where(added.to_numpy(dtype=bool), 1, -1)
    else:
        signs = np.ones(len(tx), dtype="int32")
    codes, uniques = pd.factorize(names.to_numpy(), use_na_sentinel=False)
    ids = np.array([attributes[name].id for name in uniques], dtype="int32")
    wide = pd.DataFrame({"a": ids[codes], "e": entities.to_numpy(), "op": signs.astype("int32")})
    parts: dict[Kind, list[tuple[np.ndarray, Any]]] = {kind: [] for kind in Kind}
    for code, name in enumerate(uniques):
        attribute = attributes[name]
        positions = np.flatnonzero(codes == code)
        parts[attribute.kind].append((positions, _typed_values(
            tx["v"].iloc[positions], attribute.value_type,
            lambda position, v, attribute=attribute, positions=positions: TransactionError(
                f"{where(int(positions[position]))}: {v!r} ({python_type_name(v)}) is not a valid "
                f"{attribute.value_type} value for {attribute.name}"))))
    for kind in Kind:
        wide[SLOT[kind]] = _slot(kind, len(tx), parts[kind])
    return WideOps(wide, list(attributes.values()))


def _first(flags: pd.Series) -> int:
    """The position of the first True in ``flags``."""
    return int(flags.to_numpy().argmax())


def _entities(column: pd.Series) -> pd.Series:
    """Column e as int64 entity ids; a TransactionError names the first row whose id is
    missing or not a 64-bit integer (as for an operation: a float, a bool or a text is not)."""
    if pd.api.types.is_signed_integer_dtype(column.dtype) and not column.isna().any():
        return column.astype("int64")
    return pd.Series(_typed_values(column, "ref", lambda position, e: TransactionError(
        f"transaction DataFrame, {_row(position)}: entity id must be a 64-bit integer, got {e!r}")),
        index=column.index, dtype="int64")


#: The Python types whose values each value type accepts (as :func:`coerce_value` does),
#: and the subtypes among them it refuses.
_ACCEPTED = {
    "long": ((int, np.integer), (bool,)),
    "ref": ((int, np.integer), (bool,)),
    "double": ((int, float, np.integer, np.floating), (bool,)),
    "string": ((str,), (Keyword, Symbol)),
    "boolean": ((bool, np.bool_), ()),
    "instant": ((dt.datetime,), ()),
}
_ARROW_TYPE = {Kind.LONG: pa.int64(), Kind.DOUBLE: pa.float64(), Kind.STRING: pa.string(), Kind.BOOLEAN: pa.bool_(),
               Kind.INSTANT: pa.timestamp("us")}


def _typed_values(values: pd.Series, value_type: str, refuse: Callable[[int, Any], TransactionError]) -> np.ndarray:
    """``values`` converted to ``value_type``, as a NumPy array (object for strings,
    ``datetime64[us]`` for instants). A value that does not fit rejects the transaction
    with ``refuse(position, value)`` (its position in ``values``).

    No Python code runs per value unless one is wrong: a column whose dtype fits is
    converted as a whole; an object column is taken by the Python types present in it (a
    census in C, ``set(map(type, ...))``) and converted by Arrow when every type is one the
    attribute accepts. Only then, or when Arrow refuses a value (a long out of range), are
    the values checked one by one, to name the one at fault."""
    kind = kind_of_type(value_type)
    dtype = values.dtype
    fits = (
        (kind is Kind.LONG and pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype))
        or (kind is Kind.DOUBLE and pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype))
        or (kind is Kind.BOOLEAN and pd.api.types.is_bool_dtype(dtype))
        or (kind is Kind.INSTANT and pd.api.types.is_datetime64_any_dtype(dtype))
    )
    if fits and not values.isna().any():
        if kind is Kind.INSTANT:
            stamps = pd.to_datetime(values)
            if stamps.dt.tz is not None:
                stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
            return stamps.to_numpy().astype("datetime64[us]")
        if kind is Kind.DOUBLE:
            values = values.astype("float64")
            if not values.isna().any():  # NaN is no value
                return values.to_numpy()
        else:
            return values.to_numpy(dtype={Kind.LONG: "int64", Kind.BOOLEAN: "bool"}[kind])
    objects = values.to_numpy(dtype=object)
    accepted, refused = _ACCEPTED[value_type]
    census = set(map(type, objects))
    if all(issubclass(t, accepted) and not issubclass(t, refused) for t in census):
        if kind is Kind.STRING:
            return objects
        try:
            converted = pa.array(objects, type=_ARROW_TYPE[kind], safe=kind is not Kind.INSTANT)
        except (pa.ArrowException, OverflowError, ValueError, TypeError):
            converted = None
        if converted is not None and not (kind is Kind.DOUBLE and pc.any(pc.is_nan(converted)).as_py()):
            return converted.to_numpy(zero_copy_only=False)
    checked = []
    for position, v in enumerate(objects):  # a value is wrong: find the first, to name it
        ok, norm = coerce_value(v, value_type)
        if not ok:
            raise refuse(position, v)
        checked.append(norm)
    return pa.array(checked, type=_ARROW_TYPE[kind]).to_numpy(zero_copy_only=False)


def _slot(kind: Kind, n: int, parts: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    """The wide frame's value column of ``kind``: ``n`` rows, each part's values at its
    positions, missing elsewhere (nullable dtypes, object for strings)."""
    if kind is Kind.STRING:
        column = np.full(n, None, dtype=object)
    elif kind is Kind.INSTANT:
        column = np.full(n, np.datetime64("NaT"), dtype="datetime64[us]")
    else:
        column = np.zeros(n, dtype={Kind.LONG: "int64", Kind.DOUBLE: "float64", Kind.BOOLEAN: "bool"}[kind])
    missing = np.ones(n, dtype=bool)
    for positions, values in parts:
        column[positions] = values
        missing[positions] = False
    if kind is Kind.LONG:
        return pd.arrays.IntegerArray(column, missing)
    if kind is Kind.DOUBLE:
        return pd.arrays.FloatingArray(column, missing)
    if kind is Kind.BOOLEAN:
        return pd.arrays.BooleanArray(column, missing)
    return column


def _from_spark(tx: DataFrame, schema: Schema, spark: SparkSession, small: bool) -> PreparedTransaction:
    """A Spark transaction (columns checked) converted by Spark, lazily, with a column
    ``_problem`` saying what is wrong with each row (NULL if nothing); ``small``: it is to be
    fetched to the driver, so that errors name rows by position (see the module docs)."""
    spark.sparkContext.setJobDescription("transaction: attributes of bulk input")
    name_col = F.col("a").cast("string")
    names = [r[0] for r in tx.select(name_col).distinct().collect()]
    attributes = []
    for name in names:
        if name is None:
            raise TransactionError(f"transaction DataFrame, {_locate(tx, name_col.isNull(), small)}: "
                                   "missing attribute name in column a")
        try:
            attributes.append(schema.get(name))
        except UnknownAttributeError as exc:
            raise TransactionError(f"transaction DataFrame, {_locate(tx, name_col == name, small)}: {exc}") from exc
    added = F.col("added").try_cast("boolean") if "added" in tx.columns else F.lit(True)
    a_id = _per_attribute(name_col, attributes, lambda at: at.id)
    entity = F.expr(typed_sql("e", tx.schema["e"].dataType, "ref"))  # NULL where not an integer id: reported
    exprs = [a_id.cast("int").alias("a"), entity.alias("e"),
             F.when(added.isNull(), F.lit(None)).when(added, F.lit(1)).otherwise(F.lit(-1)).cast("int").alias("op")]
    v = F.col("v")
    source_type = tx.schema["v"].dataType
    slots = []
    for kind in Kind:
        ids = [at.id for at in attributes if at.kind is kind]
        target = spark_type(kind)
        if not ids:
            exprs.append(F.lit(None).cast(target).alias(SLOT[kind]))
            continue
        typed = F.expr(f"try_cast(v AS {target.simpleString()})") if source_type != target else v
        if kind is Kind.LONG and isinstance(source_type, FRACTIONAL_TYPES):
            typed = F.when(typed.cast(source_type) == v, typed)
        slots.append(F.when(a_id.isin(ids), typed).cast(target))
        exprs.append(slots[-1].alias(SLOT[kind]))
        try:
            tx.select(typed)
        except AnalysisException:
            names = ", ".join(str(at.name) for at in attributes if at.kind is kind)
            raise TransactionError(f"transaction DataFrame: column v of type {source_type.simpleString()} "
                                   f"cannot hold {kind.value} values (for {names})") from None
    problem = F.when(entity.isNull(), F.concat(F.lit("entity id must be a 64-bit integer, got "), _quoted(F.col("e")),
                                               F.lit(" (for "), name_col, F.lit(" value "), _quoted(v), F.lit(")")))
    if "added" in tx.columns:
        problem = problem.when(added.isNull(), F.concat(F.lit("column added must be true or false, got "),
                                                        _quoted(F.col("added"))))
    unconverted = F.coalesce(*(slot.cast("string") for slot in slots)).isNull() if slots else F.lit(True)
    problem = (problem.when(v.isNull(), F.concat(F.lit("missing value for "), name_col))
               .when(unconverted, F.concat(_quoted(v), F.lit(" is not a valid "),
                                           _per_attribute(name_col, attributes, lambda at: at.value_type),
                                           F.lit(" value for "), name_col)))
    return PreparedTransaction(tx.select(*exprs, problem.alias(_PROBLEM)), attributes, None, False)


def _per_attribute(name: Column, attributes: list[Attribute], value: Callable[[Attribute], Any]) -> Column:
    """``value`` of the attribute each row names in ``name`` (NULL for a row naming none of them)."""
    column = None
    for attribute in attributes:
        named, result = name == str(attribute.name), F.lit(value(attribute))
        column = F.when(named, result) if column is None else column.when(named, result)
    return column if column is not None else F.lit(None)


def _quoted(column: Column) -> Column:
    """A cell as an error shows it: its text in quotes, or nil."""
    return F.coalesce(F.concat(F.lit("'"), column.cast("string"), F.lit("'")), F.lit("nil"))


def _locate(tx: DataFrame, condition: Column, small: bool) -> str:
    """The first row of ``tx`` where ``condition`` holds, as an error names it: a small
    frame's by position and entity, a large one's by entity and value (see the module docs)."""
    tx.sparkSession.sparkContext.setJobDescription("transaction: the row rejected")
    e, v = F.col("e").cast("string"), F.col("v").cast("string")
    if small:
        rows = tx.select(F.coalesce(condition, F.lit(False)).alias("bad"), e.alias("e")).toArrow().to_pandas()
        position = _first(rows["bad"])
        return _row(position, rows["e"][position])
    row = tx.where(condition).select(e, v).first()
    return f"entity {row[0]}, value {row[1]!r}"


def _fetch_text(tx: DataFrame, schema: Schema, spark: SparkSession) -> WideOps:
    """A small DataFrame whose values are text (what file and socket sources carry), each
    converted by Spark to its attribute's type as in the bulk path, and fetched to the driver.
    A value that does not convert, a missing one and a missing or invalid entity id reject
    it, naming the first rows so (by position and entity)."""
    checked = _from_spark(tx, schema, spark, small=True)
    frame = checked.frame.toArrow().to_pandas(integer_object_nulls=True)
    bad = frame[_PROBLEM].notna()
    if bad.any():
        first = frame[bad].head(_MAX_ERRORS)  # the few rows the message names
        messages = [f"{_row(i, e)}: {problem}" for i, e, problem in zip(first.index, first["e"], first[_PROBLEM])]
        raise TransactionError(format_errors(messages, int(bad.sum())))
    return WideOps(frame[["a", "e", "op", *SLOT.values()]], checked.attributes)


def _show(op: Any) -> str:
    try:
        return edn.write(op) if isinstance(op, (list, tuple)) else repr(op)
    except Exception:  # pragma: no cover - only for messages
        return repr(op)


# ------------------------------------------------------------------ effective changes

def _value_text() -> str:
    """SQL of a wide row's value as text (its one non-NULL slot), for messages."""
    return f"coalesce({', '.join(f'CAST(`{SLOT[k]}` AS STRING)' for k in Kind)}, 'nil')"


def _input_errors(tx_view: str) -> str:
    """Error rows ``(a, e, err)`` for bulk (Spark) input: missing cells and values of the
    wrong type, named by entity (see the module docs)."""
    err = f"CASE WHEN `e` IS NULL THEN `{_PROBLEM}` ELSE concat('entity ', CAST(`e` AS STRING), ': ', `{_PROBLEM}`) END"
    return f"SELECT `a`, `e`, {err} AS `{ERR}` FROM {tx_view} WHERE `{_PROBLEM}` IS NOT NULL"


def _current_filter(tx_view: str, attribute: Attribute, entities: list[int] | None) -> str:
    """Restrict an attribute's current state to the entities the transaction touches: the
    ``entities`` listed when given and few, else a semi join with the transaction."""
    if entities is not None and len(entities) <= _IN_LIST_LIMIT:
        if not entities:
            return "WHERE FALSE"
        return f"WHERE c.`e` IN ({', '.join(f'{int(e)}L' for e in sorted(set(entities)))})"
    return (f"LEFT SEMI JOIN (SELECT DISTINCT `e` FROM {tx_view} WHERE `a` = {attribute.id}) k "
            f"ON c.`e` = k.`e`")


def _ids(attributes: Sequence[Attribute]) -> str:
    return ", ".join(str(a.id) for a in attributes)


def _present(sql: "Statement | EpochContext", tx_view: str, tx: PreparedTransaction, current: dict[int, str],
             inline_entities: bool, probed: str | None) -> str:
    """The current facts ``(a, e, <value slots>, n_add, n_ret, cur)`` of the entities the
    transaction touches, every attribute's in the wide form. A small transaction restricts
    each attribute's state by its own entities (a list, or a semi join); a bulk one
    restricts their union once, by a semi join with the transaction's distinct ``(a, e)``,
    so that the transaction is read once, not once per attribute. ``probed`` rows are
    restricted to the touched entities already."""
    parts = []
    if probed is not None:
        parts.append(f"SELECT CAST(`a` AS INT) AS `a`, `e`, {', '.join(f'`{SLOT[k]}`' for k in Kind)}, 0L AS `n_add`, "
                     f"0L AS `n_ret`, `{TRACE_DIFF}` AS `cur` FROM {probed}")
    for attribute in (a for a in tx.attributes if a.id in current):
        slots = ", ".join(f"CAST({'c.`v`' if k is attribute.kind else 'NULL'} AS {sql_type(k)}) AS `{SLOT[k]}`"
                          for k in Kind)
        entities = tx.entities.get(attribute.id) if tx.entities is not None and inline_entities else None
        where = _current_filter(tx_view, attribute, entities) if tx.small else ""
        parts.append(f"SELECT CAST({attribute.id} AS INT) AS `a`, c.`e`, {slots}, 0L AS `n_add`, 0L AS `n_ret`, "
                     f"c.`{DIFF}` AS `cur` FROM {current[attribute.id]} c {where}")
    present = sql.define(" UNION ALL ".join(parts))
    if tx.small:
        return present
    return sql.define(f"SELECT * FROM {present} p LEFT SEMI JOIN (SELECT DISTINCT `a`, `e` FROM {tx_view}) k "
                      f"ON p.`a` = k.`a` AND p.`e` = k.`e`")


def fact_operations(attribute_ids: Iterable[int]) -> str:
    """The SQL condition on a transaction's rows that keeps its operations on facts: of one of
    ``attribute_ids``, with an entity and a value."""
    has_value = " OR ".join(f"`{SLOT[k]}` IS NOT NULL" for k in Kind)
    return f"`a` IN ({', '.join(map(str, sorted(attribute_ids)))}) AND `e` IS NOT NULL AND ({has_value})"


def _changes(sql: "Statement | EpochContext", tx_view: str, tx: PreparedTransaction, current: dict[int, str],
             inline_entities: bool, probed: str | None) -> str:
    """Effective changes and errors ``(a, e, <value slots>, _diff, err)`` of every attribute
    the transaction touches, in one pass over the transaction.

    One aggregation over the transaction's rows and the current state of the entities it
    touches sums, per fact ``(a, e, value)``, how often it is asserted and retracted and
    its current count; for cardinality-one attributes a window over each ``(a, e)`` tells
    whether the entity is given a new value (which displaces the present one) or several
    (an error). A bulk statement distributes the rows by ``(a, e)`` first, which both the
    aggregation and the window then keep: one shuffle of the transaction, whatever the
    number of attributes it touches.
    """
    slots = ", ".join(f"`{SLOT[k]}`" for k in Kind)
    rows = (f"SELECT `a`, `e`, {slots}, CAST(`op` = 1 AS BIGINT) AS `n_add`, CAST(`op` = -1 AS BIGINT) AS `n_ret`, "
            f"0L AS `cur` FROM {tx_view} WHERE {fact_operations(a.id for a in tx.attributes)} "
            f"UNION ALL SELECT * FROM {_present(sql, tx_view, tx, current, inline_entities, probed)}")
    spread = "" if tx.small else " DISTRIBUTE BY `a`, `e`"
    facts = (f"SELECT `a`, `e`, {slots}, SUM(`n_add`) AS `n_add`, SUM(`n_ret`) AS `n_ret`, SUM(`cur`) AS `cur` "
             f"FROM (SELECT * FROM {sql.define(rows)}{spread}) GROUP BY `a`, `e`, {slots}")
    names = " ".join(f"WHEN {a.id} THEN '{str(a.name).replace(chr(39), '')}'" for a in tx.attributes)
    name = f"(CASE `a` {names} END)"
    both = (f"WHEN `n_add` > 0 AND `n_ret` > 0 THEN concat({name}, ': entity ', CAST(`e` AS STRING), ' value ', "
            f"{_value_text()}, ' is both asserted and retracted in one transaction')")
    ones = [a for a in tx.attributes if a.semantics == "one"]
    raws = [a for a in tx.attributes if a.semantics == "raw"]
    diff = "CASE WHEN `n_add` > 0 AND `cur` <= 0 THEN 1 WHEN `n_ret` > 0 AND `cur` > 0 THEN -1 ELSE 0 END"  # set
    err = f"CASE {both} END"
    if raws:
        diff = f"CASE WHEN `a` IN ({_ids(raws)}) THEN `n_add` - least(`n_ret`, greatest(`cur`, 0)) ELSE {diff} END"
    if ones:
        window = "OVER (PARTITION BY `a`, `e`)"
        facts = (f"SELECT *, SUM(CAST(`n_add` > 0 AS BIGINT)) {window} AS `entity_adds`, "
                 f"collect_list(CASE WHEN `n_add` > 0 THEN {_value_text()} END) {window} AS `added_values` "
                 f"FROM ({facts})")
        one = ("CASE WHEN `n_add` > 0 AND `cur` <= 0 THEN 1 "
               "WHEN `cur` > 0 AND (`n_ret` > 0 OR (`entity_adds` > 0 AND `n_add` = 0)) THEN -1 ELSE 0 END")
        diff = f"CASE WHEN `a` IN ({_ids(ones)}) THEN {one} ELSE {diff} END"
        err = (f"CASE {both} WHEN `a` IN ({_ids(ones)}) AND `n_add` > 0 AND `entity_adds` > 1 THEN concat({name}, "
               f"' has cardinality one, but entity ', CAST(`e` AS STRING), ' is given several values in one "
               f"transaction: ', concat_ws(', ', array_sort(`added_values`))) END")
    decided = f"SELECT `a`, `e`, {slots}, CAST({diff} AS BIGINT) AS `{DIFF}`, {err} AS `{ERR}` FROM ({facts})"
    return sql.define(f"SELECT * FROM ({decided}) WHERE `{DIFF}` <> 0 OR `{ERR}` IS NOT NULL")


def changes_relation(sql: "Statement | EpochContext", tx_view: str, tx: PreparedTransaction, current: dict[int, str],
                     inline_entities: bool, probed: str | None = None) -> str:
    """The effective changes and errors of a small transaction's rows (no Spark input) as a
    subquery defined in ``sql`` (a statement, or an evaluation's context): its name. Same
    arguments and columns as :func:`effective_changes`."""
    return _changes(sql, tx_view, tx, current, inline_entities, probed)


def effective_changes(tx_view: str, tx: PreparedTransaction, current: dict[int, str],
                      inline_entities: bool = True, probed: str | None = None) -> str | None:
    """SQL of one wide relation with every attribute's effective changes and every error found.

    ``tx_view`` is SQL reading the transaction's rows (see
    :meth:`PreparedTransaction.relation`); ``current`` maps attribute ids to
    their forward index as of the previous epoch, and ``probed``, when given, holds the
    current rows of the touched entities of the attributes ``current`` leaves out (``a``, ``e``,
    the value slots, ``_tdiff``: see :func:`factflow.engine.apply.apply_changes`);
    ``inline_entities=False`` keeps the
    touched entities out of the text (a semi join instead of a list), so that the text
    depends on the transaction's shape only (see :mod:`factflow.arrangement.bound`). Columns: ``a, e, <value slots>, _diff,
    err`` (``err`` is NULL on change rows, and the only non-NULL value column is the one
    of the attribute's kind).
    """
    sql = Statement(single_partition=tx.small)
    parts = []
    if tx.rows is None:
        errors = _input_errors(tx_view)
        slots = [f"CAST(NULL AS {sql_type(k)}) AS `{SLOT[k]}`" for k in Kind]
        parts.append(f"SELECT `a`, `e`, {', '.join(slots)}, 0L AS `{DIFF}`, `{ERR}` FROM ({errors})")
    if tx.attributes:
        parts.append(f"SELECT * FROM {_changes(sql, tx_view, tx, current, inline_entities, probed)}")
    if not parts:
        return None
    return sql.render(" UNION ALL ".join(f"({p})" for p in parts))


def format_errors(messages: list[str], total: int) -> str:
    """The text of a rejected transaction's error."""
    head = "; ".join(messages[:_MAX_ERRORS])
    more = f" (and {total - _MAX_ERRORS} more)" if total > _MAX_ERRORS else ""
    return f"transaction rejected: {head}{more}"
