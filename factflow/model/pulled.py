"""The value a pull expression gives for one entity: a read-only, hashable nested mapping.

Query results are rows of hashable values (``{row: multiplicity}``, and subscribers get
``(row, diff)`` pairs), so a pulled entity is a :class:`PullMap`, not a dict. Its keys are
attribute names as text with the leading colon (``":person/name"``, ``":db/id"``); a
cardinality-one attribute maps to its value (or, for a ref, a nested PullMap), a set or raw
attribute to a tuple of values sorted where they compare (nested PullMaps by entity id).
:meth:`PullMap.to_dict` gives plain dicts and lists, the shape ``Engine.pull`` returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

__all__ = ["PullMap"]


class PullMap(Mapping):
    """A pulled entity: an immutable mapping from attribute names to values (see the module docs)."""

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping[str, Any]):
        self._items = dict(items)
        self._hash: int | None = None

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._items.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PullMap):
            return self._items == other._items
        return NotImplemented

    def to_dict(self) -> dict[str, Any]:
        """The same entity as plain dicts, with lists for many-valued attributes."""
        return {k: _plain(v) for k, v in self._items.items()}

    def __repr__(self) -> str:
        return f"PullMap({self._items!r})"


def _plain(value: Any) -> Any:
    if isinstance(value, PullMap):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
