"""Offsets per source: what makes replayed input exactly-once.

A source (a Structured Streaming query's ``foreachBatch``, a file or Kafka reader, a
client) numbers its transactions with increasing offsets and passes them with
``transact(tx, source=NAME, offset=N)``. The engine records, atomically with the epoch
(in its log record, see :mod:`factflow.engine.durability`), the offset each epoch
applied per source. A transaction whose offset is at or below the latest recorded one
for its source was applied already: it is skipped and the caller learns the epoch whose
state includes it, the epoch of the smallest recorded offset at or above it. Replaying a
batch after a crash (Spark's ``batchId`` again) therefore changes nothing.

The latest ``history`` offsets per source are kept with their epochs (in memory and in
checkpoints); a replay older than those is still skipped, and answered with the oldest
epoch kept, which includes it.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Mapping

from factflow.errors import TransactionError

__all__ = ["SourceOffsets", "check_offset"]


def check_offset(source: object, offset: object) -> tuple[str, int] | None:
    """``(source, offset)`` checked, or None when neither is given; TransactionError otherwise."""
    if source is None and offset is None:
        return None
    if not isinstance(source, str) or not source:
        raise TransactionError(f"a transaction's source must be a non-empty string, not {source!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or not -2**63 <= offset < 2**63:
        raise TransactionError(f"the offset of source {source!r} must be a 64-bit integer, not {offset!r}")
    return source, offset


class SourceOffsets:
    """Per source, the offsets recorded and the epochs that applied them (ascending)."""

    def __init__(self, history: int = 10_000):
        self.history = history
        self._offsets: dict[str, list[int]] = {}
        self._epochs: dict[str, list[int]] = {}

    def latest(self) -> dict[str, int]:
        """``{source: latest offset}``."""
        return {source: offsets[-1] for source, offsets in self._offsets.items()}

    def applied(self, source: str, offset: int) -> int | None:
        """The epoch whose state includes ``offset`` of ``source`` if it was applied, else None."""
        offsets = self._offsets.get(source)
        if not offsets or offset > offsets[-1]:
            return None
        return self._epochs[source][bisect_left(offsets, offset)]

    def record(self, offsets: Mapping[str, int], epoch: int) -> None:
        """Record that ``epoch`` applied ``offsets`` (each above the latest of its source)."""
        for source, offset in offsets.items():
            kept = self._offsets.setdefault(source, [])
            epochs = self._epochs.setdefault(source, [])
            kept.append(offset)
            epochs.append(epoch)
            if len(kept) > self.history:
                del kept[:len(kept) - self.history]
                del epochs[:len(epochs) - self.history]

    def to_json(self) -> dict[str, list[list[int]]]:
        """``{source: [[offset, epoch], ...]}`` (what checkpoints store)."""
        return {s: [[o, e] for o, e in zip(self._offsets[s], self._epochs[s])] for s in self._offsets}

    def load(self, pairs: Mapping[str, list[list[int]]]) -> None:
        """Replace the recorded offsets with ``{source: [[offset, epoch], ...]}`` (ascending)."""
        self._offsets, self._epochs = {}, {}
        for source, entries in pairs.items():
            for offset, epoch in entries:
                self.record({source: offset}, epoch)
