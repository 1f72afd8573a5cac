"""The language's functions for relational queries, against the oracle on a small stream.

Instants' parts and calendar arithmetic, ``if``, predicates bound as booleans, ``like``,
``avg`` and ``count-distinct`` with ``:with``, and aggregate rules (an aggregate in a
rule's head, read by other clauses: TPC-H's nested aggregates), each checked after every
epoch of a stream with retractions and overwrites, and the errors that name a misuse.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter

import pytest

from factflow import Engine, QueryError, RuleError
from oracle import Oracle, define_both, normalized

UTC = dt.timezone.utc
SCHEMA = [(":o/day", "instant", "one"), (":o/mode", "string", "one"), (":o/price", "double", "one"),
          (":o/qty", "long", "one"), (":o/part", "ref", "one")]
RULES = """[
 [(part-qty ?p (sum ?q) (count ?o)) [?o :o/part ?p] [?o :o/qty ?q]]
 [(part-avg ?p (avg ?q)) [?o :o/part ?p] [?o :o/qty ?q]]
 [(small-order ?o) [?o :o/part ?p] [?o :o/qty ?q] (part-avg ?p ?a) [(* 0.5 ?a) ?half] [(< ?q ?half)]]
 [(top-part (max ?n)) (part-qty _ _ ?n)]
]"""
QUERIES = [
    # parts of instants and calendar arithmetic
    "[:find ?y (count ?o) :where [?o :o/day ?d] [(year ?d) ?y]]",
    "[:find ?o ?m ?x :where [?o :o/day ?d] [(month ?d) ?m] [(day ?d) ?x]]",
    "[:find ?o :where [?o :o/day ?d] [(plus-months #inst \"2021-01-31\" 1) ?end] [(< ?d ?end)]]",
    "[:find ?o ?later :where [?o :o/day ?d] [(plus-days ?d 30) ?later] [(plus-years ?later -1) ?back] [(< ?back ?d)]]",
    # if, predicates bound as booleans, like
    "[:find ?mode (sum ?urgent) :with ?o :where [?o :o/mode ?mode] [?o :o/qty ?q] [(> ?q 2) ?big] [(if ?big 1 0) ?urgent]]",
    "[:find (sum ?promo) (sum ?v) :with ?o :where [?o :o/mode ?m] [?o :o/price ?v] [(like ?m \"AI%\") ?p] "
    "[(if ?p ?v 0.0) ?promo]]",
    "[:find ?o :where [?o :o/mode ?m] [(like ?m \"%A_L\")]]",
    "[:find ?o :where [?o :o/mode ?m] (not [(like ?m \"M%\")])]",
    # avg and count-distinct as SQL means them: :with keeps one tuple per order
    "[:find ?p (avg ?q) (count-distinct ?m) :with ?o :where [?o :o/part ?p] [?o :o/qty ?q] [?o :o/mode ?m]]",
    # aggregate rules, read by other clauses
    "[:find ?p ?s ?n :where (part-qty ?p ?s ?n)]",
    "[:find ?o :where (small-order ?o)]",
    "[:find ?p :where (part-qty ?p _ ?n) (top-part ?n)]",
]
MODES = ["AIR", "MAIL", "RAIL", "AIR REG", "SHIP"]
DAYS = [dt.datetime(2020, 12, 30, tzinfo=UTC), dt.datetime(2021, 1, 31, tzinfo=UTC),
        dt.datetime(2021, 2, 28, tzinfo=UTC), dt.datetime(2024, 2, 29, tzinfo=UTC)]
ORDERS, PARTS = range(1, 9), [101, 102, 103]


def _value(rng: random.Random, attribute: str):
    return {":o/day": lambda: rng.choice(DAYS), ":o/mode": lambda: rng.choice(MODES),
            ":o/price": lambda: rng.choice([1.5, 2.25, 10.0]), ":o/qty": lambda: rng.randint(1, 5),
            ":o/part": lambda: rng.choice(PARTS)}[attribute]()


def _stream(seed: int, epochs: int) -> list[list]:
    """Transactions: every order's facts first, then overwrites and retractions."""
    rng = random.Random(seed)
    current: dict[tuple, object] = {}
    out = []
    first = []
    for o in ORDERS:
        for name, _, _ in SCHEMA:
            current[(o, name)] = _value(rng, name)
            first.append([":db/add", o, name, current[(o, name)]])
    out.append(first)
    for _ in range(epochs - 1):
        tx, touched = [], set()
        for _ in range(rng.randint(1, 4)):
            o, name = rng.choice(ORDERS), rng.choice([a for a, _, _ in SCHEMA])
            if (o, name) in touched:
                continue
            touched.add((o, name))
            if (o, name) in current and rng.random() < 0.3:
                tx.append([":db/retract", o, name, current.pop((o, name))])
            else:
                current[(o, name)] = _value(rng, name)
                tx.append([":db/add", o, name, current[(o, name)]])
        out.append(tx)
    return out


def test_relational_functions_and_aggregate_rules_match_the_oracle(spark):
    db, oracle = Engine(spark=spark), Oracle()
    try:
        define_both(db, oracle, SCHEMA, RULES)
        queries = [db.query(text) for text in QUERIES]
        for tx in _stream(7, 4):
            db.transact(tx)
            oracle.transact(tx)
            for q, text in zip(queries, QUERIES):
                assert normalized(Counter(q.rows())) == normalized(oracle.query(text)), f"{text} after {tx}"
    finally:
        db.close()


@pytest.mark.parametrize("text, fragment", [
    ("[:find ?o :where [?o :o/qty ?q] [(if ?q 1 0) ?x]]", "if needs a boolean"),
    ("[:find ?o :where [?o :o/qty ?q] [(year ?q) ?y]]", "year needs one instant"),
    ("[:find ?o :where [?o :o/day ?d] [(plus-days ?d 1.5) ?e]]", "plus-days needs an instant and a long"),
    ("[:find ?o :where [?o :o/mode ?m] [?o :o/qty ?q] [(if true ?m ?q) ?x]]", "two values of one type"),
    ("[:find ?o :where [?o :o/qty ?q] [(like ?q \"1%\")]]", "like needs strings"),
])
def test_a_misused_function_is_a_query_error_naming_it(engine, text, fragment):
    for name, kind, semantics in SCHEMA:
        engine.create_attribute(name, type=kind, semantics=semantics)
    with pytest.raises(QueryError) as info:
        engine.query(text)
    assert fragment in str(info.value), str(info.value)


def test_aggregate_rules_are_refused_where_they_cannot_hold(engine):
    for name, kind, semantics in SCHEMA:
        engine.create_attribute(name, type=kind, semantics=semantics)
    engine.register("[[(loop ?p (count ?o)) [?o :o/part ?p] (loop ?p _)]]")
    with pytest.raises(QueryError, match="cannot be recursive"):
        engine.query("[:find ?p :where (loop ?p _)]")
    engine.register("[[(two ?p (count ?o)) [?o :o/part ?p]] [(two ?p (count ?o)) [?o :o/qty ?p]]]")
    with pytest.raises(QueryError, match="one body"):
        engine.query("[:find ?p :where (two ?p _)]")
    engine.register("[[(parts ?x (distinct ?p)) [?o :o/part ?p] [?o :o/mode ?x]]]")
    with pytest.raises(QueryError, match="collection"):
        engine.query("[:find ?x :where (parts ?x _)]")
    with pytest.raises(RuleError, match="repeats a head variable"):
        engine.register("[[(bad ?p (count ?p)) [?o :o/part ?p]]]")
