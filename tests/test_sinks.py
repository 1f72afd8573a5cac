"""Results out: sinks in every format and mode, restarts, crashes, change frames, granularity, streaming readers.

Every check is differential: a seeded random stream of transactions with retractions
(tests/test_differential.py's generator) runs through the engine and the brute-force
oracle; what Spark reads back from a sink directory (summed diffs, the latest snapshot,
the epochs present), what ``changes_frame`` gives and what granularity windows deliver
must equal what the oracle says of the same epochs.
"""

from __future__ import annotations

import copy
import os
import random
import shutil
import time
from collections import Counter

import pandas as pd
import pytest

from factflow import Engine, EngineConfig, HistoryCompactedError, QueryError, Sink, SinkError
from factflow.engine.granularity import Throttle, Window
from factflow.engine.history import oldest_available
from factflow.io.sinks import last_epoch, read_sink, sink_schema
from oracle import Oracle, OracleError, normalized
from test_differential import ENTITIES, SCHEMA, random_transaction

FRIENDS = "[:find ?a ?c :where [?a :d/friend ?b] [?b :d/friend ?c]]"  # set semantics: a Distinct result
NAMES = "[:find ?n (count ?e) :where [?e :d/name ?n]]"  # an aggregate
SCORES = "[:find ?e ?s ?f :where [?e :d/score ?s] [?e :d/flag ?f]]"  # long, double, boolean columns
FANOUT = "[:find ?a :where [?a :d/friend _]]"  # multiset semantics: derivation counts
EDGES = "[:find ?a ?b :where [?a :d/friend ?b]]"


class Stream:
    """An engine and the oracle fed the same valid random transactions."""

    def __init__(self, db: Engine, seed: int, oracle: Oracle | None = None, define: bool = True):
        self.db = db
        self.rng = random.Random(seed)
        self.oracle = oracle or Oracle()
        if define:
            for name, kind, semantics in SCHEMA:
                db.create_attribute(name, type=kind, semantics=semantics)
                if oracle is None:
                    self.oracle.create_attribute(name, kind, semantics)
        self.history: dict[int, dict[str, Counter]] = {}

    def step(self, queries=(FRIENDS, NAMES, SCORES, FANOUT), max_ops: int = 6) -> int:
        """One valid transaction as the next epoch; remembers the oracle's results after it."""
        while True:
            tx = random_transaction(self.rng, self.oracle, self.rng.randint(1, max_ops))
            if self.rng.random() < 0.7:  # friendships are what the joins see: more of them
                tx.append([":db/add", self.rng.choice(ENTITIES), ":d/friend", self.rng.choice(ENTITIES)])
            try:
                Oracle.transact(copy.deepcopy(self.oracle), tx)
                break
            except OracleError:
                continue
        return self.apply(tx, queries)

    def apply(self, tx: list, queries=(EDGES,)) -> int:
        """A given valid transaction as the next epoch (see :meth:`step`)."""
        self.oracle.transact(tx)
        epoch = self.db.transact(tx)
        self.history[epoch] = {q: self.expected(q) for q in queries}
        return epoch

    def expected(self, query: str) -> Counter:
        return normalized(self.oracle.query(query, (), "multiset" if query == FANOUT else "set"))


def summed(rows, columns) -> Counter:
    """Rows read from a sink (or a change frame) summed per result row."""
    out = Counter()
    for row in rows:
        out[tuple(row[c] for c in columns)] += row["diff"]
    return normalized(out)


def by_epoch(rows, columns) -> dict[int, Counter]:
    out: dict[int, Counter] = {}
    for row in rows:
        out.setdefault(row["epoch"], Counter())[tuple(row[c] for c in columns)] += row["diff"]
    return {e: normalized(c) for e, c in out.items()}


def difference(after: Counter, before: Counter) -> Counter:
    out = Counter(after)
    out.subtract(before)
    return Counter({k: n for k, n in out.items() if n})


def epoch_dirs(path: str) -> list[int]:
    return sorted(int(n.split("=")[1]) for n in os.listdir(path) if n.startswith("epoch="))


COLUMNS = {FRIENDS: ["a", "c"], NAMES: ["n", "count_e"], SCORES: ["e", "s", "f"], FANOUT: ["a"]}


def expected_changes(stream: Stream, query: str, start: Counter, observed: list[int]) -> dict[int, Counter]:
    """What a diffs sink holds when the query was installed at ``observed[0]`` (result
    ``start``) and delivered the epochs ``observed[1:]``: each one's change since the one
    before (the install's: the whole result), the epochs that changed nothing left out."""
    expected = {observed[0]: start} if start else {}
    previous = start
    for epoch in observed[1:]:
        change = difference(stream.history[epoch][query], previous)
        if change:
            expected[epoch] = change
        previous = stream.history[epoch][query]
    return expected


def check_diffs(spark, path: str, query: str, stream: Stream, installed: int, start: Counter) -> None:
    """A diffs sink: one directory per epoch that changed the result, each holding exactly that
    epoch's change (the install's: the whole result), summing to the oracle's result."""
    rows = read_sink(spark, path).collect()
    expected = expected_changes(stream, query, start, [installed] + sorted(e for e in stream.history if e > installed))
    assert by_epoch(rows, COLUMNS[query]) == expected, path
    assert epoch_dirs(path) == sorted(expected), path
    assert summed(rows, COLUMNS[query]) == stream.history[max(stream.history)][query]


def check_snapshot(spark, path: str, query: str, stream: Stream) -> None:
    """A snapshot sink: its latest epoch holds the whole result; at most two snapshots kept."""
    latest = last_epoch(path)
    rows = [r for r in read_sink(spark, path).collect() if r["epoch"] == latest]
    assert summed(rows, COLUMNS[query]) == stream.history[max(stream.history)][query], path
    assert len(epoch_dirs(path)) <= 2


def test_sinks_in_every_format_and_mode_equal_the_oracle(spark, tmp_path):
    db = Engine(spark=spark)
    stream = Stream(db, seed=3)
    try:
        for _ in range(3):
            stream.step()
        installed = db.epoch
        sinks = {
            FRIENDS: [Sink(str(tmp_path / "friends-parquet")), Sink(str(tmp_path / "friends-json"), "json", "snapshot")],
            NAMES: [Sink(str(tmp_path / "names-json"), "json"), Sink(str(tmp_path / "names-csv"), "csv", "snapshot")],
            SCORES: [Sink(str(tmp_path / "scores-csv"), "csv")],
        }
        queries = {text: db.query(text, sink=sinks[text]) for text in sinks}
        fanout = db.query(FANOUT, semantics="multiset")
        fanout.write_to(str(tmp_path / "fanout-parquet"), mode="snapshot")
        queries[FANOUT] = fanout
        start = {text: stream.expected(text) for text in queries}
        for _ in range(5):
            stream.step()
        for q in queries.values():
            assert q.flush(timeout=120)
        for text in (FRIENDS, NAMES, SCORES):
            for sink in sinks[text]:
                if sink.mode == "diffs":
                    check_diffs(spark, sink.path, text, stream, installed, start[text])
                else:
                    check_snapshot(spark, sink.path, text, stream)
        check_snapshot(spark, str(tmp_path / "fanout-parquet"), FANOUT, stream)
        assert [f.name for f in sink_schema(str(tmp_path / "scores-csv")).fields] == ["e", "s", "f", "diff", "epoch"]
    finally:
        db.close()


def test_bad_sinks_are_refused_naming_the_problem(spark, tmp_path):
    with pytest.raises(SinkError, match="avro"):
        Sink(str(tmp_path), format="avro")
    with pytest.raises(SinkError, match="'upserts'"):
        Sink(str(tmp_path), mode="upserts")
    db = Engine(spark=spark)
    try:
        db.create_attribute(":d/name", type="string", semantics="one")
        with pytest.raises(QueryError, match="granularity"):
            db.query("[:find ?n :where [_ :d/name ?n]]", granularity=-1)
        with pytest.raises(SinkError, match="a sink must be a factflow.Sink"):
            db.query("[:find ?n :where [_ :d/name ?n]]", sink=str(tmp_path))
        with pytest.raises(SinkError, match="'epoch'"):
            db.query("[:find ?epoch :where [?epoch :d/name _]]", sink=Sink(str(tmp_path / "clash")))
        assert db.queries == {}
    finally:
        db.close()


def test_a_reinstalled_sink_continues_after_a_restart_without_writing_an_epoch_twice(spark, tmp_path):
    state, out, snap = str(tmp_path / "state"), str(tmp_path / "out"), str(tmp_path / "snap")
    config = EngineConfig(checkpoint_interval=3)
    db = Engine(spark=spark, state_dir=state, config=config)
    stream = Stream(db, seed=5)
    try:
        stream.step()
        q = db.query(FRIENDS, sink=[Sink(out), Sink(snap, "json", "snapshot")])
        installed, start = db.epoch, stream.expected(FRIENDS)
        for _ in range(4):
            stream.step()
        assert q.flush(timeout=120)
    finally:
        db.close()
    written = last_epoch(out)

    # epochs the sink misses (the query is not installed), then a crash mid-write: a hidden
    # temporary directory with a complete-looking epoch that was never renamed into place
    db = Engine(spark=spark, state_dir=state, config=config)
    stream.db = db
    try:
        for _ in range(3):
            stream.step()
        crashed = os.path.join(out, f"_tmp-{db.epoch + 1}-deadbeef", f"epoch={db.epoch + 1}")
        shutil.copytree(os.path.join(out, f"epoch={written}"), crashed)
        assert last_epoch(out) == written
        assert summed(read_sink(spark, out).collect(), COLUMNS[FRIENDS]) == stream.history[written][FRIENDS]
        # reinstalled: the first write is the result minus what the directory already sums to
        q = db.query(FRIENDS, sink=[Sink(out), Sink(snap, "json", "snapshot")])
        assert not os.path.exists(os.path.dirname(crashed))
        reinstalled = db.epoch
        for _ in range(2):
            stream.step()
        assert q.flush(timeout=120)
        final = db.epoch
    finally:
        db.close()
    check_snapshot(spark, snap, FRIENDS, stream)
    observed = ([installed] + list(range(installed + 1, written + 1)) + [reinstalled]
                + list(range(reinstalled + 1, final + 1)))
    assert by_epoch(read_sink(spark, out).collect(), COLUMNS[FRIENDS]) == expected_changes(stream, FRIENDS, start,
                                                                                           observed)

    # reopened with nothing missed: nothing is written at the install; a sink of another
    # format is refused; an engine without the history (epoch 0) is refused too
    before = sorted(os.listdir(out))
    db = Engine(spark=spark, state_dir=state, config=config)
    stream.db = db
    try:
        q = db.query(FRIENDS, sink=Sink(out))
        assert sorted(os.listdir(out)) == before
        with pytest.raises(SinkError, match="format"):
            db.query(FRIENDS, name="other", sink=Sink(out, format="json"))
        assert list(db.queries) == [q.name]
        stream.step()
        assert q.flush(timeout=120)
        final = db.epoch
    finally:
        db.close()
    observed.append(final)
    rows = read_sink(spark, out).collect()
    assert by_epoch(rows, COLUMNS[FRIENDS]) == expected_changes(stream, FRIENDS, start, observed)
    assert summed(rows, COLUMNS[FRIENDS]) == stream.history[final][FRIENDS]
    fresh = Engine(spark=spark)
    try:
        Stream(fresh, seed=0)
        with pytest.raises(SinkError, match=f"already holds epoch {last_epoch(out)}, after this engine.s epoch 0"):
            fresh.query(FRIENDS, sink=Sink(out))
    finally:
        fresh.close()


def test_a_failed_write_is_logged_and_its_epoch_written_with_the_next(engine, tmp_path, caplog):
    out = str(tmp_path / "flaky")
    stream = Stream(engine, seed=17)
    stream.step()
    q = engine.query(EDGES)
    writer = q.write_to(out)
    installed, start = engine.epoch, stream.expected(EDGES)
    write = writer._write
    failures = []

    def failing(frame, epochs):  # the file system refuses the first write after the install
        if not failures:
            failures.append(epochs)
            raise OSError("disk full")
        write(frame, epochs)

    writer._write = failing
    stream.apply([[":db/add", 100, ":d/friend", 101]])
    assert not q.flush(timeout=120)  # failed, kept for the next epoch
    assert "disk full" in caplog.text and f"epochs {failures[0][0]}-" in caplog.text
    assert last_epoch(out) == (installed if start else None)
    stream.apply([[":db/add", 102, ":d/friend", 103], [":db/retract", 100, ":d/friend", 101]])
    stream.apply([[":db/add", 104, ":d/friend", 105]])
    assert q.flush(timeout=120)
    observed = list(range(installed, engine.epoch + 1))
    assert by_epoch(read_sink(engine.spark, out).collect(), ["a", "b"]) == expected_changes(stream, EDGES, start,
                                                                                            observed)


def test_changes_frame_equals_the_subscribed_diffs(engine):
    stream = Stream(engine, seed=7)
    stream.step()
    q = engine.query(FRIENDS, slack=6)  # keeps the epochs since its install
    installed = engine.epoch
    got: dict[int, Counter] = {}
    q.subscribe(lambda epoch, changes: got.setdefault(epoch, Counter()).update(dict(changes)))
    for _ in range(5):
        stream.step()
    q.dataflow.result.writer.compact()  # as far as the slack lets it (merges may not have run yet)
    assert oldest_available(q) == installed
    frame = q.changes_frame(since=installed)
    assert frame.columns == ["a", "c", "diff", "epoch"]
    expected = {e: normalized(c) for e, c in got.items()}
    assert by_epoch(frame.collect(), ["a", "c"]) == expected
    assert by_epoch(q.changes_frame().collect(), ["a", "c"]) == expected  # as far back as is kept
    middle = installed + 2
    assert by_epoch(q.changes_frame(since=middle).collect(), ["a", "c"]) == {
        e: c for e, c in expected.items() if e > middle}
    with pytest.raises(HistoryCompactedError, match=f"after epoch {installed - 1} .* oldest epoch .* {installed}"):
        q.changes_frame(since=installed - 1)
    # compaction up to a later frontier moves the oldest epoch
    q.dataflow.result.handle.advance(middle)
    q.dataflow.result.writer.compact()
    assert oldest_available(q) == middle
    with pytest.raises(HistoryCompactedError) as failure:
        q.changes_frame(since=installed)
    assert (failure.value.since, failure.value.oldest) == (installed, middle)
    assert by_epoch(q.changes_frame().collect(), ["a", "c"]) == {e: c for e, c in expected.items() if e > middle}


def test_windows_fold_changes_and_start_when_the_last_delivery_was_long_enough_ago():
    due = []
    window = Window(1.0, ["x"], lambda: due.append(True))
    frame = pd.DataFrame({"x": [1, 2], "_diff": [1, 1]})
    assert window.offer(1, frame, now=10.0) is frame  # quiet: at once
    assert window.offer(2, pd.DataFrame({"x": [1, 5], "_diff": [-1, 1]}), now=10.5) is None
    assert window.offer(3, pd.DataFrame({"x": [3, 5], "_diff": [1, -1]}), now=10.6) is None
    epoch, held = window.take(now=11.0)
    assert epoch == 3 and sorted(zip(held["x"], held["_diff"])) == [(1, -1), (3, 1)]  # 5 cancelled
    assert due == []  # taken before its timer (0.5 s) fired
    assert window.take(now=11.1) is None
    throttle = Throttle(2.0)
    assert throttle.wait(5.0) == 0
    throttle.sent(5.0)
    assert throttle.wait(6.5) == pytest.approx(0.5) and throttle.wait(8.0) == 0


def test_granularity_delivers_each_window_once_consolidated_to_subscribers_and_sinks(spark, tmp_path):
    out = str(tmp_path / "windows")
    db = Engine(spark=spark)
    stream = Stream(db, seed=11)
    columns = ["a", "b"]

    def step(k: int) -> None:  # a new edge every epoch; every other epoch retracts the one before
        stream.apply([[":db/add", k, ":d/friend", k + 1]]
                     + ([[":db/retract", k - 1, ":d/friend", k]] if k % 2 == 0 else []))

    try:
        step(1)
        q = db.query(EDGES, granularity=1.0, sink=Sink(out))
        installed, start = db.epoch, stream.expected(EDGES)
        deliveries: list[tuple[int, Counter]] = []
        q.subscribe(lambda epoch, changes: deliveries.append((epoch, Counter(dict(changes)))))
        for k in range(2, 8):
            step(k)
        last = db.epoch
        deadline = time.monotonic() + 30
        while sum_deliveries(start, deliveries) != stream.history[last][EDGES] and time.monotonic() < deadline:
            time.sleep(0.1)  # the held window arrives by its timer, with no further epoch
        # every delivery is exactly the oracle's change over the epochs its window covered
        previous, covered = start, installed
        for epoch, changes in deliveries:
            assert epoch > covered
            assert normalized(changes) == difference(stream.history[epoch][EDGES], previous)
            previous, covered = stream.history[epoch][EDGES], epoch
        assert covered == last
        assert len(deliveries) < last - installed  # epochs were folded into windows
        assert q.flush(timeout=120)
        written = by_epoch(read_sink(spark, out).collect(), columns)
        assert written == {installed: start} | {e: normalized(c) for e, c in deliveries}
        # a window held when the query closes is delivered then
        step(8)
        step(9)
        q.close()
        assert sum_deliveries(start, deliveries) == stream.history[db.epoch][EDGES]
        assert summed(read_sink(spark, out).collect(), columns) == stream.history[db.epoch][EDGES]
    finally:
        db.close()


def sum_deliveries(start: Counter, deliveries) -> Counter:
    total = Counter(start)
    for _, changes in deliveries:
        total.update(changes)
    return normalized(Counter({k: n for k, n in total.items() if n}))


def test_a_streaming_query_reads_each_epoch_of_a_sink_once_and_whole(spark, tmp_path):
    out = str(tmp_path / "stream")
    db = Engine(spark=spark)
    stream = Stream(db, seed=13)
    batches: list[list] = []
    reader = None
    try:
        stream.step()
        q = db.query(FRIENDS, sink=Sink(out))
        installed, start = db.epoch, stream.expected(FRIENDS)
        # a crash's leftover: a hidden temporary directory that must never be read
        os.makedirs(os.path.join(out, "_tmp-999-deadbeef", "epoch=999"))
        db.spark.createDataFrame([(9, 9, 1)], "a long, c long, diff long").write.parquet(
            os.path.join(out, "_tmp-999-deadbeef", "epoch=999", "x"))
        reader = (spark.readStream.schema(sink_schema(out)).parquet(out).writeStream
                  .foreachBatch(lambda frame, batch: batches.append(frame.collect()))
                  .option("checkpointLocation", str(tmp_path / "reader-checkpoint")).start())
        for _ in range(5):
            stream.step()
            assert q.flush(timeout=120)
            reader.processAllAvailable()
        q.close()
        reader.processAllAvailable()
        final = db.epoch
    finally:
        if reader is not None:
            reader.stop()
        db.close()
    rows = [row for batch in batches for row in batch]
    assert 999 not in {row["epoch"] for row in rows}
    on_disk = by_epoch(read_sink(spark, out).collect(), COLUMNS[FRIENDS])
    assert by_epoch(rows, COLUMNS[FRIENDS]) == on_disk  # every epoch once: no row read twice
    for batch in batches:  # and whole: an epoch's rows all come in one micro-batch
        for epoch, changes in by_epoch(batch, COLUMNS[FRIENDS]).items():
            assert changes == on_disk[epoch]
    assert summed(rows, COLUMNS[FRIENDS]) == stream.history[final][FRIENDS]
    assert len(on_disk) > 1
    assert (installed in on_disk) == bool(start)


def test_a_durable_query_brings_its_sinks_back_after_a_restart(spark, tmp_path):
    """A durable query's sinks (given at install or added by write_to) are installed again
    with it and continue: every epoch once, none missing, none twice."""
    state, out, extra = str(tmp_path / "state"), str(tmp_path / "out"), str(tmp_path / "extra")
    config = EngineConfig(checkpoint_interval=0)
    db = Engine(spark=spark, state_dir=state, config=config)
    stream = Stream(db, seed=6)
    try:
        stream.step()
        q = db.query(FRIENDS, name="friends", sink=Sink(out), durable=True)
        installed, start = db.epoch, stream.expected(FRIENDS)
        stream.step()
        q.write_to(extra, "json")
        extra_installed, extra_start = db.epoch, stream.expected(FRIENDS)
        stream.step()
        assert q.flush(timeout=120)
    finally:
        db.close()
    db = Engine(spark=spark, state_dir=state, config=config)
    stream.db = db
    try:
        assert db.recovery.queries == ["friends"]
        q = db.queries["friends"]
        assert len(q.sinks) == 2
        for _ in range(3):
            stream.step()
        assert q.flush(timeout=120)
        final = db.epoch
    finally:
        db.close()
    for path, first, result in ((out, installed, start), (extra, extra_installed, extra_start)):
        observed = [first] + list(range(first + 1, final + 1))
        assert by_epoch(read_sink(spark, path).collect(), COLUMNS[FRIENDS]) == \
            expected_changes(stream, FRIENDS, result, observed), path
