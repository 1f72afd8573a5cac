"""Turning collected result frames into Python rows (the types users see)."""

from __future__ import annotations

import datetime as _dt
from typing import Sequence

import pandas as pd

from factflow.model.frames import consolidated
from factflow.model.types import Kind

__all__ = ["python_rows", "changes_from_frame"]


def _column_values(series: pd.Series, kind: Kind) -> list:
    if kind is Kind.INSTANT:
        stamps = pd.to_datetime(series)
        return [ts.to_pydatetime().replace(tzinfo=_dt.timezone.utc) for ts in stamps]
    return series.tolist()


def python_rows(frame: pd.DataFrame, columns: Sequence[tuple[str, Kind]]) -> list[tuple]:
    """Rows of ``frame``'s ``columns`` as tuples of int / float / str / bool / aware datetime."""
    if not columns:
        return [()] * len(frame)
    values = [_column_values(frame[name], kind) for name, kind in columns]
    return list(zip(*values))


def changes_from_frame(frame: pd.DataFrame, columns: Sequence[tuple[str, Kind]], diff: str) -> list[tuple[tuple, int]]:
    """Consolidated ``(row, diff)`` pairs of ``frame`` projected onto ``columns``."""
    frame = consolidated(frame, [n for n, _ in columns], diff)
    return list(zip(python_rows(frame, columns), frame[diff].astype("int64").tolist()))
