"""The engine driven from several threads: consistent reads, ordered deliveries, isolated subscribers.

A counter entity holds one cardinality-one value, set by every epoch to a number that
identifies the epoch, so a read that mixed two epochs (or caught one half-applied) would
see two values or none. Every thread is joined with a timeout, so a deadlock fails the
test instead of hanging it.
"""

import logging
import threading
import time

import pytest

JOIN = 120  # seconds: only a deadlock comes near this


def add(e, a, v):
    return [":db/add", e, a, v]


@pytest.fixture
def counter(engine):
    """An engine whose entity 1 holds ``:counter/value`` (cardinality one) and a query reading it."""
    engine.create_attribute(":counter/value", type="long", semantics="one")
    query = engine.query("[:find ?v :where [1 :counter/value ?v]]", name="counter")
    return engine, query


def set_counter(db, value):
    return db.transact([add(1, ":counter/value", value)])


def run(target, *args):
    """Start ``target`` in a thread that records what it raised in ``thread.errors``."""
    def body():
        try:
            target(*args)
        except BaseException as exc:  # reported by the test, in its own thread
            thread.errors.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.errors = []
    thread.start()
    return thread


def finish(*threads):
    for thread in threads:
        thread.join(JOIN)
        assert not thread.is_alive(), "deadlock: a thread did not finish"
        assert not thread.errors, thread.errors


def test_readers_see_exactly_one_closed_epoch(counter):
    db, q = counter
    set_counter(db, db.epoch + 1)  # every epoch n sets the value n
    # what the state holds once each epoch is closed (one writer): as delivered, and after
    # the merges that follow delivery (they change the rows held, not what they mean)
    expected = {db.epoch: [db.stats()]}
    q.subscribe(lambda epoch, changes: expected.setdefault(epoch, []).append(db.stats()))
    writing = threading.Event()
    writing.set()
    seen: dict[str, list] = {"results": [], "stats": []}

    def read_results(out):
        while writing.is_set():
            before = db.epoch
            rows = q.results()
            after = db.epoch
            assert len(rows) == 1, rows  # never two values, never none
            ((value,), multiplicity), = rows.items()
            assert multiplicity == 1 and before <= value <= after, (before, rows, after)
            out.append(value)

    def read_stats(out):
        while writing.is_set():
            out.append(db.stats())

    def write():
        try:
            for _ in range(4):
                epoch = set_counter(db, db.epoch + 1)
                expected.setdefault(epoch, []).append(db.stats())
        finally:
            writing.clear()

    readers = [run(read_results, seen["results"]), run(read_stats, seen["stats"])]
    finish(run(write), *readers)
    assert seen["results"] and seen["results"] == sorted(seen["results"])  # monotonic
    epochs = [stats["epoch"] for stats in seen["stats"]]
    assert epochs and epochs == sorted(epochs)
    for stats in seen["stats"]:  # no rows of a running epoch counted
        assert stats in expected[stats["epoch"]], (stats, expected[stats["epoch"]])
    assert q.results() == {(5,): 1} and db.epoch == 5


def test_a_failing_subscriber_is_logged_and_the_epoch_stays(counter, caplog):
    db, q = counter
    received = []

    def failing(epoch, changes):
        raise RuntimeError("subscriber bug")

    q.subscribe(failing)
    q.subscribe(lambda epoch, changes: received.append((epoch, sorted(changes))))
    with caplog.at_level(logging.ERROR, logger="factflow.engine"):
        epoch = set_counter(db, 10)  # returns normally
    assert db.epoch == epoch and q.results() == {(10,): 1} and db.epoch_log[-1].epoch == epoch
    assert received == [(epoch, [((10,), 1)])]
    failures = [r for r in caplog.records if r.name == "factflow.engine" and r.exc_info]
    assert len(failures) == 1 and "subscriber bug" in str(failures[0].exc_info[1])
    assert f"at epoch {epoch}" in failures[0].getMessage()


def test_a_subscriber_may_transact(counter):
    db, q = counter
    first: list = []
    second: list = []
    nested: list = []

    def transacting(epoch, changes):
        first.append(epoch)
        if len(first) == 1:
            nested.append((set_counter(db, 2), list(second)))  # returns before its epoch is delivered

    q.subscribe(transacting)
    q.subscribe(lambda epoch, changes: second.append(epoch))
    outer = []
    finish(run(lambda: outer.append(set_counter(db, 1))))
    assert nested == [(outer[0] + 1, [])]
    assert first == second == [outer[0], outer[0] + 1]  # both epochs, in order, when transact returns
    assert q.results() == {(2,): 1}


def test_a_slow_subscriber_blocks_neither_readers_nor_epochs(counter):
    db, q = counter
    entered, release = threading.Event(), threading.Event()
    delivered = []

    def slow(epoch, changes):
        delivered.append(epoch)
        entered.set()
        release.wait(JOIN)

    q.subscribe(slow)
    first = run(set_counter, db, 1)
    assert entered.wait(JOIN)
    try:
        started = time.monotonic()
        read = []
        finish(run(lambda: read.append(q.results())))
        assert read == [{(1,): 1}] and time.monotonic() - started < 60  # the subscriber still sleeps
        second = run(set_counter, db, 2)  # its epoch commits; its delivery waits for the first
        deadline = time.monotonic() + 60
        while db.epoch < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert db.epoch == 2 and q.results() == {(2,): 1} and delivered == [1]
    finally:
        release.set()
    finish(first, second)
    assert delivered == [1, 2]


def test_concurrent_writers_deliver_epochs_in_order(counter):
    db, q = counter
    seen: list[list[int]] = [[], []]
    for out in seen:
        q.subscribe(lambda epoch, changes, out=out: out.append(epoch))
    committed: list[int] = []

    def write(writer):
        for i in range(3):
            committed.append(set_counter(db, 100 * writer + i))

    finish(*[run(write, writer) for writer in (1, 2, 3)])
    assert sorted(committed) == list(range(1, 10))
    assert seen[0] == seen[1] == list(range(1, 10))
    assert [r.epoch for r in db.epoch_log] == list(range(1, 10))
