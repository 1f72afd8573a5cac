"""Built-in predicates and functions of the query language, compiled to Spark SQL expressions.

Predicates filter tuples; functions compute a new value. A predicate given a binding
(``[(< ?a ?b) ?less]``, as Clojure's functions can be) binds ``true`` or ``false``
instead of filtering. Besides arithmetic and strings there are SQL's string patterns
(``like``), conditional values (``if``), parts of instants (``year``, ``month``, ``day``)
and calendar arithmetic on them (``plus-days``, ``plus-months``, ``plus-years``; a month
added to January 31 gives the last day of February, as SQL does). Both are typed at planning time:
:func:`check_predicate` and :func:`function_kind` reject ill-typed calls with a message
naming the clause, so nothing fails later on the data path. A function that cannot
produce a value for some tuple (division by zero, integer overflow, ``subs`` out of range)
yields NULL, and the tuple gets no binding, instead of failing the epoch.
"""

from __future__ import annotations

from typing import Sequence

from factflow.dataflow.zset import literal
from factflow.errors import QueryError
from factflow.model.types import INT64_MIN, Kind

__all__ = ["PREDICATES", "FUNCTIONS", "canonical_name", "check_predicate", "predicate_sql",
           "function_kind", "function_sql", "literal"]

_COMPARISONS = {"=", "!=", "not=", "<", "<=", ">", ">="}
_NUMERIC_PREDICATES = {"zero?", "pos?", "neg?"}
_INTEGER_PREDICATES = {"even?", "odd?"}
_STRING_PREDICATES = {"starts-with?", "ends-with?", "includes?", "like"}
PREDICATES = _COMPARISONS | _NUMERIC_PREDICATES | _INTEGER_PREDICATES | _STRING_PREDICATES

_ARITHMETIC = {"+", "-", "*", "/"}
_INTEGER_FUNCTIONS = {"quot", "rem", "mod"}
_STRING_FUNCTIONS = {"upper-case", "lower-case", "subs", "count", "str"}
_INSTANT_PARTS = {"year": "year", "month": "month", "day": "dayofmonth"}
_INSTANT_SHIFTS = {"plus-days": "DAY", "plus-months": "MONTH", "plus-years": "YEAR"}
#: the largest shift of each unit computed (about 8,000 years): beyond, the result is NULL
#: rather than an overflow of Spark's microseconds
_SHIFT_LIMITS = {"DAY": 3_000_000, "MONTH": 100_000, "YEAR": 8_000}
FUNCTIONS = (_ARITHMETIC | _INTEGER_FUNCTIONS | _STRING_FUNCTIONS | set(_INSTANT_PARTS) | set(_INSTANT_SHIFTS)
             | {"inc", "dec", "max", "min", "identity", "if"})

_ALIASES = {
    "clojure.string/upper-case": "upper-case",
    "clojure.string/lower-case": "lower-case",
    "clojure.string/starts-with?": "starts-with?",
    "clojure.string/ends-with?": "ends-with?",
    "clojure.string/includes?": "includes?",
    "clojure.core/str": "str",
    "clojure.core/subs": "subs",
    "clojure.core/count": "count",
}


def canonical_name(fn: str) -> str:
    """Resolve namespaced aliases such as ``clojure.string/upper-case``."""
    return _ALIASES.get(fn, fn)


def _comparable(a: Kind, b: Kind) -> bool:
    return a == b or (a.numeric and b.numeric)


def check_predicate(fn: str, kinds: Sequence[Kind], where: str) -> None:
    """Raise QueryError unless predicate ``fn`` accepts arguments of ``kinds``."""
    fn = canonical_name(fn)
    if fn not in PREDICATES:
        if fn in FUNCTIONS:
            raise QueryError(f"{fn} is a function, not a predicate; bind its result: {where}")
        raise QueryError(f"unknown predicate {fn} in {where}; known: {', '.join(sorted(PREDICATES))}")
    n = len(kinds)
    if fn in _COMPARISONS:
        if n < 1 or (fn in ("!=",) and n != 2):
            raise QueryError(f"{fn} needs {'two' if fn == '!=' else 'at least one'} arguments in {where}")
        for k in kinds[1:]:
            if not _comparable(kinds[0], k):
                raise QueryError(f"{fn} cannot compare {kinds[0].value} with {k.value} in {where}")
        return
    if n != (1 if fn in _NUMERIC_PREDICATES | _INTEGER_PREDICATES else 2):
        raise QueryError(f"wrong number of arguments to {fn} in {where}")
    if fn in _NUMERIC_PREDICATES and not kinds[0].numeric:
        raise QueryError(f"{fn} needs a number, got {kinds[0].value} in {where}")
    if fn in _INTEGER_PREDICATES and kinds[0] is not Kind.LONG:
        raise QueryError(f"{fn} needs a long, got {kinds[0].value} in {where}")
    if fn in _STRING_PREDICATES and any(k is not Kind.STRING for k in kinds):
        raise QueryError(f"{fn} needs strings in {where}")


def predicate_sql(fn: str, args: Sequence[str]) -> str:
    """The SQL condition of a (type-checked) predicate over argument expressions."""
    fn = canonical_name(fn)
    if fn in _COMPARISONS:
        if len(args) == 1:
            return "TRUE" if fn not in ("!=", "not=") else "FALSE"
        pairs = list(zip(args, args[1:]))
        if fn == "=":
            return _all(f"({a} = {b})" for a, b in pairs)
        if fn in ("!=", "not="):
            return f"NOT ({_all(f'({a} = {b})' for a, b in pairs)})"
        return _all(f"({a} {fn} {b})" for a, b in pairs)
    x = args[0]
    if fn == "zero?":
        return f"({x} = 0)"
    if fn == "pos?":
        return f"({x} > 0)"
    if fn == "neg?":
        return f"({x} < 0)"
    if fn == "even?":
        return f"(pmod({x}, 2) = 0)"
    if fn == "odd?":
        return f"(pmod({x}, 2) = 1)"
    if fn == "starts-with?":
        return f"startswith({x}, {args[1]})"
    if fn == "ends-with?":
        return f"endswith({x}, {args[1]})"
    if fn == "includes?":
        return f"contains({x}, {args[1]})"
    if fn == "like":
        return f"({x} LIKE {args[1]})"
    raise AssertionError(fn)


def _all(conditions) -> str:
    return "(" + " AND ".join(conditions) + ")"


def function_kind(fn: str, kinds: Sequence[Kind], where: str) -> Kind:
    """The kind of value function ``fn`` returns for arguments of ``kinds`` (or QueryError)."""
    fn = canonical_name(fn)
    n = len(kinds)
    if fn in PREDICATES:  # bound, a predicate yields whether it holds
        check_predicate(fn, kinds, where)
        return Kind.BOOLEAN
    if fn not in FUNCTIONS:
        raise QueryError(f"unknown function {fn} in {where}; known: "
                         f"{', '.join(sorted(FUNCTIONS | PREDICATES | {'ground'}))}")
    if fn == "if":
        if n != 3 or kinds[0] is not Kind.BOOLEAN:
            raise QueryError(f"if needs a boolean and two values, (if test then else), in {where}")
        if kinds[1].numeric and kinds[2].numeric:
            return Kind.DOUBLE if Kind.DOUBLE in kinds[1:] else Kind.LONG
        if kinds[1] != kinds[2]:
            raise QueryError(f"if needs two values of one type, got {kinds[1].value} and {kinds[2].value} in {where}")
        return kinds[1]
    if fn in _INSTANT_PARTS:
        if n != 1 or kinds[0] is not Kind.INSTANT:
            raise QueryError(f"{fn} needs one instant in {where}")
        return Kind.LONG
    if fn in _INSTANT_SHIFTS:
        if n != 2 or kinds[0] is not Kind.INSTANT or kinds[1] is not Kind.LONG:
            raise QueryError(f"{fn} needs an instant and a long, ({fn} ?instant n), in {where}")
        return Kind.INSTANT
    if fn in _ARITHMETIC:
        if fn in ("-", "/") and n == 0:
            raise QueryError(f"{fn} needs at least one argument in {where}")
        if any(not k.numeric for k in kinds):
            raise QueryError(f"{fn} needs numbers in {where}")
        if fn == "/":
            return Kind.DOUBLE
        return Kind.DOUBLE if any(k is Kind.DOUBLE for k in kinds) else Kind.LONG
    if fn in _INTEGER_FUNCTIONS:
        if n != 2 or any(k is not Kind.LONG for k in kinds):
            raise QueryError(f"{fn} needs two longs in {where}")
        return Kind.LONG
    if fn in ("inc", "dec"):
        if n != 1 or not kinds[0].numeric:
            raise QueryError(f"{fn} needs one number in {where}")
        return kinds[0]
    if fn in ("max", "min"):
        if n < 1:
            raise QueryError(f"{fn} needs at least one argument in {where}")
        if all(k.numeric for k in kinds):
            return Kind.DOUBLE if any(k is Kind.DOUBLE for k in kinds) else Kind.LONG
        if any(k != kinds[0] for k in kinds):
            raise QueryError(f"{fn} needs arguments of one type in {where}")
        return kinds[0]
    if fn == "identity":
        if n != 1:
            raise QueryError(f"identity needs one argument in {where}")
        return kinds[0]
    if fn == "str":
        return Kind.STRING
    if fn in ("upper-case", "lower-case", "count"):
        if n != 1 or kinds[0] is not Kind.STRING:
            raise QueryError(f"{fn} needs one string in {where}")
        return Kind.LONG if fn == "count" else Kind.STRING
    if fn == "subs":
        if n not in (2, 3) or kinds[0] is not Kind.STRING or any(k is not Kind.LONG for k in kinds[1:]):
            raise QueryError(f"subs needs a string and one or two longs in {where}")
        return Kind.STRING
    raise AssertionError(fn)


def function_sql(fn: str, args: Sequence[str], kinds: Sequence[Kind]) -> str:
    """The SQL expression computing a (type-checked) function; NULL where it has no value."""
    fn = canonical_name(fn)
    kind = function_kind(fn, kinds, fn)
    if fn in PREDICATES:
        return f"({predicate_sql(fn, args)})"
    as_double = any(k is Kind.DOUBLE for k in kinds)
    if fn == "if":
        values = [f"CAST({a} AS DOUBLE)" if kind is Kind.DOUBLE else a for a in args[1:]]
        return f"(CASE WHEN {args[0]} THEN {values[0]} ELSE {values[1]} END)"
    if fn in _INSTANT_PARTS:
        return f"CAST({_INSTANT_PARTS[fn]}({args[0]}) AS BIGINT)"
    if fn in _INSTANT_SHIFTS:
        unit = _INSTANT_SHIFTS[fn]
        limit = _SHIFT_LIMITS[unit]
        return (f"(CASE WHEN {args[1]} BETWEEN -{limit}L AND {limit}L THEN timestampadd({unit}, {args[1]}, {args[0]}) "
                f"ELSE CAST(NULL AS TIMESTAMP_NTZ) END)")
    if fn in ("+", "*"):
        if not args:
            return literal(0 if fn == "+" else 1, Kind.LONG)
        return _fold(args, "+" if fn == "+" else "*", as_double)
    if fn == "-":
        if len(args) == 1:
            return _negate(args[0], kinds[0])
        return _fold(args, "-", as_double)
    if fn == "/":
        doubles = [f"CAST({a} AS DOUBLE)" for a in args]
        if len(doubles) == 1:
            doubles = ["1.0D"] + doubles
        out = doubles[0]
        for d in doubles[1:]:
            out = f"(CASE WHEN {d} = 0 THEN CAST(NULL AS DOUBLE) ELSE {out} / {d} END)"
        return out
    if fn in ("quot", "rem", "mod"):
        a, b = args
        safe = f"({b} <> 0 AND NOT ({a} = {literal(INT64_MIN, Kind.LONG)} AND {b} = -1L))"
        value = {"quot": f"({a} div {b})", "rem": f"({a} % {b})", "mod": f"((({a} % {b}) + {b}) % {b})"}[fn]
        return f"(CASE WHEN {safe} THEN {value} ELSE CAST(NULL AS BIGINT) END)"
    if fn in ("inc", "dec"):
        op = "+" if fn == "inc" else "-"
        return _fold([args[0], "1L"], op, kinds[0] is Kind.DOUBLE)
    if fn in ("max", "min"):
        if len(args) == 1:
            return args[0]
        cast = [f"CAST({a} AS DOUBLE)" for a in args] if as_double else list(args)
        return f"{'greatest' if fn == 'max' else 'least'}({', '.join(cast)})"
    if fn == "identity":
        return args[0]
    if fn == "str":
        if not args:
            return "''"
        return f"concat({', '.join(_to_text(a, k) for a, k in zip(args, kinds))})"
    if fn == "upper-case":
        return f"upper({args[0]})"
    if fn == "lower-case":
        return f"lower({args[0]})"
    if fn == "count":
        return f"CAST(char_length({args[0]}) AS BIGINT)"
    if fn == "subs":
        s, start = args[0], args[1]
        end = args[2] if len(args) == 3 else f"CAST(char_length({s}) AS BIGINT)"
        ok = f"({start} >= 0 AND {start} <= {end} AND {end} <= char_length({s}))"
        return f"(CASE WHEN {ok} THEN substring({s}, {start} + 1, {end} - {start}) ELSE CAST(NULL AS STRING) END)"
    raise AssertionError(fn)


_TRY = {"+": "try_add", "-": "try_subtract", "*": "try_multiply"}


def _fold(args: Sequence[str], op: str, as_double: bool) -> str:
    """Left fold of an arithmetic operator; longs use the overflow-checking try_ functions."""
    if as_double:
        return "(" + f" {op} ".join(f"CAST({a} AS DOUBLE)" for a in args) + ")"
    out = args[0]
    for a in args[1:]:
        out = f"{_TRY[op]}({out}, {a})"
    return out


def _negate(x: str, kind: Kind) -> str:
    if kind is Kind.LONG:
        return f"(CASE WHEN {x} = {literal(INT64_MIN, Kind.LONG)} THEN CAST(NULL AS BIGINT) ELSE -{x} END)"
    return f"(-{x})"


def _to_text(expr: str, kind: Kind) -> str:
    if kind is Kind.BOOLEAN:
        return f"(CASE WHEN {expr} THEN 'true' ELSE 'false' END)"
    return f"CAST({expr} AS STRING)"
