"""Automatic sharing: clients asking one query with different constants share one dataflow.

Over real sockets, clients that name nothing ask the same query with their own constants,
written three ways (a ``=`` predicate, a constant in the pattern, an ``:in`` scalar) and in
a few shapes; a random stream of readings with retractions runs; after every epoch each
client's result equals the oracle's answer to its own query, as installing it alone would
give; the server holds one dataflow per shape, not per client; a client leaving retracts
its constants' parameter facts, and the family goes with its last member. The lifting
itself is checked without Spark.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from factflow import Engine, ServerError
from factflow.client import Client
from factflow.model.schema import Schema
from factflow.server import ServerThread
from factflow.server.lifting import lift
from oracle import Oracle, normalized

SHAPES = [
    lambda d: (f"[:find ?s :where [?d :device/speed ?s] [(= ?d {d})]]", ()),
    lambda d: ("[:find ?s :in $ ?d :where [?d :device/speed ?s]]", (d,)),
    lambda d: (f"[:find ?s :where [{d} :device/speed ?s]]", ()),
    lambda d: (f"[:find ?n ?s :where [?d :device/speed ?s] [?d :device/name ?n] [(= ?d {d})]]", ()),
    lambda d: (f"[:find (count ?d) :where [?d :device/zone ?z] [(= ?z \"zone-{d % 3}\")]]", ()),
]
DEVICES = list(range(1, 9))


def schema() -> Schema:
    s = Schema()
    s.create(":device/speed", "long", "one")
    s.create(":device/name", "string", "one")
    s.create(":device/zone", "string", "one")
    return s


def test_the_three_ways_of_writing_a_constant_lift_alike():
    """A ``=`` predicate and an ``:in`` scalar lift to the same family; a constant in the
    pattern to one of its own; what cannot be lifted says why."""
    eq, given = lift(*SHAPES[0](111), schema()), lift(*SHAPES[1](111), schema())
    inline = lift(*SHAPES[2](111), schema())
    assert eq.family == given.family and eq.text == given.text and eq.constants == given.constants == (111,)
    assert inline.family != eq.family and inline.constants == (111,)
    assert lift(*SHAPES[0](222), schema()).family == eq.family  # another constant, the same dataflow
    assert lift("[:find ?s :where [?d :device/speed ?s]]", (), schema()) is None  # nothing to lift
    assert lift("[:find ?s . :where [?d :device/speed ?s] [(= ?d 1)]]", (), schema()) is None  # a scalar find
    partial = lift("[:find ?d :where [?d :device/name \"x\"] (not [?d :device/speed 3]) [(> ?d 2)]]", (), schema())
    assert partial.constants == ("x",) and "out of its scope" in partial.explain() and "only = joins" in partial.explain()


@pytest.fixture(scope="module")
def server(spark):
    db = Engine(spark=spark)
    with ServerThread(db) as running:
        yield running, db
    db.close()


@pytest.fixture(autouse=True)
def _settled(request):
    """After a test with the server, wait until the epochs departing clients left for the
    command thread (retracting their constants) have run: a status request queues behind them."""
    yield
    if "server" in request.fixturenames:
        running, _ = request.getfixturevalue("server")
        time.sleep(0.3)
        with Client(running.url, timeout=120) as client:
            client.status()


def test_clients_with_their_own_constants_share_one_dataflow_and_see_their_own_rows(server):
    running, db = server
    rng = random.Random(3)
    oracle = Oracle()
    with Client(running.url, timeout=120) as admin:
        for name, kind in ((":device/speed", "long"), (":device/name", "string"), (":device/zone", "string")):
            admin.create_attribute(name, type=kind, semantics="one")
            oracle.create_attribute(name, kind, "one")
        before = admin.status()["dataflows"]
        clients, asked = [], []
        for i in range(10):
            shape, device = SHAPES[i % len(SHAPES)], rng.choice(DEVICES)
            text, inputs = shape(device)
            client = Client(running.url, timeout=120)
            handle = client.query(text, inputs=inputs)
            state = Counter(handle.results())
            handle.subscribe(lambda epoch, changes, state=state: state.update(dict(changes)))
            clients.append(client)
            asked.append((text, inputs, state, handle))
        assert all("lifted" in c.explain(h.name) for c, (_, _, _, h) in zip(clients, asked))
        families = admin.status()["dataflows"] - before
        assert families == 4  # = and :in share one; the pattern constant, the name join, the zone count their own
        try:
            for step in range(10):
                tx = []
                for d in rng.sample(DEVICES, 3):
                    roll = rng.random()
                    if roll < 0.2 and d in oracle.facts[":device/speed"] and step:
                        (e, v), = [(e, v) for (e, v) in oracle.facts[":device/speed"] if e == d]
                        tx.append([":db/retract", d, ":device/speed", v])
                    else:
                        tx.append([":db/add", d, ":device/speed", rng.randint(0, 9)])
                    if roll > 0.7:
                        tx.append([":db/add", d, ":device/zone", f"zone-{rng.randint(0, 2)}"])
                    if roll > 0.5:
                        tx.append([":db/add", d, ":device/name", f"n{rng.randint(0, 2)}"])
                admin.transact(tx)
                oracle.transact(tx)
                for text, inputs, state, _ in asked:
                    expected = normalized(oracle.query(text, inputs))
                    deadline = time.monotonic() + 5
                    while normalized(state) != expected and time.monotonic() < deadline:
                        time.sleep(0.05)
                    assert normalized(state) == expected, (text, inputs, step)
        finally:
            for client in clients:
                client.close()
        deadline = time.monotonic() + 10
        while admin.status()["dataflows"] > before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert admin.status()["dataflows"] == before  # every family went with its last member
        leftovers = [a for a in db.schema if str(a.name).startswith(":factflow-lift.")]
        assert leftovers and all(not db.query(f"[:find ?k :where [?k {a.name} _]]").rows() for a in leftovers)


def test_clients_may_not_write_the_servers_parameters(server):
    running, _ = server
    with Client(running.url, timeout=120) as client:
        client.create_attribute(":device/speed", type="long", semantics="one")
        client.query("[:find ?s :where [?d :device/speed ?s] [(= ?d 5)]]")
        family = [n for n in client.status()["queries"] if n.startswith("lift-")][0]
        with pytest.raises(ServerError, match="server's own") as refused:
            client.transact([[":db/add", -5, f":factflow-lift.{family}/p0", 6]])
        assert refused.value.category == "forbidden"
