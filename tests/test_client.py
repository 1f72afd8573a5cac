"""The Python clients and the CLI end to end, against a real server over sockets on 127.0.0.1.

One server per module (on the test run's Spark session); each test uses attributes of a
namespace of its own (the ``ns`` fixture), so tests see only their own facts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import io
import itertools
import signal
import threading
import time

import pytest
from websockets.sync.server import serve as raw_serve

from factflow import ConnectionClosedError, Engine, EngineClosedError, RequestTimeoutError, ServerError
from factflow.cli import main as cli
from factflow.client import AsyncClient, Client
from factflow.client.messages import QueryState
from factflow.client.sync import Updates, _result
from factflow.server import ServerThread

_NAMESPACES = itertools.count(1)


@pytest.fixture(scope="module")
def engine_served(spark):
    db = Engine(spark=spark)
    yield db
    db.close()


@pytest.fixture(scope="module")
def server(engine_served):
    with ServerThread(engine_served) as running:
        yield running


@pytest.fixture
def ns() -> str:
    return f"ct{next(_NAMESPACES)}"


@pytest.fixture
def client(server):
    with Client(server.url, timeout=300) as c:
        yield c


def people(client: Client, ns: str) -> None:
    """Attributes ``:NS/name`` (string, one), ``:NS/age`` (long, one), ``:NS/knows`` (ref)."""
    client.create_attribute(f":{ns}/name", type="string", semantics="one")
    client.create_attribute(f":{ns}/age", type="long", semantics="one")
    client.create_attribute(f":{ns}/knows", type="ref")


def add(e, a, v):
    return [":db/add", e, a, v]


def retract(e, a, v):
    return [":db/retract", e, a, v]


def wait_until(condition, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ------------------------------------------------------------ the blocking client

def test_queries_assemble_the_engines_results_and_subscribers_read_their_writes(client, ns, engine_served):
    assert client.create_attribute(f":{ns}/name", type="string", semantics="one") == {
        "name": f":{ns}/name", "type": "string", "semantics": "one", "index": "both", "support": "wco", "slack": 0, "parameter": False}
    client.create_attribute(f":{ns}/knows", type="ref")
    client.transact([add(1, f":{ns}/name", "Ann"), add(2, f":{ns}/name", "Bo"), add(1, f":{ns}/knows", 2)])
    text = f"[:find ?n ?m :where [?x :{ns}/knows ?y] [?x :{ns}/name ?n] [?y :{ns}/name ?m]]"
    friends = client.query(text)
    assert friends.columns == ["?n", "?m"]
    assert friends.results() == {("Ann", "Bo"): 1}  # the whole result came before the reply
    seen = []
    friends.subscribe(lambda epoch, changes: seen.append((epoch, sorted(changes))))
    epoch = client.transact(f'[[:db/add 3 :{ns}/name "Cy"] [:db/add 2 :{ns}/knows 3]]')  # EDN text
    assert seen == [(epoch, [(("Bo", "Cy"), 1)])]  # delivered before transact returned
    epoch = client.transact([add(2, f":{ns}/name", "Bob"), retract(1, f":{ns}/knows", 2)])
    assert seen[-1] == (epoch, sorted([(("Ann", "Bo"), -1), (("Bo", "Cy"), -1), (("Bob", "Cy"), 1)]))
    assert friends.epoch == epoch
    local = engine_served.query(text)
    try:
        assert friends.results() == local.results() == {("Bob", "Cy"): 1}
    finally:
        local.close()
    assert friends.name in friends.explain()
    friends.close()
    assert friends.closed and friends.name not in client.status()["queries"]
    with pytest.raises(EngineClosedError, match="closed"):
        friends.subscribe(print)


def test_unnamed_queries_are_shared_by_clients_and_names_conflict(server, client, ns):
    people(client, ns)
    text = f"[:find ?n :where [_ :{ns}/name ?n]]"
    with Client(server.url) as other:
        mine, theirs = client.query(text), other.query(text)
        assert mine.name == theirs.name
        assert client.status()["queries"][mine.name] == 2
        with pytest.raises(ServerError) as twice:
            client.query(text)
        assert twice.value.category == "conflict" and twice.value.op == "interest"
        with pytest.raises(ServerError) as taken:
            other.query(f"[:find ?a :where [_ :{ns}/age ?a]]", name=mine.name)
        assert taken.value.category == "conflict"
        client.transact([add(1, f":{ns}/name", "Ann")])
        wait_until(lambda: theirs.results() == {("Ann",): 1})
        mine.close()
        assert client.status()["queries"][mine.name] == 1
    wait_until(lambda: mine.name not in client.status()["queries"])  # the last one out closes it


def test_rejected_requests_raise_server_errors_with_their_category(client, ns):
    people(client, ns)
    cases = [
        (lambda: client.transact([add(1, f":{ns}/nope", "x")]), "incorrect", f":{ns}/nope"),
        (lambda: client.transact([add(1, f":{ns}/age", "old")]), "incorrect", "not a valid long"),
        (lambda: client.transact("[[:db/add 1"), "incorrect", "malformed"),
        (lambda: client.query("[:find ?x :where [?x :nope/nope]]"), "incorrect", ":nope/nope"),
        (lambda: client.q("[:find ?x :where"), "incorrect", ""),
        (lambda: client.register("[[(r ?a) [?a"), "incorrect", ""),
        (lambda: client.create_attribute(f":{ns}/name", type="long"), "conflict", f":{ns}/name"),
        (lambda: client.explain("no-such-query"), "not-found", "no-such-query"),
        (lambda: client.subscribe_attribute(f":{ns}/nope", print), "incorrect", f":{ns}/nope"),
        (lambda: client.request("frobnicate"), "unsupported", "frobnicate"),
        (lambda: client.transact([add(1, f":{ns}/age", float("nan"))]), "incorrect", "JSON"),
    ]
    for call, category, fragment in cases:
        with pytest.raises(ServerError) as info:
            call()
        assert info.value.category == category, (category, str(info.value))
        assert fragment in str(info.value)
    assert client.query(f"[:find ?n :where [_ :{ns}/name ?n]]").results() == {}  # the client still works
    assert f":{ns}/nope" not in client.status()["stats"]["arrangements"]


def test_one_shot_queries_rules_inputs_and_instants(client, ns):
    people(client, ns)
    client.create_attribute(f":{ns}/born", type="instant", semantics="one")
    born = dt.datetime(1990, 5, 17, 8, 30, tzinfo=dt.timezone.utc)
    client.transact([add(1, f":{ns}/name", "Ann"), add(2, f":{ns}/name", "Bo"), add(3, f":{ns}/name", "Cy"),
                     add(1, f":{ns}/knows", 2), add(2, f":{ns}/knows", 3), add(1, f":{ns}/born", born)])
    assert client.register(f"[[(reach ?a ?b) [?a :{ns}/knows ?b]]"
                           f" [(reach ?a ?b) [?a :{ns}/knows ?c] (reach ?c ?b)]]") == ["reach"]
    rows = client.q(f"[:find ?m :in $ ?n :where [?x :{ns}/name ?n] (reach ?x ?y) [?y :{ns}/name ?m]]",
                    inputs=["Ann"])
    assert sorted(rows) == [("Bo",), ("Cy",)]
    assert client.q(f"[:find ?t :where [_ :{ns}/born ?t]]") == [("1990-05-17T08:30:00+00:00",)]
    assert client.q(f"[:find ?n :where [_ :{ns}/name ?n] [(= ?n \"Zed\")]]") == []


def test_attribute_feeds_and_unsubscribing(client, ns):
    people(client, ns)
    feed, other = [], []
    stop = client.subscribe_attribute(f":{ns}/name", lambda epoch, changes: feed.append((epoch, sorted(changes))))
    client.subscribe_attribute(f":{ns}/name", lambda epoch, changes: other.append(epoch))  # one subscribe request
    first = client.transact([add(1, f":{ns}/name", "Ann"), add(1, f":{ns}/age", 30)])
    second = client.transact([add(1, f":{ns}/name", "Anna")])
    assert feed == [(first, [((1, "Ann"), 1)]), (second, [((1, "Ann"), -1), ((1, "Anna"), 1)])]
    stop()
    third = client.transact([add(2, f":{ns}/name", "Bo")])
    assert len(feed) == 2 and other == [first, second, third]


def test_updates_iterate_from_the_current_result_and_end_with_the_query(client, ns):
    people(client, ns)
    client.transact([add(1, f":{ns}/name", "Ann")])
    names = client.query(f"[:find ?n :where [_ :{ns}/name ?n]]", name=f"{ns}-names")
    updates = names.updates(initial=True)
    assert next(updates) == (names.epoch, [(("Ann",), 1)])
    epoch = client.transact([add(2, f":{ns}/name", "Bo")])
    assert next(updates) == (epoch, [(("Bo",), 1)])
    names.close()
    assert list(updates) == []


def test_threads_share_one_client_and_subscribers_may_call_it(client, ns):
    people(client, ns)
    ages = client.query(f"[:find ?p ?a :where [?p :{ns}/age ?a]]")
    echoes = []

    def echo(epoch, changes):  # runs on the dispatcher; its own request must not deadlock
        for (person, age), diff in changes:
            if diff > 0 and person < 100:
                echoes.append(client.transact([add(person + 100, f":{ns}/age", age)]))

    ages.subscribe(echo)
    errors = []

    def work(person):
        try:
            client.transact([add(person, f":{ns}/age", person)])
            client.status()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(p,)) for p in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == []
    wait_until(lambda: len(ages.results()) == 8)
    assert ages.results() == {**{(p, p): 1 for p in range(1, 5)}, **{(p + 100, p): 1 for p in range(1, 5)}}
    assert len(echoes) == 4


def test_a_granularity_folds_diffs_into_one_per_window(client, ns):
    people(client, ns)
    names = client.query(f"[:find ?n :where [_ :{ns}/name ?n]]", granularity=2)
    times = [time.monotonic()]  # the whole result has just come
    names.subscribe(lambda epoch, changes: times.append(time.monotonic()))
    epochs = [client.transact([add(p, f":{ns}/name", name)]) for p, name in enumerate(["Ann", "Bo", "Cy"])]
    wait_until(lambda: names.epoch == epochs[-1])
    assert names.results() == {("Ann",): 1, ("Bo",): 1, ("Cy",): 1}
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert gaps and min(gaps) > 1.5, gaps  # at most one diff per two seconds, however fast the epochs


def test_tokens_are_sent_in_hello(engine_served, tmp_path, capsys):
    with ServerThread(engine_served, token="s3cret") as guarded:
        with pytest.raises(ServerError) as refused:
            Client(guarded.url)
        assert refused.value.category == "forbidden" and refused.value.op == "hello"
        with Client(guarded.url, token="s3cret") as c:
            assert c.status()["epoch"] == engine_served.epoch
        with pytest.raises(ConnectionClosedError, match="the client is closed"):
            c.status()
        token_file = tmp_path / "token"
        token_file.write_text("s3cret\n")
        assert cli(["status", guarded.url, "--token-file", str(token_file)]) == 0
        assert capsys.readouterr().out.startswith("epoch ")
        assert cli(["status", guarded.url]) == 1
        assert "wrong or missing token" in capsys.readouterr().err
        assert cli(["status", guarded.url, "--token-file", str(tmp_path / "missing")]) == 1
        assert "cannot read the token file" in capsys.readouterr().err


def test_a_closed_connection_fails_requests_and_ends_queries_saying_why(engine_served):
    with ServerThread(engine_served) as doomed:
        c = Client(doomed.url)
        c.create_attribute(":ctx/name", type="string")
        names = c.query("[:find ?n :where [_ :ctx/name ?n]]")
        updates = names.updates()
        c.shutdown()
        with pytest.raises(ConnectionClosedError, match=r"going away, 1001\): the server is shutting down"):
            next(updates)
        with pytest.raises(ConnectionClosedError, match="shutting down"):
            c.status()
        assert names.closed
        c.close()
    with pytest.raises(ConnectionClosedError, match="cannot connect"):
        Client(doomed.url, connect_timeout=5)


def test_timeouts_and_unreadable_messages_from_a_server():
    replies = {"silent": lambda request: None, "garbage": lambda request: "not json"}

    def handler(ws):
        behaviour = replies[ws.request.path.strip("/")]
        for frame in ws:
            if '"hello"' in frame:
                ws.send('{"id": 1, "ok": true, "result": {"protocol": 1, "client": "x", "epoch": 0}}')
            elif (answer := behaviour(frame)) is not None:
                ws.send(answer)

    with raw_serve(handler, "127.0.0.1", 0) as fake:
        port = fake.socket.getsockname()[1]
        threading.Thread(target=fake.serve_forever, daemon=True).start()
        with Client(f"ws://127.0.0.1:{port}/silent", timeout=0.5) as silent:
            with pytest.raises(RequestTimeoutError, match="status: no reply"):
                silent.status()
        with Client(f"ws://127.0.0.1:{port}/garbage") as garbage:
            with pytest.raises(ConnectionClosedError, match="cannot read a message"):
                garbage.status()
        fake.shutdown()


# ------------------------------------------------------------ the asyncio client

def test_the_async_client_mirrors_the_blocking_one(server, ns, engine_served):
    async def scenario():
        async with AsyncClient(server.url) as c:
            await c.create_attribute(f":{ns}/name", type="string", semantics="one")
            await c.create_attribute(f":{ns}/knows", type="ref")
            await c.transact([add(1, f":{ns}/name", "Ann"), add(2, f":{ns}/name", "Bo")])
            text = f"[:find ?n ?m :where [?x :{ns}/knows ?y] [?x :{ns}/name ?n] [?y :{ns}/name ?m]]"
            friends = await c.query(text, name=f"{ns}-friends")
            seen = []
            friends.subscribe(lambda epoch, changes: seen.append((epoch, changes)))
            updates = friends.updates(initial=True)
            assert await updates.__anext__() == (friends.epoch, [])
            epoch = await c.transact(f"[[:db/add 1 :{ns}/knows 2]]")
            assert seen == [(epoch, [(("Ann", "Bo"), 1)])]  # before transact returned
            assert await updates.__anext__() == (epoch, [(("Ann", "Bo"), 1)])
            assert friends.results() == engine_served.queries[f"{ns}-friends"].results()
            feed = []
            await c.subscribe_attribute(f":{ns}/name", lambda epoch, changes: feed.append(changes))
            await c.transact([add(3, f":{ns}/name", "Cy")])
            assert feed == [[((3, "Cy"), 1)]]
            assert await c.register(f"[[(named ?x ?n) [?x :{ns}/name ?n]]]") == ["named"]
            assert sorted(await c.q("[:find ?n :where (named _ ?n)]")) == [("Ann",), ("Bo",), ("Cy",)]
            assert f"{ns}-friends" in await friends.explain()
            status = await c.status()
            assert status["queries"][f"{ns}-friends"] == 1 and status["epoch"] == epoch + 1
            with pytest.raises(ServerError) as info:
                await c.transact([add(1, f":{ns}/knows", "Bo")])
            assert info.value.category == "incorrect"
            results = await asyncio.gather(*(c.transact([add(10 + i, f":{ns}/name", str(i))]) for i in range(4)))
            assert len(results) == 4 and await c.q(f"[:find (count ?x) :where [?x :{ns}/name _]]") == [(7,)]
            await friends.close()
            assert friends.closed and [u async for u in updates] == []
        with pytest.raises(ConnectionClosedError, match="closed"):
            await c.status()
        again = await AsyncClient.connect(server.url)
        await again.close()

    asyncio.run(scenario())


# ------------------------------------------------------------ the command line

def test_cli_commands_against_the_server(server, client, ns, capsys):
    people(client, ns)
    assert cli(["tx", server.url, f'[[:db/add 1 :{ns}/name "Ann"] [:db/add 2 :{ns}/name "Bo"] '
                                  f'[:db/add 1 :{ns}/age 31] [:db/add 2 :{ns}/age 7]]']) == 0
    assert capsys.readouterr().out == f"epoch {client.status()['epoch']}\n"
    assert cli(["query", server.url, f"[:find ?n ?a :where [?p :{ns}/name ?n] [?p :{ns}/age ?a]]"]) == 0
    assert capsys.readouterr().out == "?n   ?a\nAnn  31\nBo   7\n(2 rows)\n"
    assert cli(["query", server.url, f"[:find ?n :in $ ?a :where [?p :{ns}/age ?a] [?p :{ns}/name ?n]]",
                "--inputs", "[7]", "--name", f"{ns}-young"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("?n\nBo\n(1 row, epoch ") and f"{ns}-young" not in client.status()["queries"]
    held = client.query(f"[:find ?n :where [_ :{ns}/name ?n]]", name=f"{ns}-names")
    assert cli(["status", server.url]) == 0
    out = capsys.readouterr().out
    assert f"  {ns}-names" in out and "1 client\n" in out
    assert cli(["explain", server.url, held.name]) == 0
    assert capsys.readouterr().out.startswith(f"query {ns}-names")
    assert cli(["status", server.url, "--json"]) == 0
    assert '"stats"' in capsys.readouterr().out
    assert cli(["tx", server.url, f"[[:db/add 1 :{ns}/age \"old\"]]"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("factflow: ") and "not a valid long" in err
    assert cli(["explain", server.url, "nope"]) == 1
    assert capsys.readouterr().err.startswith("factflow: no query named 'nope'")


class _Watched(io.StringIO):
    """Standard output that tells a waiting thread when a fragment has been printed."""

    def __init__(self):
        super().__init__()
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        with self.changed:
            written = super().write(text)
            self.changed.notify_all()
        return written

    def wait_for(self, *fragments: str, seconds: float = 120) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: all(f in self.getvalue() for f in fragments), seconds)


def test_cli_follow_prints_changes_until_ctrl_c(server, client, ns, monkeypatch):
    people(client, ns)
    client.transact([add(1, f":{ns}/name", "Ann")])
    out = _Watched()
    monkeypatch.setattr("sys.stdout", out)
    problems = []

    def drive():  # stands for the user: change the data, watch the lines, press Ctrl-C
        try:
            if not out.wait_for("(1 row, epoch"):
                problems.append("no table")
            else:
                epoch = client.transact([add(1, f":{ns}/name", "Anna"), add(2, f":{ns}/name", "Bo")])
                if not out.wait_for(*(f"epoch {epoch}  {change}" for change in ("- Ann", "+ Anna", "+ Bo"))):
                    problems.append("no diff")
        finally:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    driver = threading.Thread(target=drive)
    driver.start()
    status = cli(["query", server.url, f"[:find ?n :where [_ :{ns}/name ?n]]", "--follow"])
    driver.join()
    assert problems == [] and status == 0
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["?n", "Ann", lines[2]] and lines[2].startswith("(1 row, epoch ")
    epoch = client.status()["epoch"]
    assert sorted(lines[3:]) == [f"epoch {epoch}  + Anna", f"epoch {epoch}  + Bo", f"epoch {epoch}  - Ann"]
    assert lines[3] == f"epoch {epoch}  - Ann"  # retractions first


@pytest.mark.parametrize("wait", ["diffs", "reply"])
def test_ctrl_c_stops_a_wait_that_started_as_the_signal_came(wait):
    """CPython lets only the main thread handle a signal, and a signal that comes just as the
    main thread starts an untimed wait does not wake it (this hung ``query --follow``). A
    signal delivered to another thread leaves the main thread in exactly that state: the
    waits for diffs and replies must notice it on their own."""
    updates, reply = Updates(QueryState("q"), initial=False), concurrent.futures.Future()
    released = threading.Event()

    def press_ctrl_c_elsewhere():
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # trips the flag, wakes nobody
        if not raised.wait(10):  # still blocked: release it so that the test fails instead of hanging
            released.set()
            updates._put((1, []))
            reply.set_result(None)

    raised = threading.Event()
    presser = threading.Thread(target=press_ctrl_c_elsewhere)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(updates) if wait == "diffs" else _result(reply, None)
            while not released.is_set():  # the pending handler runs at the latest here
                time.sleep(0.01)
        raised.set()
    finally:
        presser.join()
    assert not released.is_set(), "the wait did not notice Ctrl-C until it was released"


def test_durable_queries_and_drop(spark, tmp_path, ns):
    """``query(..., durable=True)`` outlives the client; ``drop`` removes it and ends the handle."""
    db = Engine(spark=spark, state_dir=str(tmp_path))
    try:
        with ServerThread(db) as running:
            with Client(running.url, timeout=300) as first:
                people(first, ns)
                kept = first.query(f"[:find ?n :where [_ :{ns}/name ?n]]", name="names", durable=True)
                assert kept.results() == {}
            with Client(running.url, timeout=300) as second:
                assert second.status()["queries"] == {"names": 0}
                second.transact([add(1, f":{ns}/name", "Ann")])
                view = second.query(f"[:find ?n :where [_ :{ns}/name ?n]]", name="names")
                assert view.results() == {("Ann",): 1}
                second.drop("names")
                assert view.closed and second.status()["queries"] == {}
                with pytest.raises(ServerError) as missing:
                    second.drop("names")
                assert missing.value.category == "not-found"
    finally:
        db.close()
