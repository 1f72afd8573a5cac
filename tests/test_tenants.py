"""Tenants over real sockets on 127.0.0.1: who may do what, published queries routed by
tenant, parameters retracted when a tenant leaves, and the checks behind them without Spark.

A server with a tenants file (two tenants, one canary tenant, an admin) serves devices and
their speeds; an admin publishes ``watch`` (the speed of every device a tenant watches,
routed by tenant) and ``entitled`` (joining facts an admin wrote about the tenant).
Each tenant's accumulated diffs must equal its own rows, computed independently, after
every epoch of a random stream of readings and of watch/unwatch parameters with
retractions; nothing of a device only the canary watches reaches another tenant.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import Counter

import pytest

from factflow import Engine, ServerError
from factflow.client import Client
from factflow.model.schema import Schema
from factflow.lang.rules import RuleStore
from factflow.server import ServerThread
from factflow.server.protocol import ProtocolError
from factflow.server.publication import check_publication
from factflow.server.tenants import Tenants, TenantsFileError, tenant_entity

TOKENS = {"acme": "acme-secret", "globex": "globex-secret", "canary": "canary-secret", "ops": "ops-secret"}
DEVICES = list(range(100, 112))
WATCH = ("[:find ?t ?d ?s :where [?t :param.watch/device ?d] [?d :device/speed ?s]]")


def tenants_file(tmp_path) -> str:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [
        {"name": name, "token_sha256": hashlib.sha256(token.encode()).hexdigest(),
         "role": "admin" if name == "ops" else "tenant"} for name, token in TOKENS.items()]}))
    return str(path)


@pytest.fixture(scope="module")
def server(spark, tmp_path_factory):
    db = Engine(spark=spark)
    tenants = Tenants.load(tenants_file(tmp_path_factory.mktemp("tenants")))
    with ServerThread(db, tenants=tenants) as running:
        with Client(running.url, token=TOKENS["ops"]) as admin:
            admin.create_attribute(":device/speed", type="long", semantics="one")
            admin.create_attribute(":param.watch/device", type="ref", parameter=True)
            admin.create_attribute(":tenant/may-read", type="ref")
            admin.publish("watch", WATCH, tenant="?t")
            admin.publish("entitled", "[:find ?t ?d ?s :where [?t :param.watch/device ?d] [?t :tenant/may-read ?d] "
                                      "[?d :device/speed ?s]]", tenant="?t")
            admin.publish("devices", "[:find ?d :where [?d :device/speed _]]")
        yield running
    db.close()


def connect(server, name: str, **options) -> Client:
    return Client(server.url, token=TOKENS[name], timeout=120, **options)


def settle(server) -> None:
    """Wait until what departed tenants left for the command thread (their parameters'
    retraction epochs) has run: a status request queues behind it."""
    time.sleep(0.3)
    with connect(server, "ops") as ops:
        ops.status()


@pytest.fixture(autouse=True)
def _settled(server):
    yield
    settle(server)


def test_hello_names_the_tenant_its_role_and_entity(server):
    with connect(server, "acme") as acme, connect(server, "ops") as ops:
        assert (acme.tenant, acme.role, acme.entity) == ("acme", "tenant", tenant_entity("acme"))
        assert (ops.tenant, ops.role, ops.entity) == ("ops", "admin", None)
    assert tenant_entity("acme") == tenant_entity("acme") != tenant_entity("globex")
    with pytest.raises(ServerError, match="wrong or missing token"):
        Client(server.url, token="forged")
    with pytest.raises(ServerError, match="wrong or missing token"):
        Client(server.url)


def test_each_tenant_receives_its_own_rows_and_nothing_else(server):
    """The per-tenant oracle: random readings (speeds overwritten), watches set and retracted;
    after every epoch each tenant's accumulated diffs equal its rows; a device only the canary
    watches never reaches another tenant."""
    rng = random.Random(5)
    canary_device = DEVICES[-1]
    with connect(server, "ops") as ops, connect(server, "acme") as acme, connect(server, "globex") as globex, \
            connect(server, "canary") as canary:
        tenants = {"acme": acme, "globex": globex, "canary": canary}
        seen = {name: Counter() for name in tenants}
        handles = {}
        for name, client in tenants.items():
            handles[name] = client.query(name="watch")
            handles[name].subscribe(lambda epoch, changes, n=name: seen[n].update(dict(changes)))
            seen[name].update(handles[name].results())
            assert handles[name].columns == ["?d", "?s"]  # without the tenant column
        speeds: dict[int, int] = {}
        watches = {name: set() for name in tenants}
        canary.transact([[":db/add", canary.entity, ":param.watch/device", canary_device]])
        watches["canary"].add(canary_device)
        for step in range(14):
            if step % 3:
                tx = [[":db/add", d, ":device/speed", rng.randint(0, 99)] for d in rng.sample(DEVICES, 4)]
                ops.transact(tx)
                speeds.update({op[1]: op[3] for op in tx})
            else:
                name = rng.choice(["acme", "globex"])
                client = tenants[name]
                device = rng.choice(DEVICES[:-1])
                op = ":db/retract" if device in watches[name] else ":db/add"
                client.transact([[op, client.entity, ":param.watch/device", device]])
                watches[name] ^= {device}
            time.sleep(0.05)  # let the other connections' pushes arrive
            for name in tenants:
                expected = Counter({(d, speeds[d]): 1 for d in watches[name] if d in speeds})
                deadline = time.monotonic() + 5
                while +seen[name] != expected and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert +seen[name] == expected, (name, step)
        assert all(row[0] != canary_device for name in ("acme", "globex") for row in seen[name])
        assert any(row[0] == canary_device for row in seen["canary"])
        status = ops.status()
        assert status["published"]["watch"]["tenant_routed"] and status["dataflows"] >= 3
        assert set(status["tenants"]) == set(TOKENS)
        assert acme.status()["queries"] == {"watch": 1} and "stats" not in acme.status()


def test_entitlements_narrow_what_a_tenant_sees(server):
    """A published query joining facts an admin wrote about the tenant: the tenant's own
    parameters can only narrow what it is entitled to."""
    with connect(server, "ops") as ops, connect(server, "globex", keep=True) as globex:
        q = globex.query(name="entitled")
        ops.transact([[":db/add", 103, ":device/speed", 7], [":db/add", 104, ":device/speed", 8],
                      [":db/add", globex.entity, ":tenant/may-read", 103]])
        globex.transact([[":db/add", globex.entity, ":param.watch/device", 103],
                         [":db/add", globex.entity, ":param.watch/device", 104]])
        assert q.results() == {(103, 7): 1}  # watching 104 too, but not entitled to it


def test_every_forbidden_op_of_a_tenant_is_refused_and_changes_nothing(server):
    with connect(server, "ops") as ops, connect(server, "acme") as acme:
        before = ops.status()["epoch"]
        parameters = "[:find ?e ?v :where [?e :param.watch/device ?v]]"
        facts = ops.q(parameters)
        refused = [
            lambda: acme.q("[:find ?d :where [?d :device/speed _]]"),
            lambda: acme.request("explain", name="watch"),
            lambda: acme.subscribe_attribute(":device/speed", lambda *_: None),
            lambda: acme.register("[[(r ?x) [?x :device/speed _]]]"),
            lambda: acme.create_attribute(":x/y", type="long"),
            lambda: acme.drop("watch"),
            lambda: acme.publish("mine", WATCH, tenant="?t"),
            lambda: acme.query("[:find ?d :where [?d :device/speed _]]"),
            lambda: acme.request("interest", name="watch", durable=True),
            lambda: acme.request("shutdown"),
            lambda: acme.transact([[":db/add", 100, ":device/speed", 1]]),                  # not its entity
            lambda: acme.transact([[":db/add", acme.entity, ":tenant/may-read", 100]]),    # not a parameter
            lambda: acme.transact([[":db/add", acme.entity, ":param.watch/device", 100],    # mixed: all refused
                                   [":db/add", tenant_entity("globex"), ":param.watch/device", 100]]),
            lambda: acme.transact(f"[[:db/add {tenant_entity('globex')} :param.watch/device 101]]"),
        ]
        for attempt in refused:
            with pytest.raises(ServerError) as error:
                attempt()
            assert error.value.category == "forbidden", error.value
        assert ops.status()["epoch"] == before
        assert ops.q(parameters) == facts
        assert acme.transact([[":db/add", acme.entity, ":param.watch/device", 100]]) > before  # allowed


def test_leaving_retracts_the_parameters_and_rejoining_starts_exact(server):
    with connect(server, "ops") as ops:
        ops.transact([[":db/add", 105, ":device/speed", 55]])
        acme = connect(server, "acme")
        acme.transact([[":db/add", acme.entity, ":param.watch/device", 105]])
        assert acme.query(name="watch").results() == {(105, 55): 1}
        acme.close()
        watched = f"[:find ?d :where [{tenant_entity('acme')} :param.watch/device ?d]]"
        deadline = time.monotonic() + 5
        while ops.q(watched) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ops.q(watched) == []  # retracted within a second or so, in an epoch of its own
        with connect(server, "acme") as again:
            q = again.query(name="watch")
            assert q.results() == {}  # exact: nothing left of before
            again.transact([[":db/add", again.entity, ":param.watch/device", 105]])
            assert q.results() == {(105, 55): 1}
        keeper = connect(server, "canary", keep=True)
        keeper.transact([[":db/add", keeper.entity, ":param.watch/device", 106]])
        keeper.close()
        time.sleep(1.0)
        assert (106,) in ops.q(f"[:find ?d :where [{tenant_entity('canary')} :param.watch/device ?d]]")  # kept


def test_a_tenant_vanishing_mid_epoch_harms_no_one(server):
    with connect(server, "ops") as ops, connect(server, "globex") as globex:
        watcher = globex.query(name="watch")
        globex.transact([[":db/add", globex.entity, ":param.watch/device", 107]])
        leaving = connect(server, "acme")
        leaving.query(name="watch")
        leaving.transact([[":db/add", leaving.entity, ":param.watch/device", 107]])
        leaving._ws.close()  # gone while the next epoch runs
        ops.transact([[":db/add", 107, ":device/speed", s] for s in [3]])
        deadline = time.monotonic() + 5
        while watcher.results().get((107, 3)) != 1 and time.monotonic() < deadline:  # sent after ops' reply
            time.sleep(0.05)
        assert watcher.results().get((107, 3)) == 1
        watched = f"[:find ?d :where [{tenant_entity('acme')} :param.watch/device ?d]]"
        deadline = time.monotonic() + 5
        while ops.q(watched) and time.monotonic() < deadline:  # its parameters go in an epoch of their own
            time.sleep(0.05)
        assert ops.q(watched) == []


# ---------------------------------------------------------------- the checks, without Spark

def test_a_bad_tenants_file_is_refused_naming_the_entry(tmp_path):
    cases = [("not json", "is not JSON"),
             (json.dumps({"tenants": []}), "non-empty list"),
             (json.dumps({"tenants": [{"name": "a", "token_sha256": "x" * 64, "role": "tenant"}]}), "tenant 0 .a.: token"),
             (json.dumps({"tenants": [{"name": "a", "token_sha256": "a" * 64, "role": "king"}]}), "role must be"),
             (json.dumps({"tenants": [{"name": "a", "token_sha256": "a" * 64, "role": "tenant"},
                                      {"name": "a", "token_sha256": "b" * 64, "role": "tenant"}]}), "tenant 1: the name"),
             (json.dumps({"tenants": [{"name": "a", "token_sha256": "a" * 64}]}), "exactly the fields")]
    for text, message in cases:
        path = tmp_path / "t.json"
        path.write_text(text)
        with pytest.raises(TenantsFileError, match=message):
            Tenants.load(str(path))


def test_what_may_be_published():
    schema = Schema()
    schema.create(":device/speed", "long", "one")
    schema.create(":param.watch/device", "ref", parameter=True)
    rules = RuleStore()
    rules.register("[[(watching ?t ?d) [?t :param.watch/device ?d]]]")
    assert check_publication(WATCH, "?t", schema, rules) == 0
    assert check_publication("[:find ?d :where [?d :device/speed _]]", None, schema, rules) is None
    bad = [("[:find ?d ?s :where [?t :param.watch/device ?d] [?d :device/speed ?s]]", "?t",
            "must be a plain variable"),
           ("[:find ?t ?s :where [?t :device/speed ?s] [?x :param.watch/device ?t]]", "?t",
            r"\[\?x :param.watch/device \?t\] reads the parameter attribute .* of another entity"),
           ("[:find ?d :where [?t :param.watch/device ?d]]", None, "public query reads the parameter"),
           ("[:find ?t ?d :where (watching ?t ?d)]", "?t", "inside rule watching"),
           ("[:find ?t (count ?d) :where [?t :param.watch/device ?d]]", "?s", "must be a plain variable")]
    for text, tenant, message in bad:
        with pytest.raises(ProtocolError, match=message) as refused:
            check_publication(text, tenant, schema, rules)
        assert refused.value.category == "incorrect"


def test_a_published_query_survives_a_restart_of_a_durable_server(spark, tmp_path):
    """Published on a server with a state directory, the query is installed again with its
    routing when the server restarts; a tenant's entity is the same."""
    tenants = Tenants.load(tenants_file(tmp_path))
    state = str(tmp_path / "state")
    with Engine(spark=spark, state_dir=state) as db, ServerThread(db, tenants=tenants) as running:
        with Client(running.url, token=TOKENS["ops"]) as admin:
            admin.create_attribute(":device/speed", type="long", semantics="one")
            admin.create_attribute(":param.watch/device", type="ref", parameter=True)
            assert admin.publish("watch", WATCH, tenant="?t")["durable"]
            admin.transact([[":db/add", 100, ":device/speed", 1], [":db/add", 101, ":device/speed", 2]])
        with Client(running.url, token=TOKENS["acme"], keep=True) as acme:
            acme.transact([[":db/add", acme.entity, ":param.watch/device", 100]])
    with Engine(spark=spark, state_dir=state) as db, ServerThread(db, tenants=tenants) as running:
        with Client(running.url, token=TOKENS["acme"]) as acme:
            assert acme.entity == tenant_entity("acme")
            assert acme.query(name="watch").results() == {(100, 1): 1}  # kept, and routed as before
        with Client(running.url, token=TOKENS["globex"]) as globex:
            assert globex.query(name="watch").results() == {}
        time.sleep(0.3)
        with Client(running.url, token=TOKENS["ops"]) as admin:
            admin.status()
