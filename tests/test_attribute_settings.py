"""Attribute settings (``create_attribute(index=..., support=...)``): every setting under every
join strategy against the oracle, the errors and fallbacks of unsupported combinations, the
indexes each setting keeps, and the settings surviving a durable restart and the server."""

from __future__ import annotations

import random

import pytest

from factflow import Engine, EngineConfig, QueryError, SchemaError
from factflow.client import Client
from factflow.server import ServerThread
from factflow.storage.files import open_sealed_json, sealed_json, write_atomic
from oracle import Oracle, normalized

SETTINGS = [(index, support) for index in ("both", "forward") for support in ("wco", "delta", "basic")]
JOINS = ("binary", "delta", "wco", "auto")
# cyclic (auto picks wco where the attribute supports it); its joins look up both sides
QUERY = "[:find ?a ?b ?c :where [?a {a} ?b] [?b {a} ?c] [?a {a} ?c]]"


def attribute_of(index: str, support: str) -> str:
    return f":g.{index}/{support}"


def allowed(support: str, join: str) -> bool:
    return join in ("binary", "auto") or support == "wco" or (support == "delta" and join == "delta")


def installed(index: str, support: str, join: str) -> bool:
    """Whether the matrix installs this query: ``auto`` plans what one of the others plans,
    so it runs where it steps down to binary only (its choice for every setting: the
    policy test below)."""
    return join != "auto" or (index, support) == ("both", "basic")


def test_every_setting_under_every_join_strategy_matches_the_oracle(engine):
    oracle = Oracle()
    for index, support in SETTINGS:
        engine.create_attribute(attribute_of(index, support), type="ref", index=index, support=support)
        oracle.create_attribute(attribute_of(index, support), "ref")
    rng = random.Random(15)
    planted = {(0, 1), (1, 2), (0, 2)}  # a result (0 1 2) that the epoch below keeps
    seed = sorted({(rng.randrange(6), rng.randrange(6)) for _ in range(16)} | planted)
    tx = [[":db/add", e, attribute_of(*s), v] for s in SETTINGS for e, v in seed]
    engine.transact(tx)
    oracle.transact(tx)
    queries = {}
    for index, support in SETTINGS:
        name = attribute_of(index, support)
        for join in JOINS:
            if not allowed(support, join):
                with pytest.raises(QueryError, match=f"{name}.*support='{support}'"):
                    engine.query(QUERY.format(a=name), join=join)
                continue
            if installed(index, support, join):
                queries[(index, support, join)] = engine.query(QUERY.format(a=name), join=join)
    def check(when: str) -> None:
        for (index, support, join), q in queries.items():
            expected = normalized(oracle.query(QUERY.format(a=attribute_of(index, support))))
            assert expected, "a stream whose query results are empty checks little"
            assert normalized(q.rows()) == expected, (when, index, support, join)

    check("installed")
    adds = {(rng.randrange(6), rng.randrange(6)) for _ in range(5)} - set(seed)
    retracts = set(rng.sample(sorted(set(seed) - planted), 4))
    tx = [[op, e, attribute_of(*s), v] for s in SETTINGS
          for op, facts in ((":db/add", adds), (":db/retract", retracts)) for e, v in sorted(facts)]
    engine.transact(tx)
    oracle.transact(tx)
    check("after an epoch")

    held = engine.stats()["arrangements"]
    for index, support in SETTINGS:
        faces = {n.rsplit(" ", 1)[1] for n in held if n.startswith(attribute_of(index, support) + " ")}
        assert index == "both" or "reverse" not in faces, (index, support, faces)
        assert bool(faces & {"count_e", "count_v"}) == (support == "wco"), (index, support, faces)
        assert index == "both" or "count_v" not in faces, (index, support, faces)
    assert "reverse" in {n.rsplit(" ", 1)[1] for n in held if n.startswith(attribute_of("both", "wco"))}
    auto = queries[("both", "basic", "auto")]
    assert auto.dataflow.strategy == "binary" and "support='basic'" in auto.explain()


def test_settings_are_checked_and_reserved_names_refused(engine):
    with pytest.raises(SchemaError, match="unknown index 'backward'"):
        engine.create_attribute(":s/x", type="ref", index="backward")
    with pytest.raises(SchemaError, match="unknown support 'fast'"):
        engine.create_attribute(":s/x", type="ref", support="fast")
    engine.create_attribute(":s/x", type="ref", index="forward")
    engine.create_attribute(":s/x", type="ref", index="forward")  # identical again: a no-op
    with pytest.raises(SchemaError, match=":s/x already exists as ref/set/forward/wco"):
        engine.create_attribute(":s/x", type="ref")
    with pytest.raises(SchemaError, match="reserved"):
        engine.create_attribute(":factflow.mine/x", type="long")
    assert ":s/y" not in engine.schema and ":factflow.mine/x" not in engine.schema


def test_settings_survive_a_restart_from_the_log_and_from_a_checkpoint(spark, tmp_path):
    config = EngineConfig(checkpoint_interval=0)
    db = Engine(spark=spark, state_dir=str(tmp_path), config=config)
    db.create_attribute(":d/fwd", type="ref", index="forward", support="basic")
    db.create_attribute(":d/plain", type="ref")
    db.transact([[":db/add", 1, ":d/fwd", 2], [":db/add", 2, ":d/fwd", 3]])
    db.close()
    for step in ("log", "checkpoint"):
        db = Engine(spark=spark, state_dir=str(tmp_path), config=config)
        assert db.schema.get(":d/fwd").settings == {"index": "forward", "support": "basic", "slack": 0,
                                                    "parameter": False}, step
        assert db.schema.get(":d/plain").settings == {"index": "both", "support": "wco", "slack": 0,
                                                      "parameter": False}, step
        with pytest.raises(QueryError, match="support='basic'"):
            db.query("[:find ?a ?c :where [?a :d/fwd ?b] [?b :d/fwd ?c]]", join="delta")
        assert db.query("[:find ?a :where [?a :d/fwd 3]]").rows() == {(2,): 1}
        assert not any("reverse" in n for n in db.stats()["arrangements"])
        if step == "log":
            db.checkpoint()
        db.close()


def test_a_checkpoint_written_before_settings_opens_with_the_defaults(spark, tmp_path):
    config = EngineConfig(checkpoint_interval=0)
    db = Engine(spark=spark, state_dir=str(tmp_path), config=config)
    db.create_attribute(":d/old", type="long", semantics="one")
    db.transact([[":db/add", 1, ":d/old", 7]])
    db.checkpoint()
    db.close()
    manifest_path = next((tmp_path / "checkpoints").glob("*/manifest.json"))
    manifest = open_sealed_json(str(manifest_path))
    manifest["attributes"] = [a[:3] for a in manifest["attributes"]]  # as written before settings
    write_atomic(str(manifest_path), sealed_json(manifest))
    db = Engine(spark=spark, state_dir=str(tmp_path), config=config)
    assert db.schema.get(":d/old").settings == {"index": "both", "support": "wco", "slack": 0, "parameter": False}
    assert db.query("[:find ?v :where [1 :d/old ?v]]").rows() == {(7,): 1}
    db.close()


def test_settings_travel_over_the_server(engine):
    with ServerThread(engine) as server, Client(server.url, timeout=300) as client:
        reply = client.create_attribute(":srv/edge", type="ref", index="forward", support="delta", slack=2)
        assert reply == {"name": ":srv/edge", "type": "ref", "semantics": "set", "index": "forward",
                         "support": "delta", "slack": 2, "parameter": False}
        assert engine.schema.get(":srv/edge").settings == {"index": "forward", "support": "delta", "slack": 2, "parameter": False}
        with pytest.raises(Exception, match="conflict|already exists"):
            client.create_attribute(":srv/edge", type="ref")


def test_the_policy_errs_on_explicit_strategies_and_steps_auto_down():
    from factflow.planner.strategy import ConjunctionSummary, Strategy, choose

    cyclic = (frozenset({"a", "b"}), frozenset({"b", "c"}), frozenset({"a", "c"}))
    for support, auto in (("wco", Strategy.WCO), ("delta", Strategy.DELTA), ("basic", Strategy.BINARY)):
        summary = ConjunctionSummary(Strategy.AUTO, cyclic, False, support=((":x/e", "wco"), (":x/f", support)))
        strategy, reason = choose(summary)
        assert strategy == auto and (support == "wco" or f":x/f has support='{support}'" in reason)
    with pytest.raises(QueryError, match=r"join='wco' cannot read attribute :x/f: .*support='delta'"):
        choose(ConjunctionSummary(Strategy.WCO, cyclic, False, support=((":x/f", "delta"),)))
    with pytest.raises(QueryError, match=r"join='delta' cannot read attribute :x/f: .*support='basic'"):
        choose(ConjunctionSummary(Strategy.DELTA, cyclic, False, support=((":x/f", "basic"),)))
    single = ConjunctionSummary(Strategy.WCO, (frozenset({"a", "b"}),), False, support=((":x/f", "basic"),))
    assert choose(single)[0] == Strategy.BINARY  # nothing to join: nothing to refuse
