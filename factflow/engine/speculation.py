"""Small epochs in one Spark job: the transaction's effective changes guessed, and the guess
checked by Spark inside the queries' job.

A small epoch needs its effective changes (the transaction against the current state of
the entities it touches: :mod:`factflow.engine.apply`) before its queries can read them,
and computing them is a Spark job of its own. Most small transactions change exactly
what they say: they assert facts not yet present and retract facts that are. So the
engine *guesses* that: it appends the transaction's operations to the arrangements as the
epoch's changes, and the queries' first fetch (:class:`factflow.engine.evaluation.Evaluation`)
computes, beside the queries' rows and in the same job, where the guess and the effective
changes Spark computes from the state differ. No difference, and the epoch took one job
instead of two. A difference (an assertion of a present fact, a new value displacing a
cardinality-one attribute's current one, a transaction Spark rejects), and the epoch is
rolled back and run again the usual way (:func:`factflow.engine.epoch.run_epoch`); the
attributes that differed are not guessed for the next :data:`PAUSE` epochs, twice as many
after each further wrong guess (up to :data:`LONGEST_PAUSE`), so a stream of updates to
existing entities pays for a wrong guess rarely, not every epoch; two wrong guesses in a
row pause every guess the same way (:class:`Guesses`). Transactions of more
than :data:`GUESSED_OPERATIONS` operations are not guessed: what a wrong guess wastes (the
queries' evaluation) grows with the transaction, the job it saves does not. (In
``benchmarks/epoch_latency.py`` a wrong guess on 10,000 operations cost an epoch 8.9-9.3 s
against 4.1-4.9 s.)

Spark stays the authority: nothing the guess put in is committed unless Spark's own
effective changes equal it, row for row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from factflow.arrangement import bound
from factflow.arrangement.batch import DIFF, PANDAS_DTYPES
from factflow.dataflow.context import EpochContext
from factflow.engine import transaction
from factflow.engine.apply import current_states
from factflow.model.types import Kind

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.state import EngineState

__all__ = ["Speculation", "Misspeculated", "Guesses", "speculate", "PAUSE", "LONGEST_PAUSE", "GUESSED_OPERATIONS"]

#: Epochs during which an attribute whose guess was wrong is not guessed again (after its
#: first wrong guess; each further one doubles it, up to LONGEST_PAUSE).
PAUSE = 32
LONGEST_PAUSE = 4096
#: The most operations a guessed transaction has.
GUESSED_OPERATIONS = 1000

_SLOTS = ", ".join(f"`{transaction.SLOT[k]}`" for k in Kind)


class Misspeculated(Exception):
    """The effective changes Spark computed differ from the guess (internal: the epoch is run
    again without one)."""

    def __init__(self, attributes: set[int]):
        super().__init__(f"the guessed changes of attributes {sorted(attributes)} were not the effective ones")
        self.attributes = attributes


@dataclass
class Speculation:
    """A guess appended to the arrangements, and the relation that checks it.

    ``check`` names a relation of the evaluation's context with a row (column ``a``, the
    attribute id) for every change where the guess and the effective changes differ and
    every error Spark found in the transaction: none when the guess is right."""

    check: str
    attributes: set[int]
    changed: dict[int, int] = field(default_factory=dict)
    watched: dict[int, pd.DataFrame] = field(default_factory=dict)


def speculate(state: "EngineState", prepared: transaction.PreparedTransaction, epoch: int,
              cx: EpochContext) -> Speculation | None:
    """Append the guess of a small transaction's effective changes for ``epoch`` and define
    the relation checking it in ``cx`` (the context the epoch's queries are evaluated in);
    None, with nothing appended, when the epoch is not guessed: guessing is off
    (``EngineConfig.guess_changes``), a transaction of more than :data:`GUESSED_OPERATIONS`, one
    whose operations repeat a fact, one that a pause after wrong guesses excludes (see
    :class:`Guesses`), or one that no installed query reads (its one job computes
    the effective changes anyway)."""
    local = prepared.local
    if not state.config.guess_changes or not prepared.small or local is None or prepared.entities is None or not prepared.attributes:
        return None
    if len(local) > GUESSED_OPERATIONS:
        return None
    ids = {a.id for a in prepared.attributes}
    if not state.guesses.allowed(ids, epoch):
        return None
    if not any(state.schema.get(a).id in ids for q in state.queries.values() for a in q.dataflow.attributes):
        return None
    slots = [transaction.SLOT[k] for k in Kind]
    rows = local[local["e"].notna() & local[slots].notna().any(axis=1) & local["a"].isin(ids)]
    if rows.duplicated(["a", "e", *slots]).any():
        return None
    tx_view, registered = prepared.relation(cx.spark)
    if registered:
        cx.views.append(registered)
    current, probed = current_states(cx, state, prepared, tx_view, epoch - 1)
    changes = transaction.changes_relation(cx, tx_view, prepared, current, inline_entities=bound.current() is None,
                                           probed=probed)
    guess = (f"SELECT `a`, `e`, {_SLOTS}, CAST(`op` AS BIGINT) AS `{DIFF}`, false AS `bad`, -1L AS `w` FROM {tx_view} "
             f"WHERE {transaction.fact_operations(ids)}")
    both = (f"SELECT `a`, `e`, {_SLOTS}, `{DIFF}`, `{transaction.ERR}` IS NOT NULL AS `bad`, 1L AS `w` FROM {changes} "
            f"UNION ALL {guess}")
    check = cx.define(f"SELECT `a` FROM (SELECT `a`, `bad`, SUM(`w`) AS `w` FROM ({both}) "
                      f"GROUP BY `a`, `e`, {_SLOTS}, `{DIFF}`, `bad`) WHERE `w` <> 0 OR `bad`")
    speculation = Speculation(check, ids)
    for attribute in prepared.attributes:
        part = rows[rows["a"] == attribute.id]
        if part.empty:
            continue
        values = part[transaction.SLOT[attribute.kind]].astype(PANDAS_DTYPES[attribute.kind])
        frame = pd.DataFrame({"e": part["e"].to_numpy(dtype="int64"), "v": values.to_numpy(),
                              DIFF: part["op"].to_numpy(dtype="int64")})
        state.arrangements[attribute.id].apply_pandas(frame, epoch)
        speculation.changed[attribute.id] = len(frame)
        if state.watched(attribute.id):
            speculation.watched[attribute.id] = frame
    return speculation


@dataclass
class Guesses:
    """What an engine learned from its guesses: per attribute, when its changes may be
    guessed again and the pause that ends then; and for all attributes, the wrong guesses
    in a row and the epoch before which nothing is guessed.

    A wrong guess pauses the attributes that differed for :data:`PAUSE` epochs, or twice
    their last pause (up to :data:`LONGEST_PAUSE`). Wrong guesses in a row, on whatever
    attributes (a stream whose transactions often repeat facts or displace values: the
    oracle streams of the tests), pause every guess the same way, each evaluation thrown
    away costing the queries' statement; a right guess ends the row."""

    attributes: dict[int, tuple[int, int]] = field(default_factory=dict)
    in_a_row: int = 0
    everything: tuple[int, int] = (0, PAUSE // 2)

    def allowed(self, attributes: set[int], epoch: int) -> bool:
        """Whether the changes of ``attributes`` may be guessed in ``epoch``."""
        return epoch >= self.everything[0] and not any(
            aid in self.attributes and epoch < self.attributes[aid][0] for aid in attributes)

    def wrong(self, attributes: set[int], epoch: int) -> None:
        """The guess of ``epoch`` was wrong about ``attributes``."""
        for aid in attributes:
            self.attributes[aid] = _doubled(self.attributes.get(aid), epoch)
        self.in_a_row += 1
        if self.in_a_row >= 2:
            self.everything = _doubled(self.everything, epoch)

    def right(self) -> None:
        """A guess was right."""
        self.in_a_row = 0


def _doubled(last: tuple[int, int] | None, epoch: int) -> tuple[int, int]:
    """The pause after a wrong guess in ``epoch``: ``PAUSE``, or twice the ``last`` one."""
    pause = min((last[1] if last else PAUSE // 2) * 2, LONGEST_PAUSE)
    return epoch + pause, pause
