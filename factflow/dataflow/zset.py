"""Z-set algebra written as Spark SQL.

A Z-set relation has data columns and a signed ``_diff`` column (its multiplicity
change). Joins multiply diffs, unions concatenate, and consolidation sums diffs per row
and drops the rows that cancel.

The dataflow builds each epoch's work as SQL text rather than through the DataFrame API:
a plan of hundreds of operators then costs one call into the JVM instead of thousands,
and Spark parses, optimizes and runs it as one job. Relations are referred to by name
(a temp view of a stored batch, or a named subquery of the statement being built).
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Sequence

from factflow.arrangement.batch import DIFF
from factflow.model.types import INT64_MIN, Kind, ident, sql_type, to_utc_naive

__all__ = ["DIFF", "ident", "literal", "sql_type", "select", "join", "semijoin", "consolidate", "present",
           "union", "where", "empty"]

def literal(value, kind: Kind) -> str:
    """A SQL literal of ``value`` as a ``kind``."""
    if value is None:
        return f"CAST(NULL AS {sql_type(kind)})"
    if kind is Kind.LONG:
        value = int(value)
        return f"CAST('{value}' AS BIGINT)" if value == INT64_MIN else f"{value}L"
    if kind is Kind.DOUBLE:
        value = float(value)
        text = "Infinity" if value == math.inf else "-Infinity" if value == -math.inf else repr(value)
        return f"CAST('{text}' AS DOUBLE)"
    if kind is Kind.BOOLEAN:
        return "TRUE" if value else "FALSE"
    if kind is Kind.INSTANT:
        stamp = to_utc_naive(value) if isinstance(value, _dt.datetime) else value
        return f"TIMESTAMP_NTZ '{stamp.isoformat(sep=' ', timespec='microseconds')}'"
    text = str(value)
    escaped = (text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
               .replace("\r", "\\r").replace("\t", "\\t"))
    return f"'{escaped}'"


def _cols(names: Sequence[str], alias: str | None = None) -> list[str]:
    prefix = f"{alias}." if alias else ""
    return [prefix + ident(n) for n in names]


def select(relation: str, names: Sequence[str], diff: str = DIFF) -> str:
    """Keep ``names`` and the diff (a multiset projection: nothing is consolidated)."""
    diff_expr = ident(DIFF) if diff == DIFF else f"{diff} AS {ident(DIFF)}"
    return f"SELECT {', '.join(_cols(names) + [diff_expr])} FROM {relation}"


def join(left: str, left_names: Sequence[str], right: str, right_names: Sequence[str],
         on: Sequence[str], hint: str | None = None) -> str:
    """Natural join on ``on`` multiplying diffs; output columns: left's, then right's others.

    With no shared columns the result is the cartesian product. ``hint``: a Spark join
    strategy hint for the right side (``MERGE``, ``BROADCAST``, ...).
    """
    outs = _cols(left_names, "l") + _cols([n for n in right_names if n not in on], "r")
    outs.append(f"l.{ident(DIFF)} * r.{ident(DIFF)} AS {ident(DIFF)}")
    condition = " AND ".join(f"l.{ident(c)} = r.{ident(c)}" for c in on)
    kind = f"JOIN {right} r ON {condition}" if on else f"CROSS JOIN {right} r"
    hinted = f"/*+ {hint}(r) */ " if hint else ""
    return f"SELECT {hinted}{', '.join(outs)} FROM {left} l {kind}"


def semijoin(relation: str, keys: str, on: Sequence[str], anti: bool = False) -> str:
    """Rows of ``relation`` whose ``on`` columns appear (or, with ``anti``, do not) in ``keys``."""
    condition = " AND ".join(f"t.{ident(c)} = k.{ident(c)}" for c in on)
    kind = "LEFT ANTI" if anti else "LEFT SEMI"
    key_cols = ", ".join(_cols(on))
    return f"SELECT t.* FROM {relation} t {kind} JOIN (SELECT DISTINCT {key_cols} FROM {keys}) k ON {condition}"


def consolidate(relation: str, names: Sequence[str]) -> str:
    """Sum diffs per distinct row and drop rows whose diff is zero."""
    group = ", ".join(_cols(names))
    total = f"SUM({ident(DIFF)})"
    if not names:
        return f"SELECT {total} AS {ident(DIFF)} FROM {relation} HAVING {total} <> 0"
    return f"SELECT {group}, {total} AS {ident(DIFF)} FROM {relation} GROUP BY {group} HAVING {total} <> 0"


def present(updates: str, names: Sequence[str]) -> str:
    """The set an update stream describes: rows whose diffs sum to a positive count, each once."""
    return f"{select(f'({consolidate(updates, names)})', names, diff='CAST(1 AS BIGINT)')} WHERE {ident(DIFF)} > 0"


def touched(relation: str, names: Sequence[str]) -> str:
    """The distinct values of ``names`` in ``relation`` (whatever their diffs), each once with
    diff 1: the keys a change touches, to probe or read by."""
    return f"SELECT DISTINCT {', '.join(_cols(names))}, CAST(1 AS BIGINT) AS {ident(DIFF)} FROM {relation}"


def union(relations: Sequence[str], names: Sequence[str]) -> str:
    """Concatenate Z-sets, taking ``names`` and the diff from each."""
    return " UNION ALL ".join(f"({select(r, names)})" for r in relations)


def where(relation: str, condition: str) -> str:
    """Rows satisfying a SQL condition."""
    return f"SELECT * FROM {relation} WHERE {condition}"


def empty(columns: Sequence[tuple[str, Kind]]) -> str:
    """An empty Z-set with the given columns. Written as a filter that is always false,
    which Spark's optimizer turns into an empty relation and propagates: joins with it,
    grouped aggregates over it and union branches of it drop out of the plan (an install
    reads every old state as empty; ``FROM range(0)`` kept a stage of tasks per read)."""
    outs = [f"CAST(NULL AS {sql_type(k)}) AS {ident(n)}" for n, k in columns]
    outs.append(f"CAST(0 AS BIGINT) AS {ident(DIFF)}")
    return f"SELECT {', '.join(outs)} WHERE FALSE"
