"""Attributes: the named binary relations facts belong to, with their value type and input semantics."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from factflow.edn import Keyword
from factflow.errors import SchemaError, UnknownAttributeError
from factflow.model.types import VALUE_TYPES, Kind, kind_of_type

__all__ = ["Attribute", "Schema", "SEMANTICS", "normalize_attribute_name"]

SEMANTICS = ("set", "raw", "one")
_NAME_RE = re.compile(r":[A-Za-z*+!\-_?][A-Za-z0-9.*+!\-_?$%&=<>]*(/[A-Za-z*+!\-_?][A-Za-z0-9.*+!\-_?$%&=<>]*)?$")


def normalize_attribute_name(name: object) -> Keyword:
    """Turn ``":person/name"`` (or a Keyword) into a Keyword, rejecting malformed names."""
    if isinstance(name, Keyword):
        text = str.__str__(name)
    elif isinstance(name, str):
        text = name
    else:
        raise SchemaError(f"attribute name must be a keyword string like ':person/name', not {name!r}")
    if not _NAME_RE.match(text) or text.startswith(":db/"):
        raise SchemaError(f"invalid attribute name {text!r}: use a keyword like ':person/name' (':db/' is reserved)")
    return Keyword(text)


@dataclass(frozen=True)
class Attribute:
    """One attribute: ``name`` (``:ns/name``), ``value_type``, input ``semantics`` and a numeric id.

    Semantics: ``set`` (a fact is present or not), ``raw`` (a multiset: each assertion adds
    one occurrence, each retraction removes one) or ``one`` (cardinality one: asserting a
    new value for an entity retracts its previous value). ``slack``: how many closed
    epochs before the latest its forward index keeps distinct (uncompacted; see
    :mod:`factflow.engine.history`).
    """

    name: Keyword
    value_type: str
    semantics: str
    id: int
    slack: int = 0

    @property
    def kind(self) -> Kind:
        """Physical kind of this attribute's values."""
        return kind_of_type(self.value_type)

    @property
    def is_set(self) -> bool:
        """Whether every fact of this attribute has multiplicity at most one."""
        return self.semantics in ("set", "one")


class Schema:
    """The registry of attributes known to an engine."""

    def __init__(self) -> None:
        self._by_name: dict[Keyword, Attribute] = {}
        self._by_id: list[Attribute] = []

    def create(self, name: object, value_type: str, semantics: str = "set",
               log: Callable[[Attribute], None] | None = None, slack: int = 0) -> Attribute:
        """Define an attribute; defining the same attribute identically again is a no-op.

        A new attribute is passed to ``log`` before it is added (if it raises, nothing is)."""
        key = normalize_attribute_name(name)
        if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
            raise SchemaError(f"attribute {key}: slack must be a non-negative integer, not {slack!r}")
        if value_type not in VALUE_TYPES:
            raise SchemaError(f"attribute {key}: unknown type {value_type!r}; use one of {', '.join(VALUE_TYPES)}")
        if semantics not in SEMANTICS:
            raise SchemaError(f"attribute {key}: unknown semantics {semantics!r}; use one of {', '.join(SEMANTICS)}")
        existing = self._by_name.get(key)
        if existing is not None:
            if (existing.value_type, existing.semantics, existing.slack) == (value_type, semantics, slack):
                return existing
            raise SchemaError(
                f"attribute {key} already exists as {existing.value_type}/{existing.semantics} (slack "
                f"{existing.slack}); cannot redefine it as {value_type}/{semantics} (slack {slack})"
            )
        attribute = Attribute(key, value_type, semantics, len(self._by_id), slack)
        if log is not None:
            log(attribute)
        self._by_name[key] = attribute
        self._by_id.append(attribute)
        return attribute

    def get(self, name: object, context: str = "") -> Attribute:
        """The attribute called ``name``; raises UnknownAttributeError naming it otherwise."""
        try:
            key = name if isinstance(name, Keyword) else normalize_attribute_name(name)
        except SchemaError as exc:
            raise UnknownAttributeError(f"{context}{exc}") from exc
        attribute = self._by_name.get(key)
        if attribute is None:
            raise UnknownAttributeError(f"{context}unknown attribute {key}; create it with create_attribute first")
        return attribute

    def by_id(self, attribute_id: int) -> Attribute:
        """The attribute with numeric id ``attribute_id``."""
        return self._by_id[attribute_id]

    def __contains__(self, name: object) -> bool:
        try:
            return normalize_attribute_name(name) in self._by_name
        except SchemaError:
            return False

    def __iter__(self):
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)
