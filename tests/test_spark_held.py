"""Sets and change sets larger than what a fetch may bring to the driver stay in Spark.

With a tiny ``EngineConfig.fetch_limit``, recursive components iterate over sets kept in
Spark as files (:mod:`factflow.arrangement.filed`) and an epoch's changes reach
subscribers, sinks and server clients in chunks: the engine must still agree with the
oracle on random streams with retractions.
"""

from __future__ import annotations

import random

import pytest

from factflow import EngineConfig
from factflow.arrangement.filed import FiledRows
from oracle import Oracle
from test_differential import run_stream

#: most iterations of these streams hold more rows than their share of a fetch
TINY = EngineConfig(fetch_limit=1)

RECURSIVE = {
    "reach": ("[:find ?a ?b :where (reach ?a ?b)]", (), "set"),
    "mutual-and-negation": ("[:find ?a ?b :where (even-hop ?a ?b) (not (reach ?b ?a))]", (), "set"),
    "sg": ("[:find ?x ?y :where [?x :d/flag true] (sg ?x ?y)]", (), "set"),
    "sources": ("[:find ?s ?b :in $ [?s ...] :where (reach ?s ?b)]", ([1, 4],), "set"),
}


@pytest.fixture
def writes(monkeypatch):
    """A list that grows by the rows of every set written to Spark as files."""
    written = []
    original = FiledRows.write.__func__

    def write(cls, *args, **kwargs):
        files = original(cls, *args, **kwargs)
        written.append(files.rows)
        return files

    monkeypatch.setattr(FiledRows, "write", classmethod(write))
    return written


NODES = range(1, 9)


def graph_transaction(rng: random.Random, oracle: Oracle) -> list:
    """One or two present :d/friend edges retracted, two to four new ones among eight
    nodes, and a :d/flag turned on or off."""
    present = sorted(oracle.facts.get(":d/friend", ()))
    gone = rng.sample(present, min(len(present), rng.randint(1, 2)))
    ops = [[":db/retract", e, ":d/friend", v] for e, v in gone]
    for _ in range(rng.randint(2, 4)):
        edge = (rng.choice(NODES), rng.choice(NODES))
        if edge not in gone:
            ops.append([":db/add", edge[0], ":d/friend", edge[1]])
    node = rng.choice(NODES)
    ops.append([":db/retract" if (node, True) in oracle.facts.get(":d/flag", ()) else ":db/add", node, ":d/flag", True])
    return ops


@pytest.mark.parametrize("name", list(RECURSIVE))
def test_recursion_over_sets_kept_in_spark_matches_the_oracle(spark, writes, name):
    # the query is installed twice: before the stream (closed halfway through it) and
    # after its third epoch, reading the rules the first one shares
    query = RECURSIVE[name]
    run_stream(spark, 300 + list(RECURSIVE).index(name), epochs=6, queries=[query, query], config=TINY,
               install_points=[0, 3], transaction=graph_transaction)
    assert any(writes), "no iteration was kept in Spark"
