"""Event time (``Engine(time="event")``): transactions buffered per time, closed by
``advance_to`` as one epoch per time, late ones rejected; checked against the oracle
applied per closed time, and across a restart of a durable engine."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter

import pytest

from factflow import Engine, EngineConfig, LateTransactionError, StorageError, TransactionError
from oracle import OracleError, normalized
from storage.durable import LIGHT, define, new_oracle, valid_stream
from test_differential import random_transaction


def rows(q, as_of=None) -> Counter:
    return normalized(Counter(q.rows(as_of=as_of)))


def expected(oracle, text, semantics) -> Counter:
    return normalized(oracle.query(text, (), semantics))


def commute(txs: list[list]) -> bool:
    """Whether the oracle accepts ``txs`` as one transaction (no fact both asserted and
    retracted, no two values of one cardinality-one attribute of one entity)."""
    try:
        new_oracle().transact([op for tx in txs for op in tx])
    except OracleError:
        return False
    return True


def test_out_of_order_times_give_the_oracle_per_closed_time(spark):
    rng = random.Random(14)
    db = Engine(spark=spark, time="event")
    try:
        define(db)
        queries = {(text, sem): db.query(text, semantics=sem, slack=100) for text, _, sem in LIGHT[:3]}
        delivered: list[tuple[int, list]] = []
        watched = queries[(LIGHT[0][0], LIGHT[0][2])]
        watched.subscribe(lambda epoch, changes: delivered.append((epoch, changes)))
        oracle = new_oracle()  # the closed times, applied in time order
        buffered: dict[int, list[list]] = {}
        history: dict[int, dict] = {}
        frontier, rejected = 1, 0
        for _ in range(4):
            for _ in range(rng.randint(3, 5)):
                t = frontier + rng.randint(0, 4)
                tx = random_transaction(rng, oracle, rng.randint(1, 5))
                if commute(buffered.get(t, []) + [tx]):
                    assert db.transact(tx, time=t) == t
                    buffered.setdefault(t, []).append(tx)
                else:  # conflicts with itself or with a transaction of its time: rejected, the rest stays
                    with pytest.raises(TransactionError, match="rejected"):
                        db.transact(tx, time=t)
                    rejected += 1
            to = frontier + rng.randint(0, 3)
            due = sorted(t for t in buffered if t < to)
            assert db.advance_to(to) == due
            for t in due:
                oracle.transact([op for tx in buffered.pop(t) for op in tx])
                history[t] = {key: expected(oracle, *key) for key in queries}
            frontier = max(frontier, to)
            assert db.frontier == frontier
            if due:
                assert db.epoch == due[-1]
            for key, q in queries.items():
                assert rows(q) == expected(oracle, *key), (key, db.epoch)
        assert rejected and len(history) >= 3
        # each closed time as of itself; a time between two closed ones is the earlier's state
        watched_key = (LIGHT[0][0], LIGHT[0][2])
        for t, results in history.items():
            assert rows(watched, as_of=t) == results[watched_key], t
        for key, q in queries.items():
            first = min(history)
            assert rows(q, as_of=first) == history[first][key], key
        between = [t + 1 for t in history if t + 1 not in history and t + 1 < db.epoch]
        for t in between[:2]:
            assert rows(watched, as_of=t) == history[t - 1][watched_key]
        # subscribers: epochs numbered by time, increasing, summing to the result
        epochs = [epoch for epoch, _ in delivered]
        assert epochs == sorted(set(epochs)) and set(epochs) <= set(history)
        total: Counter = Counter()
        for _, changes in delivered:
            for row, diff in changes:
                total[row] += diff
        assert +total == Counter(watched.rows())
        # a late transaction is rejected by name and changes nothing
        pending = sorted(buffered)
        assert frontier > 1
        with pytest.raises(LateTransactionError, match=f"late.*time {frontier - 1}.*frontier {frontier}"):
            db.transact([[":db/add", 1, ":d/age", 3]], time=frontier - 1)
        assert db.advance_to(frontier + 10) == pending
    finally:
        db.close()


def test_modes_times_and_conflicts_are_checked(spark):
    with Engine(spark=spark) as db:
        db.create_attribute(":m/x", type="long")
        with pytest.raises(TransactionError, match="event-time"):
            db.transact([[":db/add", 1, ":m/x", 1]], time=3)
        with pytest.raises(TransactionError, match="event-time"):
            db.advance_to(3)
        assert db.frontier == db.epoch + 1 == 1
    with pytest.raises(Exception, match="time must be"):
        Engine(spark=spark, time="wall")
    with Engine(spark=spark, time="event") as db:
        db.create_attribute(":m/x", type="long")
        db.create_attribute(":m/one", type="string", semantics="one")
        with pytest.raises(TransactionError, match="needs the transaction's time"):
            db.transact([[":db/add", 1, ":m/x", 1]])
        for bad in (0, -1, "3", True, 1.5):
            with pytest.raises(TransactionError, match="event time must be"):
                db.transact([[":db/add", 1, ":m/x", 1]], time=bad)
        with pytest.raises(TransactionError, match="one at a time"):
            db.transact_many([[[":db/add", 1, ":m/x", 1]]])
        with pytest.raises(TransactionError, match="not a valid long"):  # checked now, not at advance_to
            db.transact([[":db/add", 1, ":m/x", "one"]], time=2)
        assert db.transact([[":db/add", 1, ":m/one", "a"]], time=2) == 2
        with pytest.raises(TransactionError, match=":m/one has cardinality one, but entity 1.*time 2"):
            db.transact([[":db/add", 1, ":m/one", "b"]], time=2)
        with pytest.raises(TransactionError, match="both asserted and retracted in one transaction"):
            db.transact([[":db/add", 1, ":m/x", 1], [":db/retract", 1, ":m/x", 1]], time=2)
        assert db.transact([[":db/add", 1, ":m/one", "b"]], time=3) == 3  # another time: a later overwrite
        q = db.query("[:find ?e ?v :where [?e :m/one ?v]]", slack=5)
        # datetimes are microseconds since 1970 UTC
        when = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
        micros = int(when.timestamp()) * 1_000_000
        assert db.transact([[":db/add", 2, ":m/one", "c"]], time=when) == micros
        assert db.advance_to(3) == [2]
        assert q.results() == {(1, "a"): 1}
        assert db.advance_to(when.replace(tzinfo=None) + dt.timedelta(microseconds=1)) == [3, micros]
        assert db.epoch == micros and q.results() == {(1, "b"): 1, (2, "c"): 1}
        assert q.results(as_of=2) == {(1, "a"): 1}
        assert db.advance_to(5) == [] and db.frontier == micros + 1  # the frontier never moves back


def test_longs_beyond_2_to_the_53_keep_every_digit(spark, tmp_path):
    """A transaction mixing kinds once rounded its longs through float64 (both times)."""
    big = 2**60 + 1
    ops = [[":db/add", 1, ":b/n", big], [":db/add", 1, ":b/s", "x"]]
    with Engine(spark=spark) as db:
        db.create_attribute(":b/n", type="long")
        db.create_attribute(":b/s", type="string")
        db.transact(ops)
        assert db.query("[:find ?v :where [_ :b/n ?v]]").rows() == {(big,): 1}
    with Engine(spark=spark, time="event", state_dir=str(tmp_path)) as db:
        db.create_attribute(":b/n", type="long")
        db.create_attribute(":b/s", type="string")
        db.transact(ops, time=1)
    with Engine(spark=spark, time="event", state_dir=str(tmp_path)) as db:  # buffered, logged, recovered
        q = db.query("[:find ?v :where [_ :b/n ?v]]")
        db.advance_to(2)
        assert q.rows() == {(big,): 1}


def test_offsets_stay_exactly_once_in_event_time(spark):
    with Engine(spark=spark, time="event") as db:
        db.create_attribute(":o/x", type="long", semantics="raw")
        q = db.query("[:find ?e ?v :where [?e :o/x ?v]]", semantics="multiset")
        assert db.transact([[":db/add", 1, ":o/x", 1]], time=5, source="s", offset=1) == 5
        assert db.transact([[":db/add", 1, ":o/x", 1]], time=4, source="s", offset=2) == 4
        assert db.transact([[":db/add", 1, ":o/x", 1]], time=5, source="s", offset=1) == 5  # a replay: skipped
        assert db.offsets() == {"s": 2}
        db.advance_to(6)
        # a replay of an applied offset is skipped even though its time is closed now
        assert db.transact([[":db/add", 1, ":o/x", 1]], time=4, source="s", offset=2) == 4
        assert q.rows() == {(1, 1): 2}


def test_buffered_transactions_survive_a_restart(spark, tmp_path):
    rng = random.Random(3)
    stream = valid_stream(11, 10, max_ops=5)
    times = rng.sample(range(1, 40), len(stream))
    config = EngineConfig(checkpoint_interval=0)
    db = Engine(spark=spark, state_dir=str(tmp_path), time="event", config=config)
    define(db)
    half = len(stream) // 2
    for i in range(half):
        assert db.transact(stream[i], time=times[i], source="s", offset=i) == times[i]
    cut = sorted(times[:half])[half // 2]
    db.advance_to(cut)
    db.checkpoint()  # the manifest holds the frontier and the transactions still buffered
    for i in range(half, len(stream)):
        if times[i] >= cut:
            db.transact(stream[i], time=times[i], source="s", offset=i)
        else:
            with pytest.raises(LateTransactionError):
                db.transact(stream[i], time=times[i], source="s", offset=i)
    db.advance_to(cut + 1)
    epoch, frontier, offsets = db.epoch, db.frontier, db.offsets()
    db.close()  # no checkpoint: the later buffered transactions are in the log only

    with pytest.raises(StorageError, match="time='event'"):
        Engine(spark=spark, state_dir=str(tmp_path), config=config)
    db = Engine(spark=spark, state_dir=str(tmp_path), time="event", config=config)
    try:
        assert (db.epoch, db.frontier, db.offsets()) == (epoch, frontier, offsets)
        accepted = [i for i in range(len(stream)) if times[i] >= cut or i < half]
        for i in accepted:  # replays are skipped
            assert db.transact(stream[i], time=times[i], source="s", offset=i) == times[i]
        queries = {(text, sem): db.query(text, semantics=sem) for text, _, sem in LIGHT[:2]}
        db.advance_to(max(times) + 1)
        oracle = new_oracle()
        for i in sorted(accepted, key=lambda i: times[i]):
            oracle.transact(stream[i])
        for key, q in queries.items():
            assert rows(q) == expected(oracle, *key), key
    finally:
        db.close()
