import pytest

from factflow import QueryError, RuleError
from factflow.edn import Keyword
from factflow.lang.ast import (
    Aggregate, BindColl, BindRel, BindScalar, BindTuple, Blank, Const, FnCall, Not, Or, Pattern, Predicate,
    RuleCall, Var,
)
from factflow.lang.parser import parse_query, parse_rules


def test_basic_query():
    q = parse_query("[:find ?p ?n :where [?p :person/name ?n]]")
    assert q.find.kind == "rel"
    assert [str(e) for e in q.find.elements] == ["?p", "?n"]
    (clause,) = q.where
    assert clause == Pattern(Var("?p"), Keyword(":person/name"), Var("?n"))


def test_map_form_and_inputs():
    q = parse_query("{:find [?x] :in [$ ?a [?b ?c] [?d ...] [[?e _]]] :where [[?x :a ?a]]}")
    kinds = [type(i.binding) for i in q.binding_inputs]
    assert kinds == [BindScalar, BindTuple, BindColl, BindRel]
    assert q.binding_inputs[3].binding.elements == (Var("?e"), Blank())


def test_access_paths_and_blanks():
    q = parse_query("[:find ?e :where [?e :a] [1 :b ?v] [_ :c \"x\"] [$ ?e :d _]]")
    assert q.where[0].v == Blank()
    assert q.where[1].e == Const(1)
    assert q.where[2].e == Blank() and q.where[2].v == Const("x")


def test_expression_clauses():
    q = parse_query("[:find ?y :where [?x :a ?v] [(< ?v 10)] [(+ ?v 1) ?y] [(ground [1 2]) [?z ...]]]")
    assert isinstance(q.where[1], Predicate) and q.where[1].fn == "<"
    assert isinstance(q.where[2], FnCall) and q.where[2].binding == BindScalar(Var("?y"))
    assert q.where[3].args == (Const((1, 2)),)


def test_not_or_rules_and_find_specs():
    q = parse_query("""[:find (count ?x) . :where (rule ?x 1)
                        (not [?x :a 1]) (not-join [?x] [?x :b ?y])
                        (or [?x :c 1] (and [?x :d 2] [(> ?x 0)]))
                        (or-join [?x] [?x :e ?z])]""")
    assert q.find.kind == "scalar" and isinstance(q.find.elements[0], Aggregate)
    assert isinstance(q.where[0], RuleCall) and q.where[0].args == (Var("?x"), Const(1))
    assert isinstance(q.where[1], Not) and q.where[1].join_vars is None
    assert q.where[2].join_vars == (Var("?x"),)
    assert isinstance(q.where[3], Or) and len(q.where[3].branches[1]) == 2
    assert parse_query("[:find [?x ...] :where [?x :a]]").find.kind == "coll"
    assert parse_query("[:find [?x ?y] :where [?x :a ?y]]").find.kind == "tuple"


@pytest.mark.parametrize("text, fragment", [
    ("[:where [?x :a ?y]]", "no :find"),
    ("[?x :find ?x]", "must start with :find"),
    ("{:where [[?x :a]]}", "no :find"),
    ("[:find ?x :foo [?x :a]]", "unknown query key"),
    ("[:find ?x :where [?x ?a ?v]]", "attribute position"),
    ("[:find ?x :where [?x :a ?v ?tx]]", "transaction and added"),
    ("[:find ?x :where [\"e\" :a ?v]]", "entity position"),
    ("[:find ?x :where (and [?x :a])]", "only allowed as a branch"),
    ("[:find (bogus ?x) :where [?x :a]]", "unknown aggregate"),
    ("[:find (pull ?x [(:a :limit 1)]) :where [?x :a]]", "attribute expressions such as (:a :limit 1)"),
    ("[:find ?x :in $1 :where [?x :a]]", "only the default source"),
    ("[:find ?x :where [x :a]]", "variables start with '?'"),
    ("[:find ?x :where [(f ?x) ?y ?z]]", "too many elements"),
])
def test_malformed_queries_name_the_offending_item(text, fragment):
    with pytest.raises(QueryError) as info:
        parse_query(text)
    assert fragment in str(info.value)


def test_rules():
    rules = parse_rules("[[(reach ?a ?b) [?a :edge ?b]] [(reach ?a ?b) [?a :edge ?x] (reach ?x ?b)] "
                        "[(bound [?a] ?b) [?a :edge ?b]]]")
    assert [r.name for r in rules] == ["reach", "reach", "bound"]
    assert rules[2].required == (Var("?a"),) and rules[2].free == (Var("?b"),)


@pytest.mark.parametrize("text, fragment", [
    ("[[reach ?a]]", "[(name ?a ...) clause ...]"),
    ("[[(reach) [?a :edge ?b]]]", "no head variables"),
    ("[[(reach ?a ?a) [?a :edge ?b]]]", "repeats a head variable"),
    ("[[(reach ?a)]]", "empty body"),
    ("[[(not ?a) [?a :e]]]", "cannot be used as a rule name"),
])
def test_malformed_rules(text, fragment):
    with pytest.raises(RuleError) as info:
        parse_rules(text)
    assert fragment in str(info.value)
