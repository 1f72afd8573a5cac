"""Parsing Datomic pull patterns: ``[:a/b * {:ref/c [:d/e]} :db/id]``.

The grammar accepted is the part of Datomic's that factflow maintains incrementally:

    pattern   = [ item+ ]
    item      = attribute | '*' | "*" | { attribute pattern ... }
    attribute = keyword such as :person/name, or :db/id

Attribute expressions (``(:a :limit 10)``, ``[:a :as "x"]``, defaults), reverse
attributes (``:person/_knows``) and recursion limits (``{:a ...}``) are rejected with a
:class:`QueryError` naming them. Whether an attribute exists, and whether a nested map's
attribute is a reference, is checked by the planner (:mod:`factflow.planner.pull`).
"""

from __future__ import annotations

from typing import Any

from factflow.edn import EdnList, EdnVector, Keyword, Symbol, write
from factflow.errors import QueryError
from factflow.lang.ast import Pull, PullAttr, PullItem, PullNested, PullPattern, PullWildcard, Var

__all__ = ["parse_pull", "parse_pull_pattern", "DB_ID"]

#: the pseudo-attribute naming the entity itself
DB_ID = ":db/id"


def _where(form: Any) -> str:
    line = getattr(form, "line", None)
    return f" (line {line}, column {form.column})" if line is not None else ""


def parse_pull(form: EdnList) -> Pull:
    """The find element ``(pull ?e pattern)`` (``(pull $ ?e pattern)`` also accepted)."""
    items = list(form[1:])
    if items and items[0] == Symbol("$"):
        items = items[1:]
    if len(items) != 2:
        raise QueryError(f"pull takes a variable and a pattern: {write(form)}{_where(form)}")
    var, pattern = items
    if not (isinstance(var, Symbol) and var.startswith("?") and len(var) > 1):
        raise QueryError(f"pull needs an entity variable like ?e, found {write(var)} in {write(form)}{_where(form)}")
    if isinstance(pattern, Symbol):
        raise QueryError(f"pull patterns must be given literally, not as {pattern}: {write(form)}{_where(form)}")
    return Pull(Var(str.__str__(var)), parse_pull_pattern(pattern, write(form)), form)


def parse_pull_pattern(form: Any, context: str | None = None) -> PullPattern:
    """A pull pattern from its EDN form (a vector); a QueryError naming the bad item otherwise."""
    context = context or write(form)
    if not isinstance(form, EdnVector):
        raise QueryError(f"a pull pattern must be a vector like [:person/name], found {write(form)} "
                         f"in {context}{_where(form)}")
    if not form:
        raise QueryError(f"empty pull pattern [] in {context}{_where(form)}")
    items: list[PullItem] = []
    for item in form:
        for parsed in _items(item, context):
            if parsed in items:
                continue
            name = getattr(parsed, "name", None)
            if name is not None and any(getattr(i, "name", None) == name for i in items):
                raise QueryError(f"pull pattern {context} names {name} twice, in different forms")
            items.append(parsed)
    return PullPattern(tuple(items))


def _items(form: Any, context: str) -> list[PullItem]:
    if isinstance(form, Keyword):
        return [PullAttr(_attribute(form, context))]
    if form == Symbol("*") or (type(form) is str and form == "*"):
        return [PullWildcard()]
    if isinstance(form, dict):
        if not form:
            raise QueryError(f"empty map {{}} in pull pattern {context}")
        out: list[PullItem] = []
        for key, sub in form.items():
            if not isinstance(key, Keyword):
                raise QueryError(f"a pull map's key must be a ref attribute, found {write(key)} in {context}"
                                 f"{_where(key)}")
            if str.__str__(key) == DB_ID:
                raise QueryError(f":db/id cannot be followed by a nested pattern in {context}")
            if isinstance(sub, (Symbol, int)) and not isinstance(sub, bool):
                raise QueryError(f"recursion limits ({write(key)} {write(sub)}) are not supported in pull "
                                 f"pattern {context}")
            out.append(PullNested(_attribute(key, context), parse_pull_pattern(sub, context)))
        return out
    if isinstance(form, (EdnList, EdnVector)):
        raise QueryError(f"attribute expressions such as {write(form)} (limits, defaults, :as) are not "
                         f"supported in pull pattern {context}{_where(form)}")
    raise QueryError(f"bad pull pattern item {write(form)} in {context}{_where(form)}")


def _attribute(name: Keyword, context: str) -> Keyword:
    local = str.__str__(name).rpartition("/")[2]
    if local.startswith("_"):
        raise QueryError(f"reverse attributes such as {name} are not supported in pull pattern {context}")
    return Keyword(str.__str__(name))
