"""Building one SQL statement from named subqueries."""

from __future__ import annotations

import re

__all__ = ["Statement"]

_NAME = re.compile(r"__r\d+\b")


class Statement:
    """Named subqueries; :meth:`render` puts the ones a query uses into its ``WITH`` clause.

    Naming a subquery lets many operators refer to it while it is written only once.
    """

    def __init__(self) -> None:
        self._defs: dict[str, str] = {}

    def define(self, sql: str) -> str:
        """Name a subquery; returns the name to use in FROM clauses."""
        name = f"__r{len(self._defs) + 1}"
        self._defs[name] = sql
        return name

    def render(self, sql: str) -> str:
        """``sql`` preceded by the named subqueries it (transitively) uses."""
        needed: list[str] = []
        seen: set[str] = set()

        def visit(text: str) -> None:
            for name in _NAME.findall(text):
                if name in seen or name not in self._defs:
                    continue
                seen.add(name)
                visit(self._defs[name])
                needed.append(name)

        visit(sql)
        if not needed:
            return sql
        ctes = ",\n".join(f"{name} AS ({self._defs[name]})" for name in needed)
        return f"WITH {ctes}\n{sql}"
