"""The 22 TPC-H queries in factflow's Datalog (``qNN.edn``) beside DuckDB's SQL (``qNN.sql``),
and how their answers are compared.

A ``qNN.edn`` file is an EDN map: ``:query`` the query, ``:rules`` the rules it calls
(named ``qNN-...``, so that every query's rules can be registered on one engine). Its
``:find`` lists the SQL ``SELECT``'s columns in their order, so rows compare position by
position. ORDER BY and LIMIT are left out of both: the maintained result is the whole
grouped answer, and its order is the reader's to choose.

Numbers are compared with a relative tolerance of 1e-9 and an absolute one of 1e-6
(:data:`REL_TOL`, :data:`ABS_TOL`): factflow sums doubles where DuckDB sums decimals, in
another order. SQL answers an aggregate over no rows with one row of NULLs, Datalog with
no row: DuckDB's all-NULL row counts as none.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import os
from dataclasses import dataclass
from typing import Any, Iterable

from factflow import edn

__all__ = ["TpchQuery", "QUERIES", "REL_TOL", "ABS_TOL", "canonical_rows", "difference"]

HERE = os.path.dirname(os.path.abspath(__file__))
REL_TOL, ABS_TOL = 1e-9, 1e-6


@dataclass(frozen=True)
class TpchQuery:
    """One TPC-H query: its number, rules (EDN text, or None), query (EDN text) and SQL."""

    number: int
    rules: str | None
    query: str
    sql: str

    @property
    def name(self) -> str:
        """``q01`` ... ``q22``."""
        return f"q{self.number:02d}"


def _read(number: int) -> TpchQuery:
    stem = os.path.join(HERE, f"q{number:02d}")
    with open(stem + ".edn") as f:
        form = edn.read(f.read())
    with open(stem + ".sql") as f:
        sql = f.read()
    rules = form.get(edn.Keyword(":rules"))
    return TpchQuery(number, edn.write(rules) if rules is not None else None,
                     edn.write(form[edn.Keyword(":query")]), sql)


#: The expressed queries, by number
QUERIES: dict[int, TpchQuery] = {n: _read(n) for n in range(1, 23) if os.path.exists(os.path.join(HERE, f"q{n:02d}.edn"))}


def _value(value: Any) -> Any:
    """A cell as both sides are compared: decimals as floats, dates as midnight, instants
    as naive UTC."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day)
    return value


def canonical_rows(rows: Iterable[tuple]) -> list[tuple]:
    """Rows with comparable cells, sorted (floats rounded for the order only)."""
    cells = [tuple(_value(v) for v in row) for row in rows]
    return sorted(cells, key=lambda row: tuple((type(v).__name__ if not isinstance(v, (int, float)) else "number",
                                                round(v, 4) if isinstance(v, float) else v) for v in row))


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return a == b


def difference(ours: Iterable[tuple], theirs: Iterable[tuple]) -> str | None:
    """None when the two answers are the same rows (numbers within the tolerances), else
    what differs first."""
    left = canonical_rows(ours)
    right = canonical_rows(row for row in theirs if any(v is not None for v in row))
    if len(left) != len(right):
        return f"{len(left)} rows against DuckDB's {len(right)}: first ours {left[:3]}, DuckDB's {right[:3]}"
    for a, b in zip(left, right):
        if len(a) != len(b) or not all(_close(x, y) for x, y in zip(a, b)):
            return f"row {a} against DuckDB's {b}"
    return None
