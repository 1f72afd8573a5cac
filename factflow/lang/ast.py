"""The abstract syntax of queries and rules (Datomic's Datalog dialect).

Every clause keeps the EDN form it was parsed from (``form``, excluded from equality) so
that errors can quote it back to the user.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Union

from factflow.edn import Keyword, write

__all__ = [
    "Var", "Blank", "Const", "Term", "Pattern", "Predicate", "FnCall", "RuleCall", "Not", "Or",
    "Clause", "BindScalar", "BindTuple", "BindColl", "BindRel", "Binding", "FindVar", "Aggregate",
    "PullAttr", "PullWildcard", "PullNested", "PullItem", "PullPattern", "Pull", "FindElement", "FindSpec", "InSource", "InRules", "InBinding", "Input", "Query", "Rule",
    "term_vars", "clause_vars", "binding_vars", "nested", "show",
]


@dataclass(frozen=True)
class Var:
    """A logic variable such as ``?person``."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Blank:
    """The wildcard ``_``: matches anything and binds nothing."""

    def __str__(self) -> str:
        return "_"


@dataclass(frozen=True)
class Const:
    """A constant value in a clause (number, string, boolean, instant or keyword)."""

    value: Any

    def __str__(self) -> str:
        return write(self.value)


Term = Union[Var, Blank, Const]


def _form_field():
    return field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Pattern:
    """A data pattern ``[e a v]`` over attribute ``a``; missing trailing positions are blanks."""

    e: Term
    a: Keyword
    v: Term
    form: Any = _form_field()


@dataclass(frozen=True)
class Predicate:
    """A predicate expression ``[(pred arg ...)]``."""

    fn: str
    args: tuple[Term, ...]
    form: Any = _form_field()


@dataclass(frozen=True)
class BindScalar:
    """Binding form ``?x``."""

    var: Var


@dataclass(frozen=True)
class BindTuple:
    """Binding form ``[?a ?b]`` (blanks allowed)."""

    elements: tuple[Var | Blank, ...]


@dataclass(frozen=True)
class BindColl:
    """Binding form ``[?x ...]``."""

    var: Var


@dataclass(frozen=True)
class BindRel:
    """Binding form ``[[?a ?b]]`` (blanks allowed)."""

    elements: tuple[Var | Blank, ...]


Binding = Union[BindScalar, BindTuple, BindColl, BindRel]


@dataclass(frozen=True)
class FnCall:
    """A function expression ``[(f arg ...) binding]``."""

    fn: str
    args: tuple[Term, ...]
    binding: Binding
    form: Any = _form_field()


@dataclass(frozen=True)
class RuleCall:
    """An invocation ``(rule-name arg ...)`` of a registered rule."""

    name: str
    args: tuple[Term, ...]
    form: Any = _form_field()


@dataclass(frozen=True)
class Not:
    """``(not clause ...)`` or, with ``join_vars``, ``(not-join [?v ...] clause ...)``."""

    join_vars: tuple[Var, ...] | None
    clauses: tuple["Clause", ...]
    form: Any = _form_field()


@dataclass(frozen=True)
class Or:
    """``(or branch ...)`` or, with ``join_vars``, ``(or-join [?v ...] branch ...)``.

    Each branch is a tuple of clauses (a single clause, or the clauses of an ``(and ...)``).
    """

    join_vars: tuple[Var, ...] | None
    branches: tuple[tuple["Clause", ...], ...]
    form: Any = _form_field()


Clause = Union[Pattern, Predicate, FnCall, RuleCall, Not, Or]


@dataclass(frozen=True)
class FindVar:
    """A plain variable in ``:find``."""

    var: Var

    def __str__(self) -> str:
        return self.var.name


@dataclass(frozen=True)
class Aggregate:
    """An aggregate in ``:find`` such as ``(count ?x)`` or ``(max 3 ?x)``.

    ``params`` holds constant leading arguments (the ``n`` of ``(max n ?x)``).
    """

    fn: str
    params: tuple[Any, ...]
    var: Var
    form: Any = _form_field()

    def __str__(self) -> str:
        inner = " ".join([self.fn, *(write(p) for p in self.params), self.var.name])
        return f"({inner})"


@dataclass(frozen=True)
class PullAttr:
    """An attribute in a pull pattern, such as ``:person/name`` (or ``:db/id``)."""

    name: Keyword

    def __str__(self) -> str:
        return str.__str__(self.name)


@dataclass(frozen=True)
class PullWildcard:
    """``*`` in a pull pattern: every attribute of the entity."""

    def __str__(self) -> str:
        return "*"


@dataclass(frozen=True)
class PullNested:
    """A map entry ``{:ref/attr [...]}`` of a pull pattern: the referenced entities, pulled with ``pattern``."""

    name: Keyword
    pattern: "PullPattern"

    def __str__(self) -> str:
        return f"{{{str.__str__(self.name)} {self.pattern}}}"


PullItem = Union[PullAttr, PullWildcard, PullNested]


@dataclass(frozen=True)
class PullPattern:
    """A pull pattern ``[item ...]`` (Datomic's pull syntax)."""

    items: tuple[PullItem, ...]

    def __str__(self) -> str:
        return "[" + " ".join(str(i) for i in self.items) + "]"


@dataclass(frozen=True)
class Pull:
    """A pull expression in ``:find``: ``(pull ?e [...])``, the entity bound to ``var`` shaped by ``pattern``."""

    var: Var
    pattern: PullPattern
    form: Any = _form_field()

    def __str__(self) -> str:
        return f"(pull {self.var.name} {self.pattern})"


FindElement = Union[FindVar, Aggregate, Pull]


@dataclass(frozen=True)
class FindSpec:
    """The ``:find`` specification: ``kind`` is ``rel``, ``coll``, ``tuple`` or ``scalar``."""

    kind: str
    elements: tuple[FindElement, ...]


@dataclass(frozen=True)
class InSource:
    """The database source ``$`` in ``:in``."""

    name: str = "$"


@dataclass(frozen=True)
class InRules:
    """The rules input ``%`` in ``:in``."""


@dataclass(frozen=True)
class InBinding:
    """An input binding in ``:in`` (scalar, tuple, collection or relation)."""

    binding: Binding


Input = Union[InSource, InRules, InBinding]


@dataclass(frozen=True)
class Query:
    """A parsed query."""

    find: FindSpec
    with_vars: tuple[Var, ...]
    inputs: tuple[Input, ...]
    where: tuple[Clause, ...]
    form: Any = _form_field()

    @property
    def binding_inputs(self) -> tuple[InBinding, ...]:
        """The ``:in`` bindings that take values from the caller, in order."""
        return tuple(i for i in self.inputs if isinstance(i, InBinding))


@dataclass(frozen=True)
class Rule:
    """One body of a named rule: ``[(name [?required ...] ?free ...) clause ...]``.

    An *aggregate rule* has aggregates among its head's arguments, ``[(part-cost ?p (min
    ?c)) ...]``: ``aggregates`` holds them with their positions in the head, whose
    variable there is the aggregated one (``?c``)."""

    name: str
    required: tuple[Var, ...]
    free: tuple[Var, ...]
    body: tuple[Clause, ...]
    form: Any = _form_field()
    aggregates: tuple[tuple[int, "Aggregate"], ...] = ()

    @property
    def head(self) -> tuple[Var, ...]:
        """All head variables, required ones first."""
        return self.required + self.free


def term_vars(terms) -> list[Var]:
    """The variables among ``terms``, in order, without repeats."""
    out: list[Var] = []
    for t in terms:
        if isinstance(t, Var) and t not in out:
            out.append(t)
    return out


def binding_vars(binding: Binding) -> list[Var]:
    """The variables a binding form binds."""
    if isinstance(binding, (BindScalar, BindColl)):
        return [binding.var]
    return [e for e in binding.elements if isinstance(e, Var)]


def nested(clauses: Iterable[Clause], negated: bool = False) -> Iterator[tuple[Clause, bool]]:
    """Every clause of ``clauses`` and, depth first, every clause inside their ``not`` and
    ``or`` (rule bodies are not entered), each with whether a ``not`` encloses it."""
    for clause in clauses:
        yield clause, negated
        if isinstance(clause, Not):
            yield from nested(clause.clauses, True)
        elif isinstance(clause, Or):
            for branch in clause.branches:
                yield from nested(branch, negated)


def clause_vars(clause: Clause) -> list[Var]:
    """Every variable mentioned by a clause (for not/or: the variables visible outside)."""
    if isinstance(clause, Pattern):
        return term_vars((clause.e, clause.v))
    if isinstance(clause, Predicate):
        return term_vars(clause.args)
    if isinstance(clause, FnCall):
        out = term_vars(clause.args)
        out += [v for v in binding_vars(clause.binding) if v not in out]
        return out
    if isinstance(clause, RuleCall):
        return term_vars(clause.args)
    if isinstance(clause, (Not, Or)):
        if clause.join_vars is not None:
            return list(clause.join_vars)
        inner = clause.clauses if isinstance(clause, Not) else [c for b in clause.branches for c in b]
        out: list[Var] = []
        for c in inner:
            out += [v for v in clause_vars(c) if v not in out]
        return out
    raise TypeError(f"not a clause: {clause!r}")


def show(clause_or_form: Any) -> str:
    """EDN text of a clause (its original form when known) for messages."""
    form = getattr(clause_or_form, "form", None)
    if form is not None:
        return write(form)
    return str(clause_or_form)
