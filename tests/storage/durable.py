"""Helpers of the durability tests: a random stream of valid transactions, and the check of a
recovered engine's query results against the oracle (joins, recursion, negation, aggregates)."""

from __future__ import annotations

import random
from collections import Counter

from oracle import Oracle, OracleError, normalized
from test_differential import RULES, SCHEMA, random_transaction

#: (query, inputs, semantics): joins, recursion, negation, aggregates, every value type
QUERIES = [
    ("[:find ?a ?c :where [?a :d/friend ?b] [?b :d/friend ?c]]", (), "multiset"),
    ("[:find ?a ?b :where (reach ?a ?b)]", (), "set"),
    ("[:find ?e :where [?e :d/name _] (not [?e :d/age _])]", (), "set"),
    ("[:find ?a ?b :where (even-hop ?a ?b) (not (reach ?b ?a))]", (), "set"),
    ("[:find ?n (count ?e) :where [?e :d/name ?n]]", (), "set"),
    ("[:find ?t (distinct ?e) (min 2 ?e) (max 2 ?e) :where [?e :d/tag ?t]]", (), "set"),
    ("[:find ?e ?t :where [?e :d/tag ?t]]", (), "multiset"),
    ("[:find ?e ?s :where [?e :d/score ?s] [(>= ?s 1.0)]]", (), "set"),
    ("[:find ?e ?f :where [?e :d/flag ?f]]", (), "set"),
    ("[:find (count ?a) (sum ?a) :with ?e :where [?e :d/age ?a]]", (), "set"),
]

#: a cheaper subset (no recursion) for tests whose point is elsewhere
LIGHT = [QUERIES[0], QUERIES[2], QUERIES[4], QUERIES[6], QUERIES[7]]


def define(db) -> None:
    """The schema and rules of the differential tests (defining them again changes nothing)."""
    for name, kind, semantics in SCHEMA:
        db.create_attribute(name, type=kind, semantics=semantics)
    db.register(RULES)


def new_oracle() -> Oracle:
    oracle = Oracle()
    for name, kind, semantics in SCHEMA:
        oracle.create_attribute(name, kind, semantics)
    oracle.register(RULES)
    return oracle


def valid_stream(seed: int, count: int, max_ops: int = 8) -> list[list]:
    """``count`` transactions that the oracle accepts, applied in order (retractions of
    present facts, cardinality-one overwrites, raw multiplicities)."""
    rng = random.Random(seed)
    oracle = new_oracle()
    stream: list[list] = []
    while len(stream) < count:
        tx = random_transaction(rng, oracle, rng.randint(1, max_ops))
        try:
            oracle.transact(tx)
        except OracleError:
            continue
        stream.append(tx)
    return stream


def oracle_after(stream: list[list]) -> Oracle:
    oracle = new_oracle()
    for tx in stream:
        oracle.transact(tx)
    return oracle


def check_queries(db, oracle: Oracle, queries=QUERIES) -> None:
    """Install every query on ``db`` and compare its result with the oracle's."""
    for text, inputs, semantics in queries:
        q = db.query(text, inputs=inputs, semantics=semantics)
        try:
            assert normalized(Counter(q.rows())) == normalized(oracle.query(text, inputs, semantics)), \
                f"{text} at epoch {db.epoch}"
        finally:
            q.close()
