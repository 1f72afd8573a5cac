"""Value types of attributes and how Python and Spark represent them.

Six value types exist (``long``, ``double``, ``string``, ``boolean``, ``ref``, ``instant``).
They fall into five *kinds*, the physical representations in Spark: ``ref`` values are
entity ids and share the ``long`` kind, so entity and long columns join with each other.
Instants are stored as UTC wall-clock ``TIMESTAMP_NTZ`` and surface in Python as
timezone-aware UTC ``datetime`` objects.
"""

from __future__ import annotations

import datetime as _dt
import math
from enum import Enum
from typing import Any

from pyspark.sql import types as T

__all__ = ["Kind", "VALUE_TYPES", "INTEGRAL_TYPES", "FRACTIONAL_TYPES", "kind_of_type", "spark_type", "sql_type", "coerce_value", "kind_of_python_value",
           "python_type_name", "INT64_MIN", "INT64_MAX", "to_utc_naive", "from_utc_naive", "ident", "typed_sql"]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class Kind(str, Enum):
    """Physical representation of a value (a Spark column type)."""

    LONG = "long"
    DOUBLE = "double"
    STRING = "string"
    BOOLEAN = "boolean"
    INSTANT = "instant"

    @property
    def numeric(self) -> bool:
        """Whether values of this kind take part in arithmetic."""
        return self in (Kind.LONG, Kind.DOUBLE)


VALUE_TYPES = ("long", "double", "string", "boolean", "ref", "instant")

_KIND_OF_TYPE = {
    "long": Kind.LONG,
    "ref": Kind.LONG,
    "double": Kind.DOUBLE,
    "string": Kind.STRING,
    "boolean": Kind.BOOLEAN,
    "instant": Kind.INSTANT,
}

_SPARK_TYPE = {
    Kind.LONG: T.LongType(),
    Kind.DOUBLE: T.DoubleType(),
    Kind.STRING: T.StringType(),
    Kind.BOOLEAN: T.BooleanType(),
    Kind.INSTANT: T.TimestampNTZType(),
}


_SQL_TYPE = {
    Kind.LONG: "BIGINT",
    Kind.DOUBLE: "DOUBLE",
    Kind.STRING: "STRING",
    Kind.BOOLEAN: "BOOLEAN",
    Kind.INSTANT: "TIMESTAMP_NTZ",
}


def sql_type(kind: Kind) -> str:
    """The Spark SQL type name that stores values of ``kind``."""
    return _SQL_TYPE[kind]


def ident(name: str) -> str:
    """A quoted SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def kind_of_type(value_type: str) -> Kind:
    """The physical kind of a value type name."""
    return _KIND_OF_TYPE[value_type]


def spark_type(kind: Kind) -> T.DataType:
    """The Spark SQL type that stores values of ``kind``."""
    return _SPARK_TYPE[kind]


def to_utc_naive(value: _dt.datetime) -> _dt.datetime:
    """Convert a datetime to naive UTC wall-clock time (naive input is taken to be UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return value


def from_utc_naive(value: _dt.datetime) -> _dt.datetime:
    """Attach the UTC zone to a naive UTC wall-clock datetime."""
    return value.replace(tzinfo=_dt.timezone.utc)


def python_type_name(value: Any) -> str:
    """A short name of a Python value's type for error messages."""
    return type(value).__name__


def coerce_value(value: Any, value_type: str) -> tuple[bool, Any]:
    """Check ``value`` against a value type; return ``(ok, normalized)``.

    Normalization turns ints into floats for ``double`` and datetimes into naive UTC for
    ``instant`` (the form Spark stores). ``bool`` is never accepted as a number.
    """
    if value_type in ("long", "ref"):
        if isinstance(value, bool) or not isinstance(value, int):
            try:
                import numpy as np

                if isinstance(value, np.integer):
                    value = int(value)
                else:
                    return False, None
            except ImportError:  # pragma: no cover - numpy ships with pyspark's pandas support
                return False, None
        return (INT64_MIN <= value <= INT64_MAX), value
    if value_type == "double":
        if isinstance(value, bool):
            return False, None
        if isinstance(value, (int, float)) or _is_numpy_number(value):
            value = float(value)
            return (not math.isnan(value)), value
        return False, None
    if value_type == "string":
        return (isinstance(value, str) and not _is_edn_name(value)), value
    if value_type == "boolean":
        if isinstance(value, bool):
            return True, value
        try:
            import numpy as np

            if isinstance(value, np.bool_):
                return True, bool(value)
        except ImportError:  # pragma: no cover
            pass
        return False, None
    if value_type == "instant":
        if isinstance(value, _dt.datetime):
            return True, to_utc_naive(value)
        return False, None
    raise ValueError(f"unknown value type {value_type!r}")


def kind_of_python_value(value: Any) -> Kind | None:
    """The kind a Python constant (from a query) belongs to, or None if unsupported."""
    if isinstance(value, bool):
        return Kind.BOOLEAN
    if isinstance(value, int):
        return Kind.LONG
    if isinstance(value, float):
        return Kind.DOUBLE
    if isinstance(value, str) and not _is_edn_name(value):
        return Kind.STRING
    if isinstance(value, _dt.datetime):
        return Kind.INSTANT
    return None


def _is_numpy_number(value: Any) -> bool:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return False
    return isinstance(value, (np.integer, np.floating)) and not isinstance(value, np.bool_)


def _is_edn_name(value: Any) -> bool:
    from factflow.edn import Keyword, Symbol

    return isinstance(value, (Keyword, Symbol))


#: Spark's integral and fractional number types (a value of the first fits a ``long``)
INTEGRAL_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
FRACTIONAL_TYPES = (T.FloatType, T.DoubleType, T.DecimalType)


def typed_sql(expr: str, source: T.DataType, value_type: str) -> str:
    """SQL of ``expr`` (of Spark type ``source``) converted to ``value_type``; NULL where a
    value does not convert. Text is parsed as Spark's ``try_cast`` does; a number never comes
    from a boolean, a long or ref only from an integral value; an instant comes from a
    timestamp or date, from an integer or a text of digits (milliseconds since the epoch, as
    LDBC writes them) or from an ISO-8601 text (UTC); a double is never NaN. (SQL text, not
    a ``Column``: building a column costs a call into Spark per function, and a load of a
    few rows spent most of its time there.)"""
    kind = kind_of_type(value_type)
    target = sql_type(kind)
    if kind is Kind.STRING:
        return f"CAST({expr} AS {target})"
    if isinstance(source, T.BooleanType) and kind is not Kind.BOOLEAN:
        return f"CAST(NULL AS {target})"
    if kind is Kind.INSTANT:
        if isinstance(source, (T.TimestampType, T.TimestampNTZType, T.DateType)):
            return f"CAST({expr} AS {target})"
        if isinstance(source, INTEGRAL_TYPES):
            return f"CAST(timestamp_millis({expr}) AS {target})"
        if isinstance(source, T.StringType):
            text = f"trim({expr})"
            return (f"CASE WHEN {text} RLIKE '^-?[0-9]+$' THEN CAST(timestamp_millis(try_cast({text} AS BIGINT)) "
                    f"AS {target}) ELSE try_cast({text} AS {target}) END")
        return f"CAST(NULL AS {target})"
    typed = f"try_cast({expr} AS {target})"
    if kind is Kind.LONG and isinstance(source, FRACTIONAL_TYPES):
        typed = f"CASE WHEN CAST({typed} AS {source.simpleString()}) = {expr} THEN {typed} END"
    if kind is Kind.DOUBLE:
        typed = f"CASE WHEN NOT isnan({typed}) THEN {typed} END"
    return typed
