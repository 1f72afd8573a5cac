"""db.ingest: Structured Streaming (Spark's JSON file source) into epochs, exactly once, against the oracle."""

from __future__ import annotations

import json
import os

import pytest

from factflow import Engine, EngineConfig, IngestError
from factflow.io.ingest import rejected_path
from oracle import Oracle

SCHEMA = [(":s/name", "string", "one"), (":s/age", "long", "one"), (":s/knows", "ref", "set"),
          (":s/tag", "string", "raw")]
STREAM_SCHEMA = "e long, a string, v string, added boolean"
QUERIES = ["[:find ?n ?a :where [?p :s/name ?n] [?p :s/age ?a]]",
           "[:find ?n ?m :where [?a :s/knows ?b] [?a :s/name ?n] [?b :s/name ?m]]",
           "[:find ?e ?t :where [?e :s/tag ?t]]"]
# one file per micro-batch: (e, a, v as text, added); added None is left out of the JSON line
GOOD = [
    [(1, ":s/name", "Ann", None), (1, ":s/age", "31", True), (2, ":s/name", "Bob", None), (1, ":s/knows", "2", True),
     (1, ":s/tag", "x", None)],
    [(1, ":s/age", "32", None), (3, ":s/name", "Cy", None), (2, ":s/knows", "3", True), (1, ":s/tag", "x", None),
     (2, ":s/age", "20", None)],
    [(1, ":s/knows", "2", False), (3, ":s/knows", "1", True), (2, ":s/tag", "y", None), (3, ":s/age", "44", None)],
    [(2, ":s/name", "Bo", None), (1, ":s/tag", "x", False), (3, ":s/tag", "z", None)],
]


def _engine(spark, **kwargs) -> Engine:
    db = Engine(spark=spark, **kwargs)
    for name, kind, semantics in SCHEMA:
        db.create_attribute(name, type=kind, semantics=semantics)
    return db


def _drop(directory: str, index: int, rows) -> None:
    """A JSON-lines file of ``rows``, modified at a later time than the files before it (the file
    source takes the oldest first, one per micro-batch with maxFilesPerTrigger=1)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"part-{index:03d}.json")
    with open(path + ".tmp", "w") as out:
        for e, a, v, added in rows:
            out.write(json.dumps({"e": e, "a": a, "v": v, **({} if added is None else {"added": added})}) + "\n")
    os.utime(path + ".tmp", (1_700_000_000 + index, 1_700_000_000 + index))
    os.rename(path + ".tmp", path)  # appears whole


def _run(db, spark, directory: str, checkpoint: str, on_error: str = "skip", source: str = "people"):
    stream = spark.readStream.schema(STREAM_SCHEMA).option("maxFilesPerTrigger", 1).json(directory)
    query = db.ingest(stream, source=source, checkpoint=checkpoint, on_error=on_error,
                      trigger={"availableNow": True})
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return query


def _oracle(batches) -> Oracle:
    oracle = Oracle()
    for name, kind, semantics in SCHEMA:
        oracle.create_attribute(name, kind, semantics)
    for batch in batches:
        oracle.transact([[":db/add" if added is not False else ":db/retract", e, a,
                          int(v) if a in (":s/age", ":s/knows") else v] for e, a, v, added in batch])
    return oracle


def _check(db, oracle) -> None:
    for text in QUERIES:
        assert db.query(text, semantics="multiset").rows() == oracle.query(text, semantics="multiset"), text


def test_a_restarted_stream_applies_every_batch_exactly_once(spark, tmp_path):
    files, checkpoint, state = str(tmp_path / "in"), str(tmp_path / "ck"), str(tmp_path / "state")
    for i in (0, 1):
        _drop(files, i, GOOD[i])
    db = _engine(spark, state_dir=state)
    try:
        assert _run(db, spark, files, checkpoint).exception() is None
        assert db.offsets() == {"people": 1} and db.epoch == 2
        _check(db, _oracle(GOOD[:2]))
    finally:
        db.close()
    # a crash after batch 1's epoch, before Spark committed it: Spark runs batch 1 again
    for name in ("1", ".1.crc"):
        os.remove(os.path.join(checkpoint, "commits", name))
    for i in (2, 3):
        _drop(files, i, GOOD[i])
    db = Engine(spark=spark, state_dir=state)
    try:
        assert db.offsets() == {"people": 1}
        assert _run(db, spark, files, checkpoint).exception() is None
        assert db.offsets() == {"people": 3}
        assert db.epoch == 4  # batch 1 replayed and skipped: two new epochs
        _check(db, _oracle(GOOD))  # the raw :s/tag counts would show a batch applied twice
    finally:
        db.close()


def test_a_rejected_batch_is_written_and_skipped(spark, tmp_path):
    files, checkpoint = str(tmp_path / "in"), str(tmp_path / "ck")
    bad = [[(9, ":s/nope", "z", None), (9, ":s/name", "Zed", None), (8, ":s/name", "Y", None)],
           [(9, ":s/age", "abc", None), (9, ":s/name", "Zed", None), (8, ":s/name", "Y", None)]]
    for i, rows in enumerate([GOOD[0], bad[0], bad[1]]):
        _drop(files, i, rows)
    db = _engine(spark, config=EngineConfig(local_limit=2))  # batches of 3 to 5 rows: Spark's (bulk) path
    try:
        assert _run(db, spark, files, checkpoint).exception() is None
        assert db.offsets() == {"people": 2} and db.epoch == 3  # rejected batches: empty epochs with their offsets
        _check(db, _oracle([GOOD[0]]))
        first = spark.read.json(rejected_path(checkpoint, 1)).collect()
        assert len(first) == 3 and all(":s/nope" in row["error"] for row in first)
        second = spark.read.json(rejected_path(checkpoint, 2)).collect()
        assert {row["v"] for row in second} == {"abc", "Zed", "Y"} and "abc" in second[0]["error"]
        assert not os.path.exists(rejected_path(checkpoint, 0))
        assert spark.sparkContext.statusTracker().getJobIdsForGroup("factflow-ingest-people-2")  # labelled
    finally:
        db.close()


def test_a_rejected_batch_stops_the_stream_with_stop(spark, tmp_path):
    files, checkpoint = str(tmp_path / "in"), str(tmp_path / "ck")
    _drop(files, 0, GOOD[0])
    _drop(files, 1, [(4, ":s/city", "Oslo", None), (4, ":s/name", "Di", None)])
    db = _engine(spark)
    try:
        with pytest.raises(Exception) as info:
            _run(db, spark, files, checkpoint, on_error="stop")
        assert "TransactionError" in str(info.value) and ":s/city" in str(info.value)
        assert db.offsets() == {"people": 0} and db.epoch == 1  # nothing of batch 1
        assert spark.read.json(rejected_path(checkpoint, 1)).count() == 2
        db.create_attribute(":s/city", type="string")  # fixed: the restarted stream applies batch 1
        assert _run(db, spark, files, checkpoint, on_error="stop").exception() is None
        assert db.offsets() == {"people": 1} and db.epoch == 2
        assert db.query("[:find ?n ?c :where [?p :s/name ?n] [?p :s/city ?c]]").results() == {("Di", "Oslo"): 1}
    finally:
        db.close()


def test_ingest_refuses_what_it_cannot_apply(engine, spark, tmp_path):
    stream = spark.readStream.schema(STREAM_SCHEMA).json(str(tmp_path))
    checkpoint = str(tmp_path / "ck")
    cases = [(spark.createDataFrame([(1, ":s/name", "A")], "e long, a string, v string"), "streaming DataFrame"),
             (stream.withColumnRenamed("v", "value"), r"lacks 1 column: v"),
             (stream.withColumn("t", stream["e"]), r"column t \(event time\)"),
             (stream.withColumn("addded", stream["e"] > 0), r"has 1 unknown column: 'addded'")]
    for frame, message in cases:
        with pytest.raises(IngestError, match=message):
            engine.ingest(frame, source="s", checkpoint=checkpoint)
    with pytest.raises(IngestError, match="on_error"):
        engine.ingest(stream, source="s", checkpoint=checkpoint, on_error="ignore")
    with pytest.raises(IngestError, match="source"):
        engine.ingest(stream, source="", checkpoint=checkpoint)
    assert not spark.streams.active and not os.path.exists(checkpoint)


def test_event_time_batches_are_split_by_time_and_closed_by_advance_to(spark, tmp_path):
    """Each fact carries its time in column t; batches mix times out of order; closed times
    equal the oracle over exactly those times; a late batch is rejected whole."""
    files, checkpoint = str(tmp_path / "in"), str(tmp_path / "ck")

    def drop(index: int, timed) -> None:  # (time, rows): each row gets its time
        _drop(files, index, [row for _, rows in timed for row in rows])
        path = os.path.join(files, f"part-{index:03d}.json")
        lines = open(path).read().splitlines()
        times = [t for t, rows in timed for _ in rows]
        with open(path, "w") as out:
            out.writelines(json.dumps({**json.loads(line), "t": t}) + "\n" for line, t in zip(lines, times))

    db = _engine(spark, time="event")
    try:
        drop(0, [(2, GOOD[1]), (1, GOOD[0])])
        drop(1, [(4, GOOD[3]), (3, GOOD[2])])
        stream = spark.readStream.schema(STREAM_SCHEMA + ", t long").option("maxFilesPerTrigger", 1).json(files)
        with pytest.raises(IngestError, match="column t"):
            db.ingest(spark.readStream.schema(STREAM_SCHEMA).json(files), source="timed", checkpoint=checkpoint)
        query = db.ingest(stream, source="timed", checkpoint=checkpoint, trigger={"availableNow": True})
        query.awaitTermination()
        assert db.epoch == 0 and db.advance_to(3) == [1, 2]
        _check(db, _oracle(GOOD[:2]))
        drop(2, [(2, [(9, ":s/name", "Late", None)])])  # time 2 is closed: the batch is rejected
        query = db.ingest(stream, source="timed", checkpoint=checkpoint, trigger={"availableNow": True})
        query.awaitTermination()
        assert os.path.isdir(rejected_path(checkpoint, 2))
        assert db.advance_to(5) == [3, 4]
        _check(db, _oracle(GOOD))
    finally:
        db.close()
