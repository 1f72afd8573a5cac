"""Pull expressions and patterns: parsing and the planner's pattern expansion, without Spark."""

from __future__ import annotations

import pytest

from factflow.edn import Keyword, read
from factflow.errors import QueryError, UnknownAttributeError
from factflow.lang.ast import FindVar, Pull, PullAttr, PullNested, PullPattern, PullWildcard, Var
from factflow.lang.parser import parse_query
from factflow.lang.pull import parse_pull_pattern
from factflow.model.pulled import PullMap
from factflow.model.schema import Schema
from factflow.planner.pull import expand_pattern


def test_pull_in_find_with_plain_variables():
    q = parse_query("[:find ?n (pull ?e [:person/name * {:person/knows [:person/name :db/id]}]) "
                    ":where [?e :person/name ?n]]")
    assert q.find.kind == "rel"
    plain, pull = q.find.elements
    assert plain == FindVar(Var("?n"))
    assert pull == Pull(Var("?e"), PullPattern((
        PullAttr(Keyword(":person/name")), PullWildcard(),
        PullNested(Keyword(":person/knows"), PullPattern((PullAttr(Keyword(":person/name")),
                                                          PullAttr(Keyword(":db/id"))))))))
    assert str(pull) == "(pull ?e [:person/name * {:person/knows [:person/name :db/id]}])"


@pytest.mark.parametrize("find", ["(pull ?e [:a/b]) .", "[(pull ?e [:a/b]) ...]", "[?x (pull ?e [:a/b])]",
                                  '(pull $ ?e [:a/b "*"])'])
def test_pull_in_every_find_spec(find):
    q = parse_query(f"[:find {find} :where [?e :a/b ?x]]")
    assert any(isinstance(e, Pull) for e in q.find.elements)


def test_a_repeated_item_is_kept_once():
    assert parse_pull_pattern(read("[:a/b :a/b * *]")).items == (PullAttr(Keyword(":a/b")), PullWildcard())


@pytest.mark.parametrize("text, named", [
    ("(pull ?e [(:a/b :limit 3)])", "(:a/b :limit 3)"),
    ("(pull ?e [[:a/b :as \"x\"]])", '[:a/b :as "x"]'),
    ("(pull ?e [:a/_b])", ":a/_b"),
    ("(pull ?e [{:a/b ...}])", ":a/b ..."),
    ("(pull ?e [{:a/b 3}])", ":a/b 3"),
    ("(pull ?e [])", "[]"),
    ("(pull ?e [17])", "17"),
    ("(pull ?e :a/b)", ":a/b"),
    ("(pull e [:a/b])", "found e"),
    ("(pull ?e ?pattern)", "?pattern"),
    ("(pull ?e)", "(pull ?e)"),
    ("(pull ?e [:a/b {:a/b [:c/d]}])", ":a/b twice"),
    ("(pull ?e [{:db/id [:c/d]}])", ":db/id"),
])
def test_bad_patterns_are_rejected_naming_the_item(text, named):
    with pytest.raises(QueryError) as info:
        parse_query(f"[:find {text} :where [?e :a/b]]")
    assert named in str(info.value)


class _Planning:
    """What :func:`expand_pattern` needs of a PlanContext: the schema and attribute lookups."""

    def __init__(self, schema):
        self.schema = schema

    def attribute(self, name, where):
        try:
            return self.schema.get(name, context=f"{where}: ")
        except UnknownAttributeError as exc:
            raise QueryError(str(exc)) from exc


@pytest.fixture
def planning():
    schema = Schema()
    schema.create(":person/name", "string", "one")
    schema.create(":person/knows", "ref", "set")
    return _Planning(schema)


def test_wildcard_expands_over_the_schema_and_nested_maps_win(planning):
    pattern = parse_pull_pattern(read("[* {:person/knows [:person/name]}]"))
    fields = {f.key: f for f in expand_pattern(pattern, planning, "here")}
    assert list(fields) == [":db/id", ":person/knows", ":person/name"]
    assert fields[":db/id"].attribute is None
    assert [f.key for f in fields[":person/knows"].nested] == [":person/name"]


@pytest.mark.parametrize("pattern, message", [
    ("[:person/nope]", ":person/nope"),
    ("[{:person/name [:person/name]}]", ":person/name is a string attribute"),
    ("[{:person/knows [:x/y]}]", ":x/y"),
])
def test_unknown_and_misused_attributes_are_errors_naming_them(planning, pattern, message):
    with pytest.raises(QueryError) as info:
        expand_pattern(parse_pull_pattern(read(pattern)), planning, "(pull ?e ...)")
    assert message in str(info.value)


def test_pull_maps_are_hashable_read_only_and_convert_to_plain_dicts():
    inner = PullMap({":person/name": "Bob"})
    a = PullMap({":db/id": 1, ":person/knows": (inner,)})
    b = PullMap({":person/knows": (PullMap({":person/name": "Bob"}),), ":db/id": 1})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.to_dict() == {":db/id": 1, ":person/knows": [{":person/name": "Bob"}]}
    with pytest.raises(TypeError):
        a[":db/id"] = 2  # type: ignore[index]
