"""Pull in queries and ``Engine.pull``, maintained under changes, against the brute-force oracle."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from factflow.errors import QueryError
from factflow.model.pulled import PullMap
from oracle import Oracle, frozen_pull

SCHEMA = [(":person/name", "string", "one"), (":person/age", "long", "one"),
          (":person/knows", "ref", "set"), (":person/best", "ref", "one"), (":person/tag", "string", "raw")]


def canonical(rows: dict) -> Counter:
    """Engine rows with every PullMap as the oracle's frozen form."""
    return Counter({tuple(frozen_pull(x.to_dict()) if isinstance(x, PullMap) else x for x in row): n
                    for row, n in rows.items()})


class Follower:
    """Sums a query's deliveries from its install on (they must add up to its results)."""

    def __init__(self, query):
        self.total = canonical(query.rows())
        self.epochs: list[list] = []
        query.subscribe(self)

    def __call__(self, epoch, changes):
        self.epochs.append(changes)
        for row, diff in changes:
            self.total.update(canonical({row: diff}))
        self.total = Counter({r: n for r, n in self.total.items() if n})


@pytest.fixture
def both(engine):
    oracle = Oracle()
    for name, type_, semantics in SCHEMA:
        engine.create_attribute(name, type=type_, semantics=semantics)
        oracle.create_attribute(name, type_, semantics)

    def transact(ops):
        engine.transact(ops)
        oracle.transact(ops)

    return engine, oracle, transact


NESTED = ("[:find ?n (pull ?e [:db/id :person/name {:person/knows [:person/name :person/age]} "
          "{:person/best [:person/name]}]) :where [?e :person/name ?n]]")


def test_changes_at_depth_one_and_two(both):
    engine, oracle, transact = both
    transact([[":db/add", 1, ":person/name", "Ann"], [":db/add", 2, ":person/name", "Bob"],
              [":db/add", 1, ":person/knows", 2], [":db/add", 1, ":person/knows", 3],
              [":db/add", 3, ":person/age", 30], [":db/add", 1, ":person/tag", "x"]])
    q = engine.query(NESTED)
    assert canonical(q.results()) == oracle.query(NESTED)
    plan = q.explain()
    assert "stage :person/knows :person/age" in plan and "stage :person/best :person/name" in plan
    follow = Follower(q)
    steps = [
        [[":db/add", 3, ":person/name", "Cid"]],                 # a nested entity gains a pulled attribute
        [[":db/add", 3, ":person/age", 31]],                     # depth 2, cardinality one overwritten
        [[":db/retract", 3, ":person/age", 31]],                 # depth 2 retracted
        [[":db/retract", 1, ":person/knows", 2], [":db/add", 1, ":person/best", 2]],   # refs (set and one)
        [[":db/retract", 2, ":person/name", "Bob"], [":db/add", 9, ":person/age", 5]],  # a root leaves
    ]
    for ops in steps:
        transact(ops)
        assert canonical(q.results()) == oracle.query(NESTED), ops
        assert follow.total == oracle.query(NESTED), ops
    # one entity's nested change: its row retracted as it was and added as it is, nothing else
    age_change = follow.epochs[1]
    assert sorted(d for _, d in age_change) == [-1, 1]
    assert {row[0] for row, _ in age_change} == {"Ann"}
    assert len(follow.epochs) == len(steps)
    ann = next(row[1] for row in q.results() if row[0] == "Ann")
    assert ann.to_dict() == {":db/id": 1, ":person/name": "Ann", ":person/knows": [{":person/name": "Cid"}],
                             ":person/best": {":db/id": 2}}


def test_random_streams_with_retractions(both):
    engine, oracle, transact = both
    rng = random.Random(15)
    names, entities = ["a", "b", "c"], range(1, 7)

    def op(add):
        e = rng.choice(entities)
        attribute, _, _ = rng.choice(SCHEMA)
        value = {":person/name": lambda: rng.choice(names), ":person/age": lambda: rng.randint(1, 3),
                 ":person/tag": lambda: rng.choice(names)}.get(attribute, lambda: rng.choice(entities))()
        return [":db/add" if add else ":db/retract", e, attribute, value]

    def epoch(size):
        ops, seen = [], set()
        facts = [(a, e, v) for a, store in oracle.facts.items() for (e, v), n in store.items() if n > 0]
        for _ in range(size):
            if facts and rng.random() < 0.4:
                a, e, v = rng.choice(facts)
                candidate = [":db/retract", e, a, v]
            else:
                candidate = op(True)
            key = (candidate[1], candidate[2])
            if key in seen:  # one operation per entity and attribute keeps every epoch valid
                continue
            seen.add(key)
            ops.append(candidate)
        return ops

    transact(epoch(12))
    queries = {
        "[:find (pull ?e [* {:person/knows [:person/name {:person/best [:person/age]}]}]) :where [?e :person/age]]":
            "auto",
        "[:find ?x (pull ?e [:person/name :person/tag {:person/knows [:db/id :person/tag]}]) "
        ":where [?x :person/knows ?e]]": "binary",
    }
    installed = [(text, engine.query(text, join=join)) for text, join in queries.items()]
    follows = [Follower(q) for _, q in installed]
    for _ in range(4):
        transact(epoch(4))
        for (text, q), follow in zip(installed, follows):
            expected = oracle.query(text)
            assert canonical(q.results()) == expected, text
            assert follow.total == expected, text


def test_engine_pull_of_missing_entities_and_attributes(both):
    engine, oracle, transact = both
    transact([[":db/add", 1, ":person/name", "Ann"], [":db/add", 1, ":person/knows", 2],
              [":db/add", 1, ":person/best", 2], [":db/add", 2, ":person/age", 7]])
    pattern = "[:db/id :person/name :person/tag {:person/knows [:person/name]} {:person/best [*]}]"
    assert engine.pull(pattern, 1) == oracle.pull(pattern, 1) == {
        ":db/id": 1, ":person/name": "Ann", ":person/knows": [{":db/id": 2}],
        ":person/best": {":db/id": 2, ":person/age": 7}}
    assert engine.pull("[:db/id :person/name]", 99) is None is oracle.pull("[:db/id :person/name]", 99)
    assert not engine.queries  # each pull's query is closed again


def test_bad_pulls_are_query_errors_naming_the_item(both):
    engine, _, _ = both
    for text, named in [
        ("[:find (pull ?e [:person/nope]) :where [?e :person/name]]", ":person/nope"),
        ("[:find (pull ?n [:person/name]) :where [_ :person/name ?n]]", "?n is a string"),
        ("[:find (pull ?e [{:person/age [:person/name]}]) :where [?e :person/name]]", ":person/age is a long"),
        ("[:find (pull ?e [:person/name]) (count ?e) :where [?e :person/name]]", "aggregates"),
        ("[:find ?e (pull ?e [:person/name]) :where [?e :person/name]]", "twice"),
    ]:
        with pytest.raises(QueryError) as info:
            engine.query(text)
        assert named in str(info.value)
    with pytest.raises(QueryError, match="integer entity id"):
        engine.pull("[:person/name]", "Ann")
    assert not engine.queries
