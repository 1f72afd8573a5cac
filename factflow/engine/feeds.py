"""Attribute feeds: every effective change of one attribute, epoch by epoch.

A feed is what a client subscribes to when it wants the raw changes of an attribute
rather than a query's result (3DF's attribute subscriptions): ``(entity, value)`` rows
with their diffs, as the transaction really changed the attribute (an assertion of a
present fact is no change; a new value of a cardinality-one attribute retracts the old).
The changes are the ones the epoch appends to the attribute's arrangement, so a feed
costs nothing while nobody listens and, while someone does, at most one collect of a
bulk epoch's changes.
"""

from __future__ import annotations

from typing import Callable

import pandas as pd

from factflow.arrangement.batch import DIFF
from factflow.engine.rows import changes_from_frame
from factflow.model.schema import Attribute
from factflow.model.types import Kind

__all__ = ["AttributeFeed", "AttributeSubscriber"]

AttributeSubscriber = Callable[[int, list], None]


class AttributeFeed:
    """The subscribers to one attribute's changes."""

    def __init__(self, attribute: Attribute):
        self.attribute = attribute
        self.name = str(attribute.name)
        self._subscribers: list[AttributeSubscriber] = []

    @property
    def subscribers(self) -> tuple[AttributeSubscriber, ...]:
        """The functions subscribed now."""
        return tuple(self._subscribers)

    def add(self, fn: AttributeSubscriber) -> None:
        """Subscribe ``fn``."""
        self._subscribers.append(fn)

    def remove(self, fn: AttributeSubscriber) -> None:
        """Unsubscribe ``fn`` (no error if it is not subscribed)."""
        if fn in self._subscribers:
            self._subscribers.remove(fn)

    def changes(self, frame: pd.DataFrame) -> list[tuple[tuple, int]]:
        """An epoch's changes ``(e, v, _diff)`` as ``((e, v), diff)`` pairs."""
        return changes_from_frame(frame, [("e", Kind.LONG), ("v", self.attribute.kind)], DIFF)
