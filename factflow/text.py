"""Wording shared by messages: a count with its noun in the right number."""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``count`` and ``noun``, the noun plural unless the count is one: ``plural(1,
    "argument")`` is "1 argument", ``plural(2, "argument")`` "2 arguments",
    ``plural(3, "query", "queries")`` "3 queries"; counts of a thousand and more are grouped
    ("1,000,000 rows")."""
    return f"{count:,} {noun if count == 1 else plural_form or noun + 's'}"
