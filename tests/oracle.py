"""A brute-force reference implementation of factflow's semantics, for differential tests.

It keeps facts in Python dictionaries and evaluates queries by enumerating bindings
clause by clause (nested loops), counting derivations. It shares only the parser with
the engine, so it checks the engine's planning and execution, not its parsing.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import math
import re
import statistics
from collections import Counter, defaultdict
from typing import Any

from factflow.edn import read
from factflow.lang.ast import (
    Aggregate, BindColl, BindRel, BindScalar, BindTuple, Blank, Const, FindVar, FnCall, Not, Or, Pattern, Predicate,
    Pull, PullNested, PullWildcard, RuleCall, Var, clause_vars,
)
from factflow.lang.parser import parse_query, parse_rules
from factflow.lang.pull import parse_pull_pattern

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class OracleError(Exception):
    """The oracle rejects a transaction (the engine must reject it too)."""


class Oracle:
    """Facts and rules, evaluated naively."""

    def __init__(self) -> None:
        self.attrs: dict[str, tuple[str, str]] = {}  # name -> (type, semantics)
        self.facts: dict[str, Counter] = defaultdict(Counter)  # attr -> Counter[(e, v)]
        self.rules: dict[str, list] = {}

    # ------------------------------------------------------------ data
    def create_attribute(self, name: str, type: str, semantics: str = "set") -> None:
        self.attrs[name] = (type, semantics)

    def register(self, text: str) -> None:
        for rule in parse_rules(text):
            self.rules.setdefault(rule.name, []).append(rule)

    def transact(self, ops: list) -> None:
        """Apply a transaction with Datomic's rules, or raise OracleError and change nothing."""
        adds: dict[str, Counter] = defaultdict(Counter)
        rets: dict[str, Counter] = defaultdict(Counter)
        for op, e, a, v in ops:
            if isinstance(v, float) and self.attrs[a][0] == "double":
                pass
            elif self.attrs[a][0] == "double" and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            (adds if op == ":db/add" else rets)[a][(e, v)] += 1
        for a in set(adds) | set(rets):
            if set(adds[a]) & set(rets[a]):
                raise OracleError(f"{a}: asserted and retracted")
            if self.attrs[a][1] == "one":
                per_entity: dict[Any, set] = defaultdict(set)
                for (e, v) in adds[a]:
                    per_entity[e].add(v)
                if any(len(vs) > 1 for vs in per_entity.values()):
                    raise OracleError(f"{a}: several values")
        for a in set(adds) | set(rets):
            semantics = self.attrs[a][1]
            store = self.facts[a]
            if semantics == "raw":
                for fact, n in adds[a].items():
                    store[fact] += n
                for fact, m in rets[a].items():
                    store[fact] -= min(m, store[fact])
            else:
                for fact in rets[a]:
                    store[fact] = 0
                if semantics == "one":
                    for (e, v) in adds[a]:
                        for (e2, v2) in list(store):
                            if e2 == e and v2 != v:
                                store[(e2, v2)] = 0
                for fact in adds[a]:
                    store[fact] = 1
            for fact in [f for f, n in store.items() if n == 0]:
                del store[fact]

    # ------------------------------------------------------------ queries
    def query(self, text: str, inputs=(), semantics: str = "set") -> Counter:
        """The result as a Counter of find tuples (multiplicity 1 each under set semantics)."""
        query = parse_query(text)
        self._relations = {}
        bindings = [({}, 1)]
        for inp, value in zip(query.binding_inputs, inputs):
            rows = _input_rows(inp.binding, value)
            bindings = [({**b, **r}, m) for b, m in bindings for r in rows]
        bindings = self._conjunction(query.where, bindings)
        find = [e.var for e in query.find.elements if isinstance(e, (FindVar, Pull))]
        aggregates = [e for e in query.find.elements if isinstance(e, Aggregate)]
        keep = list(dict.fromkeys(find + [a.var for a in aggregates] + list(query.with_vars)))
        full = Counter()
        for b, m in bindings:
            full[tuple(b[v] for v in keep)] += m
        if semantics == "set" or aggregates:
            full = Counter({k: 1 for k, n in full.items() if n > 0})
        if aggregates:
            return _aggregate(query, keep, full)
        out = Counter()
        pulls = [(i, e.pattern) for i, e in enumerate(query.find.elements) if isinstance(e, Pull)]
        for k, n in full.items():
            row = list(k[: len(find)])
            for i, pattern in pulls:
                row[i] = frozen_pull(self._pull(pattern, row[i]))
            out[tuple(row)] += n
        return Counter({k: n for k, n in out.items() if n != 0})

    # ------------------------------------------------------------ pull
    def pull(self, pattern: str, entity) -> dict | None:
        """Datomic's pull of one entity as plain dicts and lists; None when it has none of the
        pattern's attributes (``:db/id`` alone does not count)."""
        pulled = self._pull(parse_pull_pattern(read(pattern)), entity)
        return pulled if any(k != ":db/id" for k in pulled) else None

    def _pull(self, pattern, entity) -> dict:
        wanted: dict[str, Any] = {}  # key -> None (plain), a nested pattern, or "id"
        for item in pattern.items:
            if isinstance(item, PullWildcard):
                wanted.setdefault(":db/id", "id")
                for name in sorted(self.attrs):
                    wanted.setdefault(name, None)
            elif str.__str__(item.name) == ":db/id":
                wanted[":db/id"] = "id"
            else:
                wanted[str.__str__(item.name)] = item.pattern if isinstance(item, PullNested) else None
        out: dict[str, Any] = {}
        for key, nested in wanted.items():
            if nested == "id":
                out[key] = entity
                continue
            type_, semantics = self.attrs[key]
            values = sorted({v for (e, v), n in self.facts.get(key, Counter()).items() if e == entity and n > 0})
            if not values:
                continue
            if nested is not None:
                items = [self._pull(nested, v) or {":db/id": v} for v in values]
            elif type_ == "ref":
                items = [{":db/id": v} for v in values]
            else:
                items = values
            out[key] = items[0] if semantics == "one" else items
        return out

    def _conjunction(self, clauses, bindings):
        pending = list(clauses)
        while pending:
            progressed = False
            for clause in list(pending):
                if isinstance(clause, (Predicate, FnCall, Not)) and not _ready(clause, bindings):
                    continue
                pending.remove(clause)
                bindings = self._clause(clause, bindings)
                progressed = True
                break
            if not progressed:
                raise AssertionError(f"oracle cannot evaluate {pending}")
        return bindings

    def _clause(self, clause, bindings):
        out = []
        if isinstance(clause, Pattern):
            facts = self.facts.get(str.__str__(clause.a), Counter())
            for b, m in bindings:
                for (e, v), n in facts.items():
                    nb = _unify(b, clause.e, e)
                    if nb is None:
                        continue
                    nb = _unify(nb, clause.v, v)
                    if nb is None:
                        continue
                    out.append((nb, m * n))
            return out
        if isinstance(clause, Predicate):
            for b, m in bindings:
                if _predicate(clause.fn, [_value(b, t) for t in clause.args]):
                    out.append((b, m))
            return out
        if isinstance(clause, FnCall):
            if clause.fn == "ground":
                rows = _input_rows(clause.binding, clause.args[0].value)
                for b, m in bindings:
                    for r in rows:
                        nb = b
                        for k, val in r.items():
                            nb = _unify(nb, k, val) if nb is not None else None
                        if nb is not None:
                            out.append((nb, m))
                return out
            for b, m in bindings:
                result = _function(clause.fn, [_value(b, t) for t in clause.args])
                if result is None:
                    continue
                nb = _unify(b, clause.binding.var, result)
                if nb is not None:
                    out.append((nb, m))
            return out
        if isinstance(clause, RuleCall):
            relation = self._rule(clause.name)
            for b, m in bindings:
                for row in relation:
                    nb = b
                    for term, val in zip(clause.args, row):
                        nb = _unify(nb, term, val) if nb is not None else None
                    if nb is not None:
                        out.append((nb, m))
            return out
        if isinstance(clause, Not):
            join = _join_vars(clause)
            for b, m in bindings:
                seed = [({v: b[v] for v in join}, 1)]
                if not any(n for _, n in self._conjunction(clause.clauses, seed)):
                    out.append((b, m))
            return out
        if isinstance(clause, Or):
            join = _join_vars(clause)
            for b, m in bindings:
                seed = [({v: b[v] for v in join if v in b}, 1)]
                for branch in clause.branches:
                    for nb, n in self._conjunction(branch, seed):
                        out.append(({**b, **{v: nb[v] for v in join}}, m * n))
            return out
        raise NotImplementedError(clause)

    def _rule(self, name):
        """The (set) relation of a rule, evaluating its recursive component (stratum) when needed."""
        if name in self._relations:
            return self._relations[name]
        body = self.rules[name][0]
        if body.aggregates:  # one body, never recursive: its distinct bindings, grouped and aggregated
            bindings = {frozenset(b.items()) for b, _ in self._conjunction(body.body, [({}, 1)])}
            aggregates = dict(body.aggregates)
            groups = defaultdict(list)
            for b in map(dict, bindings):
                groups[tuple(b[v] for i, v in enumerate(body.head) if i not in aggregates)].append(b)
            relation = set()
            for key, members in groups.items():
                plain = iter(key)
                relation.add(tuple(_aggregate_fn(aggregates[i].fn, aggregates[i].params, [b[v] for b in members])
                                   if i in aggregates else next(plain) for i, v in enumerate(body.head)))
            self._relations[name] = relation
            return relation
        component = self._component(name)
        state = {n: set() for n in component}
        self._relations.update(state)
        changed = True
        while changed:  # naive iteration of the component to its least fixed point
            changed = False
            for n in component:
                for body in self.rules[n]:
                    for b, _ in self._conjunction(body.body, [({}, 1)]):
                        row = tuple(b[v] for v in body.head)
                        if row not in state[n]:
                            state[n].add(row)
                            changed = True
        return state[name]

    def _component(self, name):
        """The rules mutually recursive with ``name`` (its strongly connected component)."""
        def calls(n):
            out = set()
            def walk(clauses):
                for c in clauses:
                    if isinstance(c, RuleCall):
                        out.add(c.name)
                    elif isinstance(c, Not):
                        walk(c.clauses)
                    elif isinstance(c, Or):
                        for b in c.branches:
                            walk(b)
            for body in self.rules[n]:
                walk(body.body)
            return out

        def reach(n):
            seen, stack = {n}, [n]
            while stack:
                for m in calls(stack.pop()):
                    if m not in seen:
                        seen.add(m)
                        stack.append(m)
            return seen

        return [m for m in reach(name) if name in reach(m)]


def _input_rows(binding, value):
    if isinstance(binding, BindScalar):
        return [{binding.var: value}]
    if isinstance(binding, BindTuple):
        return [{e: x for e, x in zip(binding.elements, value) if isinstance(e, Var)}]
    if isinstance(binding, BindColl):
        return [{binding.var: x} for x in dict.fromkeys(value)]
    if isinstance(binding, BindRel):
        rows = dict.fromkeys(tuple(r) for r in value)
        return [{e: x for e, x in zip(binding.elements, r) if isinstance(e, Var)} for r in rows]
    raise TypeError(binding)


def _unify(binding, term, value):
    if isinstance(term, Blank):
        return binding
    if isinstance(term, Const):
        return binding if _equal(term.value, value) else None
    if term in binding:
        return binding if _equal(binding[term], value) else None
    return {**binding, term: value}


def _equal(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    return a == b


def _value(binding, term):
    if isinstance(term, Var):
        return binding[term]
    return term.value


def _aggregate(query, keep, tuples):
    """Datomic aggregation: group the set of tuples by the plain find variables."""
    groups = defaultdict(list)
    position = {v: i for i, v in enumerate(keep)}
    plain = [e.var for e in query.find.elements if isinstance(e, FindVar)]
    for row in tuples:
        groups[tuple(row[position[v]] for v in plain)].append(row)
    out = Counter()
    for key, rows in groups.items():
        result, plain_values = [], iter(key)
        for e in query.find.elements:
            if isinstance(e, FindVar):
                result.append(next(plain_values))
            else:
                result.append(_aggregate_fn(e.fn, e.params, [r[position[e.var]] for r in rows]))
        out[tuple(result)] = 1
    return out


def _aggregate_fn(fn, params, values):
    if fn == "count":
        return len(values)
    if fn == "count-distinct":
        return len(set(values))
    if fn == "sum":
        return sum(values)
    if fn == "avg":
        return sum(values) / len(values)
    if fn == "median":
        return float(statistics.median(values))
    if fn == "variance":
        return float(statistics.pvariance(values))
    if fn == "stddev":
        return float(statistics.pstdev(values))
    if fn == "distinct":
        return frozenset(values)
    if fn in ("min", "max") and params:
        return tuple(sorted(values, reverse=fn == "max")[: params[0]])
    if fn == "min":
        return min(values)
    if fn == "max":
        return max(values)
    raise NotImplementedError(fn)


def frozen_pull(value):
    """A pulled map (plain dicts and lists) as a hashable, order-independent value, to compare rows."""
    if isinstance(value, dict):
        return ("map", frozenset((k, frozen_pull(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(frozen_pull(v) for v in value))
    return value


def normalized(counter):
    """Rows with floats rounded (Spark and Python may differ in the last bits of an average)."""
    def norm(x):
        if isinstance(x, float):
            return round(x, 9)
        if isinstance(x, tuple):
            return tuple(norm(y) for y in x)
        return x
    out = Counter()
    for row, n in counter.items():
        out[norm(row)] += n
    return Counter({k: n for k, n in out.items() if n})


def _join_vars(clause):
    if clause.join_vars is not None:
        return list(clause.join_vars)
    inner = clause.clauses if isinstance(clause, Not) else [c for b in clause.branches for c in b]
    return list(dict.fromkeys(v for c in inner for v in clause_vars(c)))


def _ready(clause, bindings):
    args = _join_vars(clause) if isinstance(clause, Not) else clause.args
    needed = [t for t in args if isinstance(t, Var)]
    return not bindings or all(v in bindings[0][0] for v in needed)


def _predicate(fn, args):
    fn = {"clojure.string/starts-with?": "starts-with?", "clojure.string/ends-with?": "ends-with?",
          "clojure.string/includes?": "includes?"}.get(fn, fn)
    if fn in ("=", "!=", "not=", "<", "<=", ">", ">="):
        if fn == "=":
            return all(_equal(a, b) for a, b in zip(args, args[1:]))
        if fn in ("!=", "not="):
            return not all(_equal(a, b) for a, b in zip(args, args[1:]))
        op = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
              ">=": lambda a, b: a >= b}[fn]
        return all(op(a, b) for a, b in zip(args, args[1:]))
    x = args[0]
    return {
        "zero?": lambda: x == 0, "pos?": lambda: x > 0, "neg?": lambda: x < 0,
        "even?": lambda: x % 2 == 0, "odd?": lambda: x % 2 == 1,
        "starts-with?": lambda: x.startswith(args[1]), "ends-with?": lambda: x.endswith(args[1]),
        "includes?": lambda: args[1] in x, "like": lambda: _like(x, args[1]),
    }[fn]()


_PREDICATES = {"=", "!=", "not=", "<", "<=", ">", ">=", "zero?", "pos?", "neg?", "even?", "odd?", "starts-with?",
               "ends-with?", "includes?", "like", "clojure.string/starts-with?", "clojure.string/ends-with?",
               "clojure.string/includes?"}


def _like(text, pattern):
    """SQL's LIKE: % any run, _ any one character, backslash escapes (written here from the standard)."""
    out, escaped = [], False
    for ch in pattern:
        if escaped:
            out.append(re.escape(ch))
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.fullmatch("".join(out), text, re.DOTALL) is not None


def _shift(instant, unit, n):
    """An instant moved by ``n`` days, months or years; a month or year that lacks the day
    ends on its last day (as SQL's interval arithmetic does)."""
    if unit == "days":
        return instant + _dt.timedelta(days=n)
    months = instant.month - 1 + n * (12 if unit == "years" else 1)
    year, month = instant.year + months // 12, months % 12 + 1
    return instant.replace(year=year, month=month, day=min(instant.day, calendar.monthrange(year, month)[1]))


def _long(value):
    return value if INT64_MIN <= value <= INT64_MAX else None


def _function(fn, args):
    fn = {"clojure.string/upper-case": "upper-case", "clojure.string/lower-case": "lower-case"}.get(fn, fn)
    if fn in _PREDICATES:
        return _predicate(fn, args)
    if fn == "if":
        test, then, otherwise = args
        value = then if test else otherwise
        return float(value) if isinstance(then, float) or isinstance(otherwise, float) else value
    if fn in ("year", "month", "day"):
        return getattr(args[0], fn)
    if fn in ("plus-days", "plus-months", "plus-years"):
        try:
            return _shift(args[0], fn[len("plus-"):], args[1])
        except (OverflowError, ValueError):
            return None
    doubles = any(isinstance(a, float) for a in args)
    if fn in ("+", "*", "-"):
        if fn == "-" and len(args) == 1:
            return -args[0] if doubles else _long(-args[0])
        if not args:
            return 0 if fn == "+" else 1
        acc = float(args[0]) if doubles else args[0]
        for a in args[1:]:
            a = float(a) if doubles else a
            acc = acc + a if fn == "+" else acc - a if fn == "-" else acc * a
            if not doubles and _long(acc) is None:
                return None
        return acc
    if fn == "/":
        vals = [float(a) for a in args]
        if len(vals) == 1:
            vals = [1.0] + vals
        acc = vals[0]
        for d in vals[1:]:
            if d == 0:
                return None
            acc = acc / d
        return acc
    if fn in ("quot", "rem", "mod"):
        a, b = args
        if b == 0 or (a == INT64_MIN and b == -1):
            return None
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return {"quot": q, "rem": a - b * q, "mod": a % b}[fn]
    if fn in ("inc", "dec"):
        x = args[0] + (1 if fn == "inc" else -1)
        return x if isinstance(x, float) else _long(x)
    if fn in ("max", "min"):
        vals = [float(a) for a in args] if doubles else list(args)
        return max(vals) if fn == "max" else min(vals)
    if fn == "identity":
        return args[0]
    if fn == "str":
        return "".join(_text(a) for a in args)
    if fn == "upper-case":
        return args[0].upper()
    if fn == "lower-case":
        return args[0].lower()
    if fn == "count":
        return len(args[0])
    if fn == "subs":
        s, start = args[0], args[1]
        end = args[2] if len(args) == 3 else len(s)
        if not (0 <= start <= end <= len(s)):
            return None
        return s[start:end]
    raise NotImplementedError(fn)


def _text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value == math.floor(value) and abs(value) < 1e7:
            return f"{value:.1f}"
        return repr(value)
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    return str(value)


def define_both(db, oracle: Oracle, schema, rules: str) -> None:
    """Create ``schema``'s attributes (name, type, semantics) and register ``rules`` on the
    engine ``db`` and on ``oracle`` alike."""
    for name, kind, semantics in schema:
        db.create_attribute(name, type=kind, semantics=semantics)
        oracle.create_attribute(name, kind, semantics)
    db.register(rules)
    oracle.register(rules)
