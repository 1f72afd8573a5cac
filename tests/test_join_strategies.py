"""Join strategies: what each plans, the state it keeps, and the auto policy on real queries.

Correctness of every strategy against the oracle is in test_differential.py, the decision
itself (summaries in, strategy and reason out) in test_strategy.py; these tests check the
properties that distinguish the strategies.
"""

from __future__ import annotations

from collections import Counter

import pytest

from factflow import QueryError

TRIANGLES = "[:find ?a ?b ?c :where [?a :e ?b] [?b :e ?c] [?a :e ?c]]"


def add(e, a, v):
    return [":db/add", e, a, v]


@pytest.fixture
def graph(engine):
    engine.create_attribute(":e", type="ref")
    return engine


def star(arity: int) -> str:
    clauses = " ".join(f"[?p :s/a{i} ?v{i}]" for i in range(arity))
    return f"[:find ?p {' '.join(f'?v{i}' for i in range(arity))} :where {clauses}]"


def test_delta_and_wco_keep_no_private_state_for_joins_of_any_arity(engine):
    for i in range(7):
        engine.create_attribute(f":s/a{i}", type="long")
    engine.transact([add(p, f":s/a{i}", p * 10 + i) for p in range(1, 6) for i in range(7)])
    for arity in (2, 4, 7):
        queries = {join: engine.query(star(arity), join=join) for join in ("binary", "delta", "wco")}
        expected = {tuple([p] + [p * 10 + i for i in range(arity)]): 1 for p in range(1, 6)}
        stats = engine.stats()
        for join, q in queries.items():
            assert q.rows() == expected, join
        assert stats["query_tuples"][queries["binary"].name] == 5 * (arity - 2)  # prefixes joined again
        assert stats["query_tuples"][queries["delta"].name] == 0
        assert stats["query_tuples"][queries["wco"].name] == 0
        private = stats["query_arrangements"][queries["binary"].name]
        assert sum(rows for role, rows in private.values() if role == "intermediate") == 5 * (arity - 2)
        for q in queries.values():
            q.close()


def test_simultaneous_changes_are_derived_exactly_once(graph):
    q = {join: graph.query(TRIANGLES, join=join, semantics="multiset") for join in ("binary", "delta", "wco")}
    graph.transact([add(1, ":e", 2), add(2, ":e", 3), add(1, ":e", 3)])  # all three edges in one epoch
    for join, query in q.items():
        assert query.rows() == {(1, 2, 3): 1}, join
    graph.transact([[":db/retract", 1, ":e", 2], [":db/retract", 1, ":e", 3], add(1, ":e", 4), add(4, ":e", 3)])
    for join, query in q.items():
        assert query.rows() == {}, join
    graph.transact([add(1, ":e", 2), add(1, ":e", 3)])
    for join, query in q.items():
        assert query.rows() == {(1, 2, 3): 1, (1, 4, 3): 1}, join


def test_subscribers_see_the_same_changes_under_every_strategy(graph):
    seen = {join: Counter() for join in ("binary", "delta", "wco")}
    for join in seen:
        graph.query(TRIANGLES, join=join).subscribe(lambda epoch, changes, c=seen[join]: c.update(dict(changes)))
    graph.transact([add(a, ":e", b) for a in range(1, 5) for b in range(1, 5) if a < b])
    graph.transact([[":db/retract", 2, ":e", 3], add(4, ":e", 1)])
    assert seen["binary"] == seen["delta"] == seen["wco"]
    assert +seen["wco"] == Counter({(1, 2, 4): 1, (1, 3, 4): 1})


def test_wco_explain_names_pipelines_variable_orders_and_extenders(graph):
    q = graph.query(TRIANGLES, join="wco")
    text = q.explain()
    assert "strategy: wco (requested wco)" in text
    assert text.count("pipeline from d") == 3
    assert "variable order ?a ?b ?c" in text
    assert "extend to" in text and "count index" in text
    assert "count_e" in graph.arrangement(":e").traces and "count_v" in graph.arrangement(":e").traces


def test_conflicting_bindings_on_the_source_are_validated(graph):
    graph.transact([add(1, ":e", 2), add(2, ":e", 1), add(3, ":e", 4), add(5, ":e", 5)])
    for join in ("delta", "wco"):
        q = graph.query("[:find ?a ?b :where [?a :e ?b] [?b :e ?a]]", join=join)
        assert q.rows() == {(1, 2): 1, (2, 1): 1, (5, 5): 1}, join
        assert "validate with" in q.explain()
        c = graph.query("[:find ?b :where [1 :e ?b] [?b :e 1]]", join=join)
        assert c.rows() == {(2,): 1}


def test_auto_policy(graph):
    graph.create_attribute(":name", type="string", semantics="one")
    graph.create_attribute(":age", type="long", semantics="one")
    assert graph.query(TRIANGLES).dataflow.strategy == "wco"
    assert graph.query("[:find ?a ?c :where [?a :e ?b] [?b :e ?c]]").dataflow.strategy == "delta"
    assert graph.query("[:find ?p ?n ?a :where [?p :name ?n] [?p :age ?a]]").dataflow.strategy == "binary"
    assert graph.query("[:find ?a :where [?a :e 1]]").dataflow.strategy == "binary"
    text = graph.query(TRIANGLES).explain()
    assert "wco (auto: cyclic join)" in text


def test_strategy_is_chosen_per_rule_body(graph):
    graph.register("[[(tri ?a ?b ?c) [?a :e ?b] [?b :e ?c] [?a :e ?c]]]")
    q = graph.query("[:find ?a :where (tri ?a ?b ?c)]")
    assert any("rule" in line and "wco" in line for line in q.explain().splitlines())
    graph.transact([add(1, ":e", 2), add(2, ":e", 3), add(1, ":e", 3)])
    assert q.rows() == {(1,): 1}


def test_unknown_strategy_is_rejected(graph):
    with pytest.raises(QueryError, match="unknown join strategy 'magic'"):
        graph.query(TRIANGLES, join="magic")
    assert graph.queries == {}

