"""Parse EDN queries and rules into the AST of :mod:`factflow.lang.ast`.

The parser checks the *shape* of every form (what Datomic's grammar allows); meaning
(variable safety, types, attribute existence) is checked later by the planner.
"""

from __future__ import annotations

from typing import Any

from factflow import edn
from factflow.edn import EdnList, EdnVector, Keyword, Symbol, write
from factflow.errors import EdnSyntaxError, QueryError, RuleError
from factflow.lang.ast import (
    Aggregate, BindColl, Binding, BindRel, BindScalar, BindTuple, Blank, Clause, Const, FindSpec,
    FindVar, FnCall, InBinding, InRules, InSource, Input, Not, Or, Pattern, Predicate, Query, Rule,
    RuleCall, Term, Var,
)
from factflow.lang.pull import parse_pull

__all__ = ["parse_query", "parse_rules", "query_sections", "AGGREGATES"]

AGGREGATES = {
    "count", "count-distinct", "sum", "min", "max", "avg", "median", "variance", "stddev",
    "distinct", "sample", "rand",
}
_RESERVED_LISTS = {"not", "not-join", "or", "or-join", "and"}
_QUERY_KEYS = (":find", ":with", ":in", ":where")


def _where(form: Any) -> str:
    line = getattr(form, "line", None)
    return f" (line {line}, column {form.column})" if line is not None else ""


def _err(message: str, form: Any = None, cls=QueryError):
    suffix = _where(form) if form is not None else ""
    return cls(message + suffix)


def _read(text_or_form: Any, what: str, cls=QueryError) -> Any:
    if isinstance(text_or_form, str) and not isinstance(text_or_form, (Symbol, Keyword)):
        try:
            return edn.read(text_or_form)
        except EdnSyntaxError as exc:
            raise cls(f"malformed {what} EDN: {exc}") from exc
    if isinstance(text_or_form, (EdnVector, EdnList, dict, list, tuple)):
        return text_or_form
    raise cls(f"{what} must be EDN text, not {type(text_or_form).__name__}")


def _is_var(form: Any) -> bool:
    return isinstance(form, Symbol) and form.startswith("?") and len(form) > 1


def _is_src(form: Any) -> bool:
    return isinstance(form, Symbol) and form.startswith("$")


def _var(form: Any, context: str) -> Var:
    if not _is_var(form):
        raise _err(f"expected a variable like ?x in {context}, found {write(form)}", form)
    return Var(str.__str__(form))


def _term(form: Any, context: str) -> Term:
    if _is_var(form):
        return Var(str.__str__(form))
    if isinstance(form, Symbol):
        if form == Symbol("_"):
            return Blank()
        raise _err(f"unexpected symbol {form} in {context}; variables start with '?'", form)
    if isinstance(form, (EdnList, EdnVector, dict, frozenset)):
        raise _err(f"expected a variable, '_' or a constant in {context}, found {write(form)}", form)
    if form is None:
        raise _err(f"nil is not a valid value in {context}")
    return Const(form)


def _check_src(form: Any, context: str) -> None:
    if form != Symbol("$"):
        raise _err(f"only the default source $ is supported, found {form} in {context}", form)


# ---------------------------------------------------------------- bindings

def _binding(form: Any, context: str) -> Binding:
    if _is_var(form):
        return BindScalar(Var(str.__str__(form)))
    if isinstance(form, EdnVector):
        if len(form) == 2 and form[1] == Symbol("..."):
            return BindColl(_var(form[0], context))
        if len(form) == 1 and isinstance(form[0], EdnVector):
            elements = tuple(_bind_element(f, context) for f in form[0])
            if not elements:
                raise _err(f"empty relation binding in {context}", form)
            _check_unique(elements, form, context)
            return BindRel(elements)
        elements = tuple(_bind_element(f, context) for f in form)
        if not elements:
            raise _err(f"empty tuple binding in {context}", form)
        _check_unique(elements, form, context)
        return BindTuple(elements)
    raise _err(f"bad binding form {write(form)} in {context}", form)


def _bind_element(form: Any, context: str) -> Var | Blank:
    if form == Symbol("_"):
        return Blank()
    return _var(form, context)


def _check_unique(elements, form, context) -> None:
    seen = [e for e in elements if isinstance(e, Var)]
    if len(seen) != len(set(seen)):
        raise _err(f"a variable appears twice in binding {write(form)} in {context}", form)


# ---------------------------------------------------------------- clauses

def _clause(form: Any, context: str) -> Clause:
    if isinstance(form, EdnVector):
        if not form:
            raise _err(f"empty clause [] in {context}", form)
        if isinstance(form[0], EdnList):
            return _expression_clause(form, context)
        return _pattern(form, context)
    if isinstance(form, EdnList):
        if not form:
            raise _err(f"empty clause () in {context}", form)
        items = list(form)
        if _is_src(items[0]):
            _check_src(items[0], write(form))
            items = items[1:]
            if not items:
                raise _err(f"clause {write(form)} names only a source", form)
        head = items[0]
        if not isinstance(head, Symbol) or _is_var(head):
            raise _err(f"a list clause must start with not, not-join, or, or-join or a rule name: {write(form)}", form)
        name = str.__str__(head)
        if name == "not":
            return Not(None, _clauses(items[1:], form, "not"), form)
        if name == "not-join":
            if len(items) < 3:
                raise _err(f"not-join needs a variable vector and at least one clause: {write(form)}", form)
            return Not(_join_vars(items[1], form), _clauses(items[2:], form, "not-join"), form)
        if name == "or":
            return Or(None, _branches(items[1:], form), form)
        if name == "or-join":
            if len(items) < 3:
                raise _err(f"or-join needs a variable vector and at least one branch: {write(form)}", form)
            return Or(_join_vars(items[1], form), _branches(items[2:], form), form)
        if name == "and":
            raise _err(f"(and ...) is only allowed as a branch of or / or-join: {write(form)}", form)
        args = tuple(_term(a, write(form)) for a in items[1:])
        if not args:
            raise _err(f"rule call {write(form)} needs at least one argument", form)
        return RuleCall(name, args, form)
    raise _err(f"a clause must be a vector or a list, found {write(form)} in {context}", form)


def _clauses(forms, parent, what) -> tuple[Clause, ...]:
    if not forms:
        raise _err(f"{what} needs at least one clause: {write(parent)}", parent)
    return tuple(_clause(f, write(parent)) for f in forms)


def _join_vars(form: Any, parent: Any) -> tuple[Var, ...]:
    if not isinstance(form, EdnVector):
        raise _err(f"expected a vector of join variables in {write(parent)}", parent)
    out: list[Var] = []
    for f in form:
        # or-join allows [[?required] ?free]; the distinction does not matter for evaluation
        if isinstance(f, EdnVector):
            out += [_var(x, write(parent)) for x in f]
        else:
            out.append(_var(f, write(parent)))
    if not out:
        raise _err(f"empty join variable vector in {write(parent)}", parent)
    if len(out) != len(set(out)):
        raise _err(f"a join variable appears twice in {write(parent)}", parent)
    return tuple(out)


def _branches(forms, parent) -> tuple[tuple[Clause, ...], ...]:
    if not forms:
        raise _err(f"or needs at least one branch: {write(parent)}", parent)
    branches = []
    for f in forms:
        if isinstance(f, EdnList) and f and f[0] == Symbol("and"):
            branches.append(_clauses(list(f[1:]), f, "and"))
        else:
            branches.append((_clause(f, write(parent)),))
    return tuple(branches)


def _pattern(form: EdnVector, context: str) -> Pattern:
    items = list(form)
    if _is_src(items[0]):
        _check_src(items[0], write(form))
        items = items[1:]
    if len(items) < 2:
        raise _err(f"pattern {write(form)} needs an entity and an attribute", form)
    if len(items) > 3:
        raise _err(f"pattern {write(form)}: transaction and added positions are not supported", form)
    attr = items[1]
    if not isinstance(attr, Keyword):
        raise _err(f"pattern {write(form)}: the attribute position must be an attribute keyword like :person/name", form)
    e = _term(items[0], write(form))
    if isinstance(e, Const) and (isinstance(e.value, bool) or not isinstance(e.value, int)):
        raise _err(f"pattern {write(form)}: entity position must be a variable, '_' or an integer entity id", form)
    v = _term(items[2], write(form)) if len(items) == 3 else Blank()
    return Pattern(e, attr, v, form)


def _expression_clause(form: EdnVector, context: str) -> Clause:
    call = form[0]
    if not call or not isinstance(call[0], Symbol) or _is_var(call[0]):
        raise _err(f"expression {write(form)} must start with a function name", form)
    fn = str.__str__(call[0])
    args = tuple(_fn_arg(a, write(form)) for a in call[1:])
    if len(form) == 1:
        return Predicate(fn, args, form)
    if len(form) == 2:
        return FnCall(fn, args, _binding(form[1], write(form)), form)
    raise _err(f"expression clause {write(form)} has too many elements", form)


def _fn_arg(form: Any, context: str) -> Term:
    if _is_src(form):
        raise _err(f"database arguments ($) to functions are not supported: {context}", form)
    if isinstance(form, EdnVector):
        # a literal collection, e.g. (ground [1 2 3])
        return Const(tuple(_plain_value(x, context) for x in form))
    return _term(form, context)


def _plain_value(form: Any, context: str) -> Any:
    if isinstance(form, EdnVector):
        return tuple(_plain_value(x, context) for x in form)
    if isinstance(form, (Symbol, EdnList, dict, frozenset)) or form is None:
        raise _err(f"only constants can appear in a literal collection: {context}", form)
    return form


# ---------------------------------------------------------------- find / inputs

def _find(forms: list, whole: Any) -> FindSpec:
    if not forms:
        raise _err(":find needs at least one element", whole)
    if len(forms) == 2 and forms[1] == Symbol("."):
        return FindSpec("scalar", (_find_element(forms[0]),))
    if len(forms) == 1 and isinstance(forms[0], EdnVector):
        inner = list(forms[0])
        if len(inner) == 2 and inner[1] == Symbol("..."):
            return FindSpec("coll", (_find_element(inner[0]),))
        if not inner:
            raise _err("empty tuple find spec []", forms[0])
        return FindSpec("tuple", tuple(_find_element(f) for f in inner))
    if any(f == Symbol(".") or f == Symbol("...") for f in forms):
        raise _err(f"malformed :find {write(EdnVector(forms))}", whole)
    return FindSpec("rel", tuple(_find_element(f) for f in forms))


def _find_element(form: Any):
    if _is_var(form):
        return FindVar(Var(str.__str__(form)))
    if isinstance(form, EdnList) and form and isinstance(form[0], Symbol):
        name = str.__str__(form[0])
        if name == "pull":
            return parse_pull(form)
        if name not in AGGREGATES:
            raise _err(f"unknown aggregate {name} in {write(form)}; known: {', '.join(sorted(AGGREGATES))}", form)
        args = list(form[1:])
        if not args or not _is_var(args[-1]):
            raise _err(f"aggregate {write(form)} must end with a variable", form)
        params = tuple(args[:-1])
        for p in params:
            if isinstance(p, (Symbol, EdnList, EdnVector)):
                raise _err(f"aggregate {write(form)}: only the last argument may be a variable", form)
        return Aggregate(name, params, Var(str.__str__(args[-1])), form)
    raise _err(f"bad :find element {write(form)}", form)


def _inputs(forms: list, whole: Any) -> tuple[Input, ...]:
    out: list[Input] = []
    for f in forms:
        if _is_src(f):
            _check_src(f, ":in")
            out.append(InSource(str.__str__(f)))
        elif f == Symbol("%"):
            out.append(InRules())
        else:
            out.append(InBinding(_binding(f, ":in")))
    return tuple(out)


def query_sections(form: Any) -> dict[str, list]:
    """The sections of a query form (vector or map), by key (``:find``, ``:with``, ``:in``, ``:where``)."""
    sections: dict[str, list] = {}
    if isinstance(form, dict):
        for k, v in form.items():
            if not isinstance(k, Keyword) or str.__str__(k) not in _QUERY_KEYS:
                raise _err(f"unknown query key {write(k)}; expected one of {', '.join(_QUERY_KEYS)}", form)
            if not isinstance(v, (EdnVector, EdnList)):
                raise _err(f"query key {k} needs a vector", form)
            sections[str.__str__(k)] = list(v)
        return sections
    if not isinstance(form, (EdnVector, list, tuple)):
        raise _err(f"a query must be a vector [:find ...] or a map {{:find ...}}, found {write(form)}", form)
    current = None
    for item in form:
        if isinstance(item, Keyword):
            key = str.__str__(item)
            if key not in _QUERY_KEYS:
                raise _err(f"unknown query key {key}; expected one of {', '.join(_QUERY_KEYS)}", item)
            if key in sections:
                raise _err(f"query key {key} appears twice", item)
            sections[key] = []
            current = key
        elif current is None:
            raise _err(f"a query must start with :find, found {write(item)}", item)
        else:
            sections[current].append(item)
    return sections


def parse_query(text_or_form: Any) -> Query:
    """Parse a query given as EDN text (vector or map form); a QueryError if it is malformed."""
    form = _read(text_or_form, "query")
    sections = query_sections(form)
    if ":find" not in sections:
        raise _err("query has no :find", form)
    find = _find(sections[":find"], form)
    with_vars = tuple(_var(f, ":with") for f in sections.get(":with", []))
    inputs = _inputs(sections[":in"], form) if ":in" in sections else (InSource(),)
    if sum(isinstance(i, InSource) for i in inputs) > 1:
        raise _err(":in may name the source $ only once", form)
    if sum(isinstance(i, InRules) for i in inputs) > 1:
        raise _err(":in may name the rules input % only once", form)
    where_forms = sections.get(":where", [])
    where = tuple(_clause(f, ":where") for f in where_forms)
    return Query(find, with_vars, inputs, where, form)


def parse_rules(text_or_form: Any) -> list[Rule]:
    """Parse a rule set ``[[(name ?a ...) clause ...] ...]`` into one Rule per body (a RuleError if malformed)."""
    form = _read(text_or_form, "rules", RuleError)
    if not isinstance(form, (EdnVector, list, tuple)):
        raise RuleError(f"rules must be a vector of rule bodies, found {write(form)}")
    rules = []
    for body in form:
        try:
            rules.append(_rule(body))
        except RuleError:
            raise
        except QueryError as exc:
            raise RuleError(str(exc)) from exc
    return rules


def _rule(form: Any) -> Rule:
    if not isinstance(form, EdnVector) or not form or not isinstance(form[0], EdnList):
        raise _err(f"a rule must look like [(name ?a ...) clause ...], found {write(form)}", form, RuleError)
    head = form[0]
    if not head or not isinstance(head[0], Symbol) or _is_var(head[0]) or _is_src(head[0]):
        raise _err(f"rule head {write(head)} must start with the rule name", head, RuleError)
    name = str.__str__(head[0])
    if name in _RESERVED_LISTS:
        raise _err(f"{name} cannot be used as a rule name", head, RuleError)
    required: tuple[Var, ...] = ()
    rest = list(head[1:])
    if rest and isinstance(rest[0], EdnVector):
        required = tuple(_var(v, write(head)) for v in rest[0])
        rest = rest[1:]
    free_vars: list[Var] = []
    aggregates: list[tuple[int, Aggregate]] = []
    for v in rest:
        if isinstance(v, EdnList):  # an aggregate rule: (count ?x) in the head
            aggregate = _find_element(v)
            if not isinstance(aggregate, Aggregate):
                raise _err(f"rule {name}: only variables and aggregates can be head arguments: {write(head)}", v,
                           RuleError)
            aggregates.append((len(required) + len(free_vars), aggregate))
            free_vars.append(aggregate.var)
        elif aggregates:
            raise _err(f"rule {name}: the head lists its aggregates after its variables: {write(head)}", head,
                       RuleError)
        else:
            free_vars.append(_var(v, write(head)))
    free = tuple(free_vars)
    head_vars = required + free
    if not head_vars:
        raise _err(f"rule {name} has no head variables: {write(head)}", head, RuleError)
    plain = [v for i, v in enumerate(head_vars) if i not in dict(aggregates)]
    if len(plain) != len(set(plain)) or set(plain) & {a.var for _, a in aggregates}:
        raise _err(f"rule {name} repeats a head variable: {write(head)}", head, RuleError)
    if len(form) < 2:
        raise _err(f"rule {name} has an empty body: {write(form)}", form, RuleError)
    body = tuple(_clause(c, f"rule {name}") for c in form[1:])
    return Rule(name, required, free, body, form, tuple(aggregates))
