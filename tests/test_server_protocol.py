"""The server's request checks and client outboxes, without Spark or sockets."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest

from factflow.model.pulled import PullMap
from factflow.server.outbox import Outbox
from factflow.server.protocol import ProtocolError, encode, parse_frame


def test_a_frame_holds_one_request_or_an_array():
    [one] = parse_frame('{"op": "status", "id": "a"}')
    assert (one.op, one.id, one.fields) == ("status", "a", {})
    many = parse_frame('[{"op": "status", "id": 1}, {"op": "transact", "id": 2, "tx": "[]"}]')
    assert [r.op for r in many] == ["status", "transact"]


@pytest.mark.parametrize("text, message", [
    ("{", "not valid JSON"),
    ("[]", "empty array"),
])
def test_bad_frames(text, message):
    with pytest.raises(ProtocolError, match=message) as error:
        parse_frame(text)
    assert error.value.category == "incorrect"


@pytest.mark.parametrize("request_, category, message", [
    (5, "incorrect", "must be a JSON object"),
    ({"id": 1}, "incorrect", "no \"op\""),
    ({"id": 1, "op": 3}, "incorrect", "\"op\" must be a string"),
    ({"id": 1, "op": "fly"}, "unsupported", "unknown op 'fly'"),
    ({"id": 1, "op": "transact"}, "incorrect", "missing field \"tx\""),
    ({"id": 1, "op": "transact", "tx": {}}, "incorrect", "must be an array or a string"),
    ({"id": 1, "op": "hello", "protocol": True}, "incorrect", "must be an integer, got a boolean"),
    ({"id": 1, "op": "interest", "name": "q", "query": "[]", "granularity": "1"}, "incorrect", "granularity"),
    ({"id": 1, "op": "status", "verbose": True}, "incorrect", "unknown field"),
])
def test_bad_requests_name_what_is_wrong(request_, category, message):
    [error] = parse_frame(json.dumps(request_))
    assert isinstance(error, ProtocolError)
    assert error.category == category and message in str(error)
    assert error.request_id == (request_.get("id") if isinstance(request_, dict) else None)


def test_values_are_encoded_as_json():
    instant = dt.datetime(2026, 11, 22, 10, 0)
    assert json.loads(encode({"v": [1, 1.5, "s", True, instant]})) == {"v": [1, 1.5, "s", True, "2026-11-22T10:00:00+00:00"]}
    pulled = PullMap({":p/name": "Ann", ":p/knows": (PullMap({":p/name": "Bo"}),), ":p/seen": instant})
    assert json.loads(encode({"v": [pulled]})) == {"v": [{":p/name": "Ann", ":p/knows": [{":p/name": "Bo"}],
                                                          ":p/seen": "2026-11-22T10:00:00+00:00"}]}


def run(coroutine):
    return asyncio.run(coroutine)


def test_outbox_keeps_order_and_folds_changes_while_the_client_lags():
    async def scenario():
        box = Outbox(max_rows=100)
        box.changes("diff", "q", 1, [(("a",), 1)], always=True)
        box.reply({"id": 1})
        box.changes("diff", "q", 2, [(("b",), 1)])
        box.changes("diff", "r", 2, [(("x",), 1)])
        box.changes("diff", "q", 3, [(("b",), -1), (("c",), 1)])  # folded into the waiting epoch-2 message
        box.reply({"id": 2})
        out = []
        while box.pending():
            out.append(await box.next())
        return out

    out = run(scenario())
    assert out == [
        {"type": "diff", "query": "q", "epoch": 1, "changes": [[["a"], 1]]},
        {"id": 1},
        {"type": "diff", "query": "q", "epoch": 3, "changes": [[["c"], 1]]},
        {"type": "diff", "query": "r", "epoch": 2, "changes": [[["x"], 1]]},
        {"id": 2},
    ]


def test_outbox_overflows_past_its_bound():
    async def scenario():
        box = Outbox(max_rows=3)
        box.changes("attribute", ":a", 1, [((1, "x"), 1), ((2, "y"), 1)])
        assert not box.overflowed
        box.changes("attribute", ":a", 2, [((3, "z"), 1), ((4, "w"), 1)])
        return box.overflowed, await box.next()

    assert run(scenario()) == (True, None)


def test_outbox_makes_room_for_the_next_chunk_of_a_large_epoch():
    # the server pushes an epoch's later chunks once they fit beside what waits, or after
    # its wait: a client that never reads is then dropped as too slow, as before
    async def scenario():
        box = Outbox(max_rows=5)
        box.changes("diff", "q", 1, [((i,), 1) for i in range(3)])
        room = asyncio.create_task(box.room(3, wait=5))
        await asyncio.sleep(0.05)
        blocked = not room.done()  # 3 more rows would not fit beside the 3 waiting
        first = await box.next()
        await asyncio.wait_for(room, 1)  # sending them made room
        box.changes("diff", "q", 1, [((i,), 1) for i in range(3, 6)])
        second = await box.next()
        box.changes("diff", "q", 2, [((i,), 1) for i in range(3)])
        await box.room(3, wait=0.1)  # nobody reads: it gives up waiting
        box.changes("diff", "q", 2, [((i,), 1) for i in range(3, 6)])
        return blocked, first, second, box.overflowed

    blocked, first, second, overflowed = run(scenario())
    assert blocked and len(first["changes"]) == len(second["changes"]) == 3 and first["epoch"] == 1
    assert overflowed


def test_outbox_granularity_holds_diffs_for_the_window():
    async def scenario():
        box = Outbox(max_rows=100)
        box.set_granularity("q", 0.3)
        box.changes("diff", "q", 1, [(("a",), 1)], always=True)
        first = await box.next()
        box.changes("diff", "q", 2, [(("b",), 1)])
        box.changes("diff", "q", 3, [(("c",), 1)])
        assert box.pending() == []  # held until the window closes
        second = await asyncio.wait_for(box.next(), 2)
        return first, second

    first, second = run(scenario())
    assert first["epoch"] == 1
    assert second == {"type": "diff", "query": "q", "epoch": 3, "changes": [[["b"], 1], [["c"], 1]]}
