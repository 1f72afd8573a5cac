"""Group commit (``Engine.transact_many``) and attribute feeds.

The grouping rule is tested without Spark; the engine is checked against the oracle
applying the same transactions one after another, with rejected ones among them.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from factflow import TransactionError
from factflow.engine.group import plan_runs
from factflow.engine.transaction import read_ops
from factflow.model.schema import Schema
from oracle import Oracle, OracleError

SCHEMA = [(":p/name", "string", "one"), (":p/knows", "ref", "set"), (":p/tag", "string", "raw")]


@pytest.fixture
def schema() -> Schema:
    s = Schema()
    for name, kind, semantics in SCHEMA:
        s.create(name, kind, semantics)
    return s


def runs(schema, *transactions):
    return plan_runs([read_ops(tx, schema) for tx in transactions])


def test_compatible_transactions_share_a_run(schema):
    assert runs(schema,
                [[":db/add", 1, ":p/name", "a"]],
                [[":db/add", 2, ":p/name", "b"], [":db/add", 1, ":p/knows", 2]],
                [[":db/add", 1, ":p/name", "a"]],  # the same value again: no conflict
                [[":db/add", 1, ":p/tag", "x"]],
                [[":db/add", 1, ":p/tag", "x"]]) == [[0, 1, 2, 3, 4]]


def test_opposite_directions_on_one_fact_split(schema):
    assert runs(schema,
                [[":db/add", 1, ":p/knows", 2]],
                [[":db/add", 3, ":p/knows", 4]],
                [[":db/retract", 1, ":p/knows", 2]],
                [[":db/add", 1, ":p/knows", 2]]) == [[0, 1], [2], [3]]


def test_cardinality_one_values_split(schema):
    assert runs(schema,
                [[":db/add", 1, ":p/name", "a"]],
                [[":db/add", 1, ":p/name", "b"]],
                [[":db/add", 2, ":p/name", "c"]]) == [[0], [1, 2]]


def test_a_self_conflicting_transaction_runs_alone(schema):
    assert runs(schema,
                [[":db/add", 1, ":p/knows", 2]],
                [[":db/add", 5, ":p/name", "a"], [":db/add", 5, ":p/name", "b"]],
                [[":db/add", 3, ":p/knows", 4]],
                [[":db/add", 6, ":p/knows", 7], [":db/retract", 6, ":p/knows", 7]]) == [[0], [1], [2], [3]]


# ------------------------------------------------------------------ with the engine

def _random_tx(rng: random.Random) -> list:
    ops = []
    for _ in range(rng.randint(1, 4)):
        e = rng.randint(1, 6)
        kind = rng.random()
        op = ":db/add" if rng.random() < 0.7 else ":db/retract"
        if kind < 0.35:
            ops.append([op, e, ":p/name", rng.choice("abc")])
        elif kind < 0.75:
            ops.append([op, e, ":p/knows", rng.randint(1, 6)])
        elif kind < 0.95:
            ops.append([op, e, ":p/tag", rng.choice("xy")])
        else:  # bad input: an unknown attribute or a wrong value type
            ops.append(rng.choice([[op, e, ":p/unknown", 1], [op, e, ":p/knows", "not a ref"]]))
    return ops


@pytest.mark.parametrize("seed", [1, 2])
def test_groups_equal_applying_one_after_another(engine, seed):
    rng = random.Random(seed)
    oracle = Oracle()
    for name, kind, semantics in SCHEMA:
        engine.create_attribute(name, type=kind, semantics=semantics)
        oracle.create_attribute(name, kind, semantics)
    text = "[:find ?a ?n ?b :where [?a :p/knows ?b] [?a :p/name ?n]]"
    q = engine.query(text)
    received: Counter = Counter()
    q.subscribe(lambda epoch, changes: received.update(dict(changes)))
    feed: Counter = Counter()
    engine.subscribe_attribute(":p/knows", lambda epoch, changes: feed.update(dict(changes)))
    for _ in range(12):
        group = [_random_tx(rng) for _ in range(rng.randint(1, 6))]
        before = engine.epoch
        outcomes = engine.transact_many(group)
        for tx, outcome in zip(group, outcomes):
            well_typed = all(a in oracle.attrs and (a != ":p/knows" or isinstance(v, int)) for _, _, a, v in tx)
            try:
                if well_typed:
                    oracle.transact(tx)
            except OracleError:
                well_typed = False
            if well_typed:
                assert isinstance(outcome, int) and outcome > before, (tx, outcome)
            else:
                assert isinstance(outcome, TransactionError), (tx, outcome)
        committed = sorted({o for o in outcomes if isinstance(o, int)})
        assert committed == list(range(before + 1, engine.epoch + 1))  # epochs without gaps
        assert len(committed) <= len(group)
        assert q.rows() == dict(oracle.query(text))
        assert +received == oracle.query(text)
        assert +feed == Counter({fact: 1 for fact, n in oracle.facts[":p/knows"].items() if n})


def test_a_rejected_member_leaves_the_others_committed(people):
    outcomes = people.transact_many([
        [[":db/add", 1, ":person/name", "Ann"]],
        [[":db/add", 2, ":person/age", "old"]],
        "[[:db/add 3 :person/name \"Cy\"]]",
        "[[:db/add 4 :person/name",
        [[":db/add", 5, ":person/name", "E"], [":db/add", 5, ":person/name", "F"]],
    ])
    assert outcomes[0] == outcomes[2] == 1
    assert isinstance(outcomes[1], TransactionError) and "old" in str(outcomes[1])
    assert isinstance(outcomes[3], TransactionError) and "EDN" in str(outcomes[3])
    assert isinstance(outcomes[4], TransactionError) and "cardinality one" in str(outcomes[4])
    assert people.epoch == 1
    q = people.query("[:find ?n :where [?e :person/name ?n]]")
    assert q.results() == {("Ann",): 1, ("Cy",): 1}
