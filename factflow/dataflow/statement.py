"""Building one SQL statement from named subqueries."""

from __future__ import annotations

import re

from factflow.arrangement.batch import one_partition

__all__ = ["Statement"]

_NAME = re.compile(r"__r\d+\b")


class Statement:
    """Named subqueries; :meth:`render` puts the ones a query uses into its ``WITH`` clause.

    Naming a subquery lets many operators refer to it while it is written only once.

    A ``single_partition`` statement (a small epoch's, planned with
    ``EngineConfig.small_conf``, whose local relations are coalesced into one partition
    where they are registered) puts every named subquery that joins or unions into one
    partition without a shuffle (a ``COALESCE(1)`` hint). Spark then sees every join and
    aggregate input as a single partition and plans no exchange between them, so the
    statement runs as one stage: a join's own output is not a single partition to Spark
    (it is a collection of its inputs' partitionings), nor is a union's, and without the
    hint every join above another join, and every aggregate over a union, shuffled into one
    partition, a stage of its own each. Projections, filters and aggregates keep their
    input's partitioning, so subqueries without a join or union are left as they are: each
    hint is one more operator for Spark to analyse and optimize. (The test is on the text:
    a constant that spells `` JOIN `` adds a hint that changes nothing.)
    """

    def __init__(self, single_partition: bool = False) -> None:
        self._defs: dict[str, str] = {}
        self._single_partition = single_partition

    def define(self, sql: str) -> str:
        """Name a subquery; returns the name to use in FROM clauses."""
        name = f"__r{len(self._defs) + 1}"
        if self._single_partition and (" JOIN " in sql or " UNION " in sql):
            sql = one_partition(f"({sql})")
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
