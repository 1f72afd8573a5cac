"""Building one SQL statement from named subqueries."""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable

from factflow.arrangement.views import PARAMETERIZED_PROBE_PREFIX, PROBE_VIEW_PREFIX, one_partition

__all__ = ["Statement"]

#: a subquery's name, or a quoted string or identifier (skipped: names inside them are text)
_TOKEN = re.compile(r"'(?:[^'\\]|\\.)*'|`(?:[^`]|``)*`|\b(__r\d+)\b")
#: what may follow a relation in FROM or JOIN without being its alias
_NOT_ALIAS = re.compile(r"\s*(?:$|[),]|(?:AS|ON|WHERE|GROUP|HAVING|ORDER|LIMIT|UNION|EXCEPT|INTERSECT|JOIN|LEFT|"
                        r"RIGHT|INNER|FULL|CROSS|SEMI|ANTI|NATURAL|WINDOW)\b)")

#: a statement longer than this with its ``WITH`` entries inlined has entries computed once
#: instead: those whose inlining would copy more than ``INLINED_ENTRY_CHARACTERS`` (see :class:`Statement`)
INLINED_STATEMENT_CHARACTERS = 250_000
INLINED_ENTRY_CHARACTERS = 2_000
#: a probe's view (either kind: see :mod:`factflow.arrangement.views`)
_PROBE_VIEW = re.compile(rf"\b(?:{PROBE_VIEW_PREFIX}|{PARAMETERIZED_PROBE_PREFIX})\d+\b")
#: a ``WITH`` entry Spark computes once: a non-deterministic condition (always true) keeps
#: Spark's optimizer from inlining it where it is read
_COMPUTED_ONCE = "SELECT * FROM ({}) WHERE rand() >= 0"


class Statement:
    """Named subqueries; :meth:`render` writes out the ones a query uses.

    Naming a subquery lets many operators refer to it while it is written only once: a
    subquery referenced more than once goes into the statement's ``WITH`` clause, one
    referenced once is written in place, as a derived table. Spark inlines every ``WITH``
    entry anyway (factflow's subqueries are deterministic), but analysing and inlining them
    costs planning time that grows with their number: writing single references in place
    about halved the analysis of a small epoch's statement over five LDBC queries (44
    entries to 9; 0.35-0.44 s to 0.16-0.24 s on the slow day it was measured).

    Inlining copies an entry into every place it is read, and an entry read by entries that
    are themselves copied is copied as often as all of them together: the statements of a
    small epoch over the 22 TPC-H queries (130,000-180,000 characters, 3,000-4,000 operators
    as analysed) grew to 10,000-30,000 operators once optimized, and building and running
    them took 10-40 s. So when the statement inlined whole would be longer than
    :data:`INLINED_STATEMENT_CHARACTERS`, each entry whose inlining would copy more than
    :data:`INLINED_ENTRY_CHARACTERS` gets a condition Spark cannot prove true (``rand() >=
    0``): Spark then computes it once and reads its output wherever it is used (through an
    exchange it reuses). That cut those epochs to a third to a half. Smaller statements
    keep inlining everything: computing entries once in the small epochs of five or twenty
    LDBC queries (at most 130,000 characters inlined) made their 100-change epochs 3-4x
    slower, when an exchange made every such statement a Spark job whose plan could not be
    kept (now one into a single partition runs on the driver, :mod:`factflow.arrangement.bound`).

    Whatever the statement's length, an entry read more than once that probes a trace (reads
    a view :class:`~factflow.dataflow.context.EpochContext` registered for a probe, directly
    or through another entry) is computed once: inlined, every copy ran its probes again,
    each a Python worker in the statement's task (one small epoch of TPC-H's Q1, a pipeline
    of lookups whose every step keeps its state, ran 81 probes). Such a statement's plan
    runs again in later epochs only if it runs on the driver, which computes the exchange
    anew (a job would reuse its output); otherwise its analysed plan may
    (:mod:`factflow.arrangement.bound`).

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

    def define(self, sql: str, single_partition: bool | None = None) -> str:
        """Name a subquery; returns the name to use in FROM clauses. ``single_partition``
        overrides the statement's for this subquery."""
        name = f"__r{len(self._defs) + 1}"
        coalesce = self._single_partition if single_partition is None else single_partition
        if coalesce and (" JOIN " in sql or " UNION " in sql):
            sql = one_partition(f"({sql})")
        self._defs[name] = sql
        return name

    def render(self, sql: str, inline: bool = False) -> str:
        """``sql`` with the named subqueries it (transitively) uses: in a ``WITH`` clause
        those referenced more than once, in place the others; with ``inline``, every one in
        place (a view's definition, see :meth:`factflow.dataflow.context.EpochContext.view_statement`)."""
        needed: list[str] = []
        references: Counter[str] = Counter()

        def visit(text: str) -> None:
            for name in self._names(text):
                references[name] += 1
                if references[name] == 1:
                    visit(self._defs[name])
                    needed.append(name)

        visit(sql)
        shared = [] if inline else [name for name in needed if references[name] > 1]
        kept_named = set(shared)

        def expand(text: str) -> str:
            def replace(match: re.Match) -> str:
                name = match.group(1)
                if (name is None or name not in self._defs or name in kept_named
                        or text.startswith(".", match.end())):  # a qualifier: the relation's alias
                    return match.group(0)
                aliased = _NOT_ALIAS.match(text, match.end()) is None
                return f"({expand(self._defs[name])})" + ("" if aliased else f" {name}")
            return _TOKEN.sub(replace, text)

        body = expand(sql)
        if not shared:
            return body
        texts = {name: expand(self._defs[name]) for name in shared}
        computed_once = self._computed_once(body, texts, [name for name in reversed(needed) if name in texts])
        ctes = ",\n".join(f"{name} AS ({_COMPUTED_ONCE.format(texts[name]) if name in computed_once else texts[name]})"
                           for name in shared)
        return f"WITH {ctes}\n{body}"

    def _computed_once(self, body: str, texts: dict[str, str], parents_first: list[str]) -> set[str]:
        """The ``WITH`` entries (``texts``, in ``parents_first`` order) that Spark is to compute
        once rather than inline (see :class:`Statement`): the entries read more than once that
        probe a trace; and, when the statement with the others inlined would have more than
        :data:`INLINED_STATEMENT_CHARACTERS`, each entry whose inlining would copy more than
        :data:`INLINED_ENTRY_CHARACTERS`."""
        read_by_body = self._names(body)
        children = {name: self._names(texts[name]) for name in parents_first}
        probing: set[str] = set()
        for name in reversed(parents_first):  # children first
            if _PROBE_VIEW.search(texts[name]) or any(child in probing for child in children[name]):
                probing.add(name)
        reads, once = _reads(read_by_body, children, lambda name, read: read > 1 and name in probing)
        if len(body) + sum(reads[name] * len(texts[name]) for name in parents_first) <= INLINED_STATEMENT_CHARACTERS:
            return once
        return _reads(read_by_body, children, lambda name, read: (
            (read > 1 and name in probing) or (read - 1) * len(texts[name]) > INLINED_ENTRY_CHARACTERS))[1]

    def _names(self, text: str) -> list[str]:
        """The subquery names ``text`` refers to, once per reference (not inside quotes)."""
        return [m.group(1) for m in _TOKEN.finditer(text) if m.group(1) in self._defs]


def _reads(read_by_body: list[str], children: dict[str, list[str]],
           computed_once: Callable[[str, int], bool]) -> tuple[Counter[str], set[str]]:
    """How many times Spark reads each ``WITH`` entry (``children``: the entries each one
    reads, parents first), and the entries computed once: those for which
    ``computed_once(name, reads)`` holds. An entry computed once reads what it refers to
    once; an inlined one as often as it is read."""
    reads: Counter[str] = Counter(read_by_body)
    once: set[str] = set()
    for name, read in children.items():
        if computed_once(name, reads[name]):
            once.add(name)
        for child in read:
            reads[child] += 1 if name in once else reads[name]
    return reads, once
