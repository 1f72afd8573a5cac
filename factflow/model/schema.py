"""Attributes: the named binary relations facts belong to, with their value type and input semantics."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from factflow.edn import Keyword
from factflow.errors import QueryError, SchemaError, UnknownAttributeError
from factflow.model.types import VALUE_TYPES, Kind, kind_of_type

__all__ = ["Attribute", "Schema", "SEMANTICS", "INDEX_DIRECTIONS", "QUERY_SUPPORT", "RESERVED_PREFIX",
           "normalize_attribute_name", "support_allows"]

SEMANTICS = ("set", "raw", "one")
INDEX_DIRECTIONS = ("both", "forward")
"""Index directions an attribute keeps: ``both`` (e->v, and v->e when a query needs it) or ``forward`` (e->v only)."""
QUERY_SUPPORT = ("wco", "delta", "basic")
"""Join strategies an attribute supports, strongest first: ``wco`` (count indexes, every
strategy), ``delta`` (no count indexes: binary and delta), ``basic`` (binary only)."""
RESERVED_PREFIX = ":factflow."
"""Attribute namespaces starting with this are maintained by the engine (introspection)."""
_NAME_RE = re.compile(r":[A-Za-z*+!\-_?][A-Za-z0-9.*+!\-_?$%&=<>]*(/[A-Za-z*+!\-_?][A-Za-z0-9.*+!\-_?$%&=<>]*)?$")


def support_allows(support: str, strategy: str) -> bool:
    """Whether join strategy ``strategy`` (binary, delta, wco) may read an attribute with ``support``."""
    return QUERY_SUPPORT.index(support) <= {"wco": 0, "delta": 1}.get(strategy, 2)


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
    """One attribute: ``name`` (``:ns/name``), ``value_type``, input ``semantics``, a numeric
    id, the indexes it keeps (``index``, ``support``), its history (``slack``) and whether it
    is a tenant *parameter* (``parameter``: facts a tenant of a server writes about its own
    entity to parameterize the queries published for it; see :mod:`factflow.server.tenants`).

    Semantics: ``set`` (a fact is present or not), ``raw`` (a multiset: each assertion adds
    one occurrence, each retraction removes one) or ``one`` (cardinality one: asserting a
    new value for an entity retracts its previous value).

    ``index`` (:data:`INDEX_DIRECTIONS`) and ``support`` (:data:`QUERY_SUPPORT`) bound the
    faces of its shared arrangement (:meth:`keeps`) and the join strategies that may read
    it (:func:`support_allows`). ``slack``: how many closed epochs before the latest its forward
    index keeps distinct (uncompacted; see :mod:`factflow.engine.history`).
    """

    name: Keyword
    value_type: str
    semantics: str
    id: int
    index: str = "both"
    support: str = "wco"
    slack: int = 0
    parameter: bool = False

    def keeps(self, face: str) -> bool:
        """Whether this attribute may have the index ``face`` (forward, reverse, count_e, count_v)."""
        if face == "forward":
            return True
        if face == "reverse":
            return self.index == "both"
        if face == "count_e":
            return self.support == "wco"
        return self.support == "wco" and self.index == "both"

    def require(self, face: str) -> None:
        """A QueryError unless this attribute may have the index ``face`` (see :meth:`keeps`)."""
        if not self.keeps(face):
            raise QueryError(f"attribute {self.name} keeps no {face} index (index={self.index!r}, "
                             f"support={self.support!r})")

    @property
    def settings(self) -> dict[str, object]:
        """The settings as given to ``create_attribute`` beyond type and semantics (stored in
        the durable catalog)."""
        return {"index": self.index, "support": self.support, "slack": self.slack, "parameter": self.parameter}

    @property
    def reserved(self) -> bool:
        """Whether the engine maintains this attribute (introspection; users cannot write it)."""
        return str.__str__(self.name).startswith(RESERVED_PREFIX)

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
               log: Callable[[Attribute], None] | None = None, index: str = "both", support: str = "wco",
               slack: int = 0, reserved: bool = False, parameter: bool = False) -> Attribute:
        """Define an attribute; defining the same attribute identically again is a no-op.

        A new attribute is passed to ``log`` before it is added (if it raises, nothing is).
        Names under ``:factflow.`` are refused unless ``reserved`` (the engine's own)."""
        key = normalize_attribute_name(name)
        if str.__str__(key).startswith(RESERVED_PREFIX) and not reserved:
            raise SchemaError(f"invalid attribute name {key}: names under {RESERVED_PREFIX!r} are reserved "
                              "for the engine's introspection attributes")
        if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
            raise SchemaError(f"attribute {key}: slack must be a non-negative integer, not {slack!r}")
        if not isinstance(parameter, bool):
            raise SchemaError(f"attribute {key}: parameter must be true or false, not {parameter!r}")
        if value_type not in VALUE_TYPES:
            raise SchemaError(f"attribute {key}: unknown type {value_type!r}; use one of {', '.join(VALUE_TYPES)}")
        if semantics not in SEMANTICS:
            raise SchemaError(f"attribute {key}: unknown semantics {semantics!r}; use one of {', '.join(SEMANTICS)}")
        if index not in INDEX_DIRECTIONS:
            raise SchemaError(f"attribute {key}: unknown index {index!r}; use one of {', '.join(INDEX_DIRECTIONS)}")
        if support not in QUERY_SUPPORT:
            raise SchemaError(f"attribute {key}: unknown support {support!r}; use one of {', '.join(QUERY_SUPPORT)}")
        existing = self._by_name.get(key)
        wanted = (value_type, semantics, index, support, str(slack), str(parameter).lower())
        if existing is not None:
            have = (existing.value_type, existing.semantics, existing.index, existing.support, str(existing.slack),
                    str(existing.parameter).lower())
            if have == wanted:
                return existing
            raise SchemaError(
                f"attribute {key} already exists as {'/'.join(have)} (type/semantics/index/support/slack/parameter); "
                f"cannot redefine it as {'/'.join(wanted)}"
            )
        attribute = Attribute(key, value_type, semantics, len(self._by_id), index, support, slack, parameter)
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
