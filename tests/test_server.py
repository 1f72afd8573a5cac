"""The server end to end over real sockets on 127.0.0.1, with raw WebSocket clients.

One server per module (on the test run's Spark session); each test uses attribute and
query names of its own. The Python client library has its own tests (test_client.py).
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from factflow import Engine
from factflow.server import ServerConfig, ServerThread
from oracle import Oracle


class Raw:
    """A bare protocol client: sends requests, collects pushes, returns each reply."""

    def __init__(self, url: str, **kwargs):
        self.ws = connect(url, **kwargs).__enter__()
        self.pushes: list[dict] = []
        self.received: list[dict] = []  # every message, in arrival order
        self._ids = iter(range(1, 10**9))

    def send(self, payload) -> None:
        self.ws.send(payload if isinstance(payload, (str, bytes)) else json.dumps(payload))

    def next_reply(self, timeout: float = 120) -> dict:
        while True:
            message = json.loads(self.ws.recv(timeout=timeout))
            self.received.append(message)
            if "type" in message:
                self.pushes.append(message)
            else:
                return message

    def call(self, op: str, **fields) -> dict:
        request_id = next(self._ids)
        self.send({"op": op, "id": request_id, **fields})
        reply = self.next_reply()
        assert reply["id"] == request_id
        return reply

    def ok(self, op: str, **fields):
        reply = self.call(op, **fields)
        assert reply["ok"], reply
        return reply["result"]

    def drain(self, seconds: float = 0.3) -> None:
        """Collect pushes that arrive within ``seconds``."""
        try:
            while True:
                message = json.loads(self.ws.recv(timeout=seconds))
                self.received.append(message)
                self.pushes.append(message)
        except TimeoutError:
            pass

    def close(self) -> None:
        self.ws.close()


@pytest.fixture(scope="module")
def server(spark):
    db = Engine(spark=spark)
    with ServerThread(db, config=ServerConfig(max_frame_bytes=1 << 20, max_waiting_rows=5_000)) as running:
        yield running
    db.close()


@pytest.fixture
def client(server):
    c = Raw(server.url)
    yield c
    c.close()


def accumulated(pushes: list[dict], query: str) -> Counter:
    total: Counter = Counter()
    for message in pushes:
        if message.get("type") == "diff" and message["query"] == query:
            for row, diff in message["changes"]:
                total[tuple(row)] += diff
    return +total


def test_hello_and_status(client):
    hello = client.ok("hello", protocol=1)
    assert hello["protocol"] == 1 and hello["client"].startswith("c")
    assert client.call("hello", protocol=2)["error"]["category"] == "unsupported"
    status = client.ok("status")
    assert status["clients"] >= 1 and "stats" in status


def test_shared_and_private_interests(server):
    a, b = Raw(server.url), Raw(server.url)
    try:
        a.ok("create-attribute", name=":s1/name", type="string", semantics="one")
        a.ok("create-attribute", name=":s1/knows", type="ref")
        text = "[:find ?n ?m :where [?x :s1/knows ?y] [?x :s1/name ?n] [?y :s1/name ?m]]"
        a.ok("transact", tx=[[":db/add", 1, ":s1/name", "Ann"], [":db/add", 2, ":s1/name", "Bo"],
                             [":db/add", 1, ":s1/knows", 2]])
        first = a.ok("interest", name="s1-friends", query=text)
        assert first["columns"] == ["?n", "?m"]
        assert a.pushes[-1] == {"type": "diff", "query": "s1-friends", "epoch": first["epoch"],
                                "changes": [[["Ann", "Bo"], 1]]}  # the current result, before the reply
        b.ok("interest", name="s1-friends", query=text.replace(" :where", "\n :where"))  # same query, other spacing
        b.ok("interest", name="s1-names", query="[:find ?n :where [_ :s1/name ?n]]")
        assert server.server.interests.counts()["s1-friends"] == 2
        conflict = b.call("interest", name="s1-friends", query="[:find ?n :where [_ :s1/name ?n]]")
        assert conflict["error"]["category"] == "conflict"
        epoch = a.ok("transact", tx="[[:db/add 3 :s1/name \"Cy\"] [:db/add 2 :s1/knows 3]]")["epoch"]
        # read your writes: a's diff of its epoch came before the reply
        assert a.received[-2] == {"type": "diff", "query": "s1-friends", "epoch": epoch,
                                  "changes": [[["Bo", "Cy"], 1]]}
        assert a.received[-1]["result"] == {"epoch": epoch}
        b.drain()
        assert accumulated(b.pushes, "s1-friends") == Counter({("Ann", "Bo"): 1, ("Bo", "Cy"): 1})
        assert accumulated(b.pushes, "s1-names") == Counter({("Ann",): 1, ("Bo",): 1, ("Cy",): 1})
        assert all(m["query"] != "s1-names" for m in a.pushes)  # diffs only to interested clients
        assert "s1-friends" in a.ok("explain", name="s1-friends")["text"]
        assert a.call("explain", name="nope")["error"]["category"] == "not-found"
        a.ok("uninterest", name="s1-friends")
        assert a.call("uninterest", name="s1-friends")["error"]["category"] == "not-found"
        assert server.server.interests.counts()["s1-friends"] == 1
        b.close()  # disconnect releases b's interests, and the last one out closes the query
        deadline = time.time() + 30
        while "s1-friends" in server.server.interests.counts() and time.time() < deadline:
            time.sleep(0.05)
        assert "s1-friends" not in a.ok("status")["queries"]
        assert "s1-friends" not in server.server.engine.queries
    finally:
        a.close()
        b.close()


def test_one_shot_query_and_attribute_subscription(server):
    a, b = Raw(server.url), Raw(server.url)
    try:
        a.ok("create-attribute", name=":s2/at", type="instant")
        a.ok("create-attribute", name=":s2/score", type="double")
        b.ok("subscribe", attribute=":s2/at")
        a.ok("transact", tx=[[":db/add", 7, ":s2/at", "2026-11-22T10:00:00Z"], [":db/add", 7, ":s2/score", 1.5]])
        answer = a.ok("query", query="[:find ?t ?s :where [?e :s2/at ?t] [?e :s2/score ?s]]")
        assert answer["rows"] == [["2026-11-22T10:00:00+00:00", 1.5]] and answer["epoch"] >= 1
        assert "s2" not in json.dumps(a.ok("status")["queries"])  # nothing left installed
        b.drain()
        assert b.pushes[-1]["type"] == "attribute" and b.pushes[-1]["attribute"] == ":s2/at"
        assert b.pushes[-1]["changes"] == [[[7, "2026-11-22T10:00:00+00:00"], 1]]
        b.ok("unsubscribe", attribute=":s2/at")
        assert b.call("unsubscribe", attribute=":s2/at")["error"]["category"] == "not-found"
        unnamed = a.ok("interest", query="[:find ?s :where [_ :s2/score ?s]]")
        assert unnamed["name"].startswith("q-") and a.pushes[-1]["query"] == unnamed["name"]
        assert b.ok("interest", query="[:find ?s\n :where [_ :s2/score ?s]]")["name"] == unnamed["name"]
        a.ok("transact", tx=[[":db/add", 8, ":s2/at", "2026-11-23T10:00:00+01:00"]])
        b.drain()
        assert [m["type"] for m in b.pushes].count("attribute") == 1  # none after unsubscribing
        bad = a.call("transact", tx=[[":db/add", 7, ":s2/at", "yesterday"]])
        assert bad["error"]["category"] == "incorrect" and "yesterday" in bad["error"]["message"]
    finally:
        a.close()
        b.close()


def test_group_commit_with_a_rejected_transaction(server):
    setup = Raw(server.url)
    setup.ok("create-attribute", name=":s3/v", type="long", semantics="one")
    setup.ok("interest", name="s3", query="[:find ?e ?v :where [?e :s3/v ?v]]")
    clients = [Raw(server.url) for _ in range(6)]
    worker = server.server.worker
    try:
        with server.server.engine._lock:  # hold epochs back while every client's transaction queues up
            for i, c in enumerate(clients):
                value = "bad" if i == 3 else i
                c.send({"op": "transact", "id": i, "tx": [[":db/add", 100 + i, ":s3/v", value]]})
            # until they are queued, or for 3 s: the command thread may already have taken them
            # into one group, which waits for the engine with the queue empty
            deadline = time.time() + 3
            while len(worker._queue) < len(clients) - 1 and time.time() < deadline:
                time.sleep(0.01)
        replies = [c.next_reply() for c in clients]
        assert replies[3]["error"]["category"] == "incorrect" and "bad" in replies[3]["error"]["message"]
        epochs = [r["result"]["epoch"] for i, r in enumerate(replies) if i != 3]
        assert len(set(epochs)) <= 2  # the queued ones share one epoch (the first may have run alone)
        group = setup.ok("status")["group_commit"]
        assert group["transactions"] >= 5 and group["epochs"] < group["transactions"]
        setup.drain()
        assert accumulated(setup.pushes, "s3") == Counter({(100 + i, i): 1 for i in range(6) if i != 3})
    finally:
        for c in clients + [setup]:
            c.close()


def test_bad_input_never_harms_others(server):
    bystander = Raw(server.url)
    bystander.ok("create-attribute", name=":s4/n", type="long")
    bystander.ok("interest", name="s4", query="[:find ?v :where [_ :s4/n ?v]]")
    bad = Raw(server.url)
    try:
        checks = [
            ("{not json", "incorrect"),
            ("[]", "incorrect"),
            (json.dumps({"id": 1}), "incorrect"),                                   # no op
            (json.dumps({"op": "teleport", "id": 2}), "unsupported"),
            (json.dumps({"op": "transact", "id": 3}), "incorrect"),                  # missing field
            (json.dumps({"op": "transact", "id": 4, "tx": 5}), "incorrect"),         # wrong type
            (json.dumps({"op": "interest", "id": 5, "name": "x", "query": "[:find"}), "incorrect"),
            (json.dumps({"op": "interest", "id": 6, "name": "x", "query": "[:find ?a :where [?a :s4/zz ?b]]"}),
             "incorrect"),
            (json.dumps({"op": "register", "id": 7, "rules": "[[(s4r ?a ?z) [?a :s4/n ?b]]]"}), "incorrect"),  # unsafe
            (json.dumps({"op": "register", "id": 7, "rules": "[[(s4n ?a) [?a :s4/n ?b] (not (s4n ?a))]]"}),
             "incorrect"),                                                          # negation through recursion
            (json.dumps({"op": "query", "id": 7, "query": "[:find ?a :in $ % :where (s4n ?a)]"}), "incorrect"),
            (json.dumps({"op": "status", "id": 8, "extra": 1}), "incorrect"),
            (json.dumps({"op": "subscribe", "id": 9, "attribute": ":s4/none"}), "incorrect"),
            (json.dumps({"op": "transact", "id": 10, "tx": [[":db/add", "e", ":s4/n", 1]]}), "incorrect"),
            (json.dumps({"op": "create-attribute", "id": 11, "name": ":s4/n", "type": "string"}), "conflict"),
            (b"\x00\x01binary", "unsupported"),
        ]
        for payload, category in checks:
            bad.send(payload)
            reply = bad.next_reply()
            if category is None:
                assert reply["ok"], reply
                continue
            assert reply["ok"] is False and reply["error"]["category"] == category, (payload, reply)
        # a flood: a thousand requests in one frame, each answered in order
        bad.send(json.dumps([{"op": "teleport", "id": i} for i in range(1000)]))
        assert [bad.next_reply()["id"] for _ in range(1000)] == list(range(1000))
        epoch = bystander.ok("transact", tx=[[":db/add", 1, ":s4/n", 42]])["epoch"]
        assert bystander.received[-2]["changes"] == [[[42], 1]] and bystander.received[-2]["epoch"] == epoch
        # an oversized frame closes that connection only (1009), the others go on
        bad.send("[" + " " * (1 << 20) + "]")
        with pytest.raises(ConnectionClosed) as closed:
            bad.next_reply()
        assert closed.value.rcvd.code == 1009
        assert bystander.ok("transact", tx=[[":db/add", 2, ":s4/n", 43]])["epoch"] == epoch + 1
    finally:
        bad.close()
        bystander.close()


def test_a_slow_client_is_dropped_without_stalling_others(spark):
    db = Engine(spark=spark)
    with ServerThread(db, config=ServerConfig(max_waiting_rows=1_000)) as running:
        writer = Raw(running.url)
        writer.ok("create-attribute", name=":s5/text", type="string")
        host, port = running.url[len("ws://"):].rstrip("/").split(":")
        slow = socket.socket()  # a client that shakes hands, asks, and never reads
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect((host, int(port)))
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        time.sleep(0.5)
        request = json.dumps({"op": "interest", "id": 1, "name": "s5",
                              "query": "[:find ?e ?t :where [?e :s5/text ?t]]"}).encode()
        slow.sendall(bytes([0x81, 0x80 | len(request)]) + b"\x00\x00\x00\x00" + request)
        try:
            deadline = time.time() + 60
            while not db.queries and time.time() < deadline:
                time.sleep(0.05)
            base = 0
            for _ in range(20):  # 4 MB of changes per epoch: the socket's buffers fill within a few epochs
                started = time.perf_counter()
                writer.ok("transact", tx=[[":db/add", base + i, ":s5/text", f"{base + i}:" + "x" * 4000]
                                          for i in range(1000)])
                assert time.perf_counter() - started < 60  # never stalled by the slow reader
                base += 1000
                if "s5" not in running.server.interests.counts():
                    break
            deadline = time.time() + 30
            while "s5" in running.server.interests.counts() and time.time() < deadline:
                time.sleep(0.05)
            assert "s5" not in writer.ok("status")["queries"]  # dropped, its interest released
        finally:
            slow.close()
            writer.close()
    db.close()


def test_tokens(spark):
    db = Engine(spark=spark)
    try:
        with ServerThread(db, token="s3cret") as running:
            c = Raw(running.url)
            assert c.call("status")["error"]["category"] == "forbidden"
            assert c.call("hello", protocol=1, token="wrong")["error"]["category"] == "forbidden"
            assert c.call("status")["error"]["category"] == "forbidden"
            c.ok("hello", protocol=1, token="s3cret")
            assert c.ok("status")["epoch"] == 0
            c.close()
            header = Raw(running.url, additional_headers={"Authorization": "Bearer s3cret"})
            assert header.ok("status")["epoch"] == 0
            header.ok("shutdown")
            header.close()
            running._thread.join(60)
            assert not running._thread.is_alive()  # shut down by the request
    finally:
        db.close()


def test_exposed_address_needs_a_token(spark):
    from factflow.server import ServerStartError

    db = Engine(spark=spark)
    try:
        with pytest.raises(ServerStartError, match="token"):
            ServerThread(db, host="0.0.0.0")
    finally:
        db.close()


def test_diffs_over_the_wire_match_the_oracle(server):
    """Random facts with retractions; clients interested from the start and mid-stream."""
    rng = random.Random(7)
    oracle = Oracle()
    writer = Raw(server.url)
    for name, kind, semantics in [(":s6/edge", "ref", "set"), (":s6/label", "string", "one")]:
        writer.ok("create-attribute", name=name, type=kind, semantics=semantics)
        oracle.create_attribute(name, kind, semantics)
    rules = "[[(reach ?a ?b) [?a :s6/edge ?b]] [(reach ?a ?b) [?a :s6/edge ?c] (reach ?c ?b)]]"
    writer.ok("register", rules=rules)
    oracle.register(rules)
    queries = {
        "s6-two-hop": "[:find ?a ?c :where [?a :s6/edge ?b] [?b :s6/edge ?c]]",
        "s6-labelled": "[:find ?l ?b :where [?a :s6/label ?l] [?a :s6/edge ?b] (not [?b :s6/label \"x\"])]",
        "s6-reach": "[:find ?a ?b :in $ % :where (reach ?a ?b)]",
        "s6-count": "[:find ?l (count ?a) :where [?a :s6/label ?l]]",
    }
    early, late = Raw(server.url), Raw(server.url)
    try:
        for name, text in queries.items():
            early.ok("interest", name=name, query=text)
        facts: set = set()
        for step in range(8):
            tx, touched = [], set()
            for _ in range(rng.randint(1, 6)):
                if facts - touched and rng.random() < 0.35:
                    e, v = rng.choice(sorted(facts - touched))
                    facts.discard((e, v))
                    tx.append([":db/retract", e, ":s6/edge", v])
                else:
                    e, v = rng.randint(1, 7), rng.randint(1, 7)
                    if (e, v) not in facts and (e, v) not in touched:
                        facts.add((e, v))
                        tx.append([":db/add", e, ":s6/edge", v])
                touched.add((e, v))
            if rng.random() < 0.5:
                tx.append([":db/add", rng.randint(1, 7), ":s6/label", rng.choice("xyz")])
            writer.ok("transact", tx=tx)
            oracle.transact(tx)
            if step == 3:
                for name, text in queries.items():
                    late.ok("interest", name=name, query=text)
            for c in (early, late) if step >= 3 else (early,):
                c.drain(0.2)
                for name, text in queries.items():
                    expected = Counter({tuple(row): n for row, n in oracle.query(text).items()})
                    assert accumulated(c.pushes, name) == expected, (step, name)
    finally:
        for c in (writer, early, late):
            c.close()


def test_serve_command_starts_and_stops_cleanly(tmp_path):
    refused = subprocess.run([sys.executable, "-m", "factflow", "serve", "--host", "0.0.0.0"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "token" in refused.stderr
    process = subprocess.Popen([sys.executable, "-m", "factflow", "serve", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline().strip()
        assert line.startswith("factflow serving ws://127.0.0.1:"), line
        c = Raw(line.split()[-1])
        c.ok("create-attribute", name=":x/n", type="long")
        assert c.ok("transact", tx=[[":db/add", 1, ":x/n", 1]])["epoch"] == 1
        process.send_signal(2 if sys.platform == "win32" else 15)
        with pytest.raises(ConnectionClosed) as closed:
            c.next_reply()
        assert closed.value.rcvd.code == 1001
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_durable_interests_survive_clients_and_restarts(spark, tmp_path):
    """A durable interest stays installed without clients, comes back when the server
    restarts on its state directory (holding the result the epochs made), and goes when
    dropped; without a state directory it is refused."""
    query = "[:find ?a ?c :where [?a :k/to ?b] [?b :k/to ?c]]"
    expected: Counter = Counter()

    def serve():
        db = Engine(spark=spark, state_dir=str(tmp_path))
        return db, ServerThread(db)

    db, running = serve()
    with running:
        a = Raw(running.url)
        a.ok("create-attribute", name=":k/to", type="ref")
        assert a.ok("interest", name="hops", query=query, durable=True)["durable"] is True
        a.ok("interest", name="passing", query="[:find ?a :where [?a :k/to _]]")
        a.ok("transact", tx=[[":db/add", 1, ":k/to", 2], [":db/add", 2, ":k/to", 3]])
        a.close()
        b = Raw(running.url)
        queries = b.ok("status")["queries"]
        while "passing" in queries:  # a's departure is handled by the command thread
            queries = b.ok("status")["queries"]
        assert queries == {"hops": 0}
        b.ok("transact", tx=[[":db/add", 3, ":k/to", 4]])  # with nobody listening, still maintained
        b.close()
    db.close()
    expected.update({(1, 3): 1, (2, 4): 1})

    db, running = serve()
    with running:
        c = Raw(running.url)
        assert c.ok("status")["queries"] == {"hops": 0}
        assert c.ok("interest", name="hops", query=query)["epoch"] == 2
        c.ok("transact", tx=[[":db/retract", 2, ":k/to", 3]])
        expected.subtract({(1, 3): 1, (2, 4): 1})
        assert accumulated(c.pushes, "hops") == +expected
        refused = c.call("interest", name="hops", query="[:find ?a :where [?a :k/to _]]")
        assert refused["error"]["category"] == "conflict"
        d = Raw(running.url)
        d.ok("interest", name="hops", query=query)
        assert d.call("drop", name="hops")["error"]["category"] == "conflict"  # c is interested too
        d.close()
        while c.ok("status")["clients"] > 1:
            pass
        c.ok("drop", name="hops")
        assert c.ok("status")["queries"] == {}
        c.close()
    db.close()

    db, running = serve()
    with running:
        e = Raw(running.url)
        assert e.ok("status")["queries"] == {}
        e.close()
    db.close()


def test_durable_interests_need_a_state_dir(client):
    reply = client.call("interest", name="kept", query="[:find ?a :where [?a :x/never _]]", durable=True)
    assert not reply["ok"] and reply["error"]["category"] == "unsupported" and "state" in reply["error"]["message"]


def test_replies_go_out_before_other_clients_diffs_of_their_epoch(spark):
    """What the command thread hands over is queued in order, then the writers of replying
    connections wake first: a writer's own diffs still precede its reply (read your
    writes), and its reply does not wait for the epoch's diffs to every other client."""
    import asyncio
    from types import SimpleNamespace

    from factflow.server.interests import Listener
    from factflow.server.outbox import Outbox
    from factflow.server.protocol import Request
    from factflow.server.server import Server
    from factflow.server.worker import Command

    sent: list[tuple[str, str]] = []

    async def scenario() -> None:
        hub = Server(db)
        names = ("watcher-1", "writer", "watcher-2")
        hub._connections = {n: SimpleNamespace(outbox=Outbox(100)) for n in names}

        async def write(name: str) -> None:
            while (message := await hub._connections[name].outbox.next()) is not None:
                sent.append((name, message.get("type", "reply")))

        writers = [asyncio.create_task(write(n)) for n in names]
        await asyncio.sleep(0)
        request = Request("transact", 7, {"tx": []})
        command = Command("transact", {"tx": []}, Listener("writer"),
                          (hub._connections["writer"], request, asyncio.get_running_loop().create_future()))
        hub._deliver([("push", n, "diff", "q", 5, [((1,), 1)], False) for n in names]
                     + [("done", command, {"epoch": 5}, None)])
        await asyncio.sleep(0.05)
        for connection in hub._connections.values():
            connection.outbox.close()
        await asyncio.gather(*writers)

    db = Engine(spark=spark)
    try:
        asyncio.run(scenario())
    finally:
        db.close()
    assert sent == [("writer", "diff"), ("writer", "reply"), ("watcher-1", "diff"), ("watcher-2", "diff")]
