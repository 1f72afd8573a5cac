"""Unit tests of traces: batches, reading as of an epoch, merging, compaction, handles."""

import os
import random
from collections import Counter

import pandas as pd
import pytest

from factflow import FactflowError
from factflow.arrangement import batch as batch_module
from factflow.arrangement.batch import Batch, Layout
from factflow.arrangement.trace import MergePolicy, Trace
from factflow.model.types import Kind
from factflow.storage.location import Location

LAYOUT = Layout((("e", Kind.LONG), ("v", Kind.STRING)), ("e",))


def rows(*triples):
    return pd.DataFrame(triples, columns=["e", "v", "_diff"])


def accumulate(spark, trace, as_of):
    frame = spark.sql(f"SELECT e, v, SUM(_diff) AS n FROM {trace.read(as_of)} GROUP BY e, v HAVING n <> 0")
    return {(r.e, r.v): r.n for r in frame.collect()}


def make(spark, **policy):
    return Trace(spark, "test", LAYOUT, MergePolicy(**{"partitions": 2, **policy}), upper=1)


def test_read_as_of_each_epoch(spark):
    trace = make(spark)
    trace.append_pandas(rows((1, "a", 1), (2, "b", 1)), 1)
    trace.append_pandas(rows((1, "a", -1), (1, "c", 1)), 2)
    trace.advance_upper(4)  # epoch 3 changed nothing
    trace.append_pandas(rows((3, "d", 1)), 4)
    assert accumulate(spark, trace, 1) == {(1, "a"): 1, (2, "b"): 1}
    assert accumulate(spark, trace, 2) == {(2, "b"): 1, (1, "c"): 1}
    assert accumulate(spark, trace, 3) == accumulate(spark, trace, 2)
    assert accumulate(spark, trace, 4) == {(2, "b"): 1, (1, "c"): 1, (3, "d"): 1}
    assert trace.upper == 5


def test_merge_compacts_to_the_frontier_of_live_handles(spark):
    trace = make(spark)
    h = trace.handle(0, "reader")
    trace.append_pandas(rows((1, "a", 1)), 1)
    trace.append_pandas(rows((1, "a", -1), (2, "b", 1)), 2)
    trace.maintain()
    # the reader may still read as of epoch 1: the retraction at 2 must stay separate
    assert len(trace.batches) == 1 and trace.tuples == 3
    assert accumulate(spark, trace, 1) == {(1, "a"): 1}
    h.advance(2)
    trace.append_pandas(rows((3, "c", 1)), 3)
    trace.maintain()
    # times before 2 are now indistinguishable: (1, a) cancels and is dropped
    assert trace.tuples == 2
    assert accumulate(spark, trace, 3) == {(2, "b"): 1, (3, "c"): 1}
    with pytest.raises(FactflowError):
        trace.read(1)
    with pytest.raises(FactflowError):
        h.read(1)


def test_released_handles_stop_holding_back_compaction(spark):
    trace = make(spark)
    h = trace.handle(0, "reader")
    trace.append_pandas(rows((1, "a", 1)), 1)
    trace.append_pandas(rows((1, "a", -1)), 2)
    trace.maintain()
    assert trace.tuples == 2
    h.release()
    with pytest.raises(FactflowError):
        h.read(2)
    trace.append_pandas(rows((5, "z", 1)), 3)
    trace.maintain()
    assert trace.tuples == 1


def test_geometric_merging_keeps_few_batches(spark):
    trace = make(spark, local_limit=4, factor=2)
    for epoch in range(1, 33):
        trace.append_pandas(rows((epoch, "x", 1)), epoch)
        trace.maintain()
        assert len(trace.batches) <= 6
    assert trace.tuples == 32
    assert sum(accumulate(spark, trace, 32).values()) == 32
    assert any(not b.is_local for b in trace.batches)  # large merges moved into Spark's cache


def sized(*counts):
    """Stored batches of the given row counts, oldest first (sizes only: no Spark)."""
    return [Batch(k, k + 1, n, None) for k, n in enumerate(counts)]


def test_a_merge_reads_at_most_the_cap():
    """No merge rewrites more than max(merge_limit, rows of the trace / merge_share) rows: the
    tail of binary triangles over oregon1 (1.16M, 527K, 253K, 167K rows) merges its three
    newest batches, not the whole trace; once the trace is large enough the cap grows and
    batches of that size merge again."""
    trace = Trace(None, "sizes", LAYOUT, MergePolicy(), upper=1)
    assert trace.merge_cap(sized(1_160_000, 527_000, 253_000, 167_000)) == 1_000_000
    assert trace.merge_due(sized(1_160_000, 527_000, 253_000, 167_000)) == 3
    unbounded = Trace(None, "sizes", LAYOUT, MergePolicy(merge_limit=10**12), upper=1)
    assert unbounded.merge_due(sized(1_160_000, 527_000, 253_000, 167_000)) == 4
    assert trace.merge_due(sized(8_000_000, 600_000, 600_000)) == 0  # 1.2M > 1.15M
    assert trace.merge_due(sized(16_000_000, 600_000, 600_000)) == 2  # cap 2.15M


def test_capped_merges_keep_every_update(spark):
    trace = make(spark, local_limit=1, factor=2, merge_limit=3)
    for epoch in range(1, 15):
        trace.append_pandas(rows((epoch, "x", 1)), epoch)
        trace.maintain()
        assert max(b.rows for b in trace.batches) <= 3
    assert len(trace.batches) <= 6
    assert accumulate(spark, trace, 14) == {(e, "x"): 1 for e in range(1, 15)}


def test_local_merges_regroup_only_the_rows_a_newer_batch_meets(spark, monkeypatch):
    """A local batch consolidated at one time takes each epoch's small batch in by grouping
    only its rows whose key some newer row has; the trace stays consolidated and exact
    (random updates, a handle that lags behind now and then, values that differ only after
    a NUL), and the merge groups far fewer rows than the trace holds."""
    from factflow.arrangement import trace as trace_module

    grouped = []
    original = trace_module.consolidated

    def counted(frame, names, diff):
        grouped.append(len(frame))
        return original(frame, names, diff)

    monkeypatch.setattr(trace_module, "consolidated", counted)
    rng = random.Random(11)
    trace = make(spark)
    reader = trace.handle(0, "reader")
    present: Counter = Counter()
    values = ["a", "b", "b\x00c", "d"]
    for epoch in range(1, 41):
        changes = Counter()
        for _ in range(400 if epoch == 1 else rng.randint(1, 6)):
            row = (rng.randrange(300), rng.choice(values))
            diff = -1 if present[row] + changes[row] > 0 and rng.random() < 0.5 else 1
            changes[row] += diff
        trace.append_pandas(rows(*[(e, v, d) for (e, v), d in changes.items() if d]), epoch)
        present.update(changes)
        if epoch % 7:  # the reader lags behind every seventh epoch
            reader.advance(epoch)
        trace.maintain()
        assert len(trace.batches) == 1
        merged = list(trace.batches[0].local.itertuples(index=False))  # (pandas hashes "b\x00c" as "b")
        assert len({(e, v, t) for e, v, t, _ in merged}) == len(merged) and all(d for *_, d in merged)
        summed = Counter()
        for e, v, _, d in merged:
            summed[e, v] += d
        assert +summed == +present
    # each epoch after the reader lagged groups every row again (its batch holds two times)
    assert sum(n > trace.tuples / 4 for n in grouped[-14:]) <= 2, grouped[-14:]


def test_handles_cannot_read_before_their_frontier(spark):
    trace = make(spark)
    h = trace.handle(3, "late reader")
    with pytest.raises(FactflowError):
        h.read(2)
    trace.close()
    with pytest.raises(FactflowError):
        h.read(3)


def test_truncate_undoes_an_epoch(spark):
    trace = make(spark)
    trace.append_pandas(rows((1, "a", 1)), 1)
    trace.append_pandas(rows((2, "b", 1)), 2)
    trace.truncate(2)
    assert trace.upper == 2 and accumulate(spark, trace, 2) == {(1, "a"): 1}


def stored_trace(spark, tmp_path, epochs):
    """A trace of ``epochs`` one-row epochs whose merges need Spark (local_limit 1)."""
    trace = make(spark, local_limit=1, factor=2, directory=Location(str(tmp_path)))
    for epoch in range(1, epochs + 1):
        trace.append_pandas(rows((epoch, f"v{epoch}", 1)), epoch)
    return trace


def test_a_stored_merge_runs_on_a_snapshot_and_survives_appends(spark, tmp_path):
    """Computed off the lock, a stored merge swaps in even after later epochs appended."""
    trace = stored_trace(spark, tmp_path, 2)
    assert trace.merge_local() == 0  # one-row batches do not fit together on the driver here
    stored = trace.stored_merge()
    assert stored is not None and stored.snapshot == trace.batches
    stored.run()
    assert len(trace.batches) == 2  # nothing readers see has changed yet
    trace.append_pandas(rows((3, "v3", 1)), 3)  # an epoch commits meanwhile
    assert stored.commit() == 1
    assert len(trace.batches) == 2 and not trace.batches[0].is_local and trace.batches[0].index_paths
    assert accumulate(spark, trace, 3) == {(1, "v1"): 1, (2, "v2"): 1, (3, "v3"): 1}
    assert trace.stored_merge() is not None  # the third batch is due now


def test_a_stored_merge_of_a_changed_trace_is_thrown_away(spark, tmp_path):
    """If the snapshot no longer heads the trace (compacted, closed), the result is dropped
    and the batches the trace holds stay readable."""
    trace = stored_trace(spark, tmp_path, 2)
    stored = trace.stored_merge()
    stored.run()
    trace.compact()
    assert stored.commit() == 0
    assert accumulate(spark, trace, 2) == {(1, "v1"): 1, (2, "v2"): 1}
    closing = stored_trace(spark, tmp_path, 2)
    late = closing.stored_merge()
    closing.close()  # the snapshot is pinned: its rows stay readable until the merge is done
    late.run()
    assert late.commit() == 0 and closing.batches == []


def test_a_stored_merge_writes_missing_index_files(spark, tmp_path):
    trace = make(spark, local_limit=1, factor=2, directory=Location(str(tmp_path)))
    frame = spark.createDataFrame([(1, "a", 1, 1), (2, "b", 1, 1), (3, "c", 1, 1)], "e long, v string, _t long, _diff long")
    trace.append(trace.materialize(frame, 1, 2))
    assert trace.batches[0].index is None
    stored = trace.stored_merge()
    stored.run()
    assert stored.commit() == 0 and trace.batches[0].index_paths
    assert trace.stored_merge() is None


def jobs_in_group(spark, group, run):
    """The Spark jobs ``run()`` starts, counted through a job group of its own."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        run()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return len(sc.statusTracker().getJobIdsForGroup(group))


def test_a_stored_merge_writes_its_batch_and_index_files_in_one_job(spark, tmp_path):
    """The merged batch is checkpointed, counted and indexed by a single Spark job; its index
    files hold its rows, sorted by key hash."""
    import pyarrow as pa

    trace = stored_trace(spark, tmp_path, 3)
    stored = trace.stored_merge()
    assert jobs_in_group(spark, "test-merge-index", stored.run) == 1
    assert stored.commit() == 2
    merged = trace.batches[0]
    assert not merged.is_local and merged.rows == 3 and merged.index_paths
    assert all(name.endswith("-of-00002.arrow") for name in merged.index_paths)  # probes open only their partitions
    files = [pa.ipc.open_file(merged.index.file(p)).read_all() for p in merged.index_paths]
    assert all((f.column("_h").to_numpy()[1:] >= f.column("_h").to_numpy()[:-1]).all() for f in files)
    table = pa.concat_tables(files)
    assert sorted(zip(table.column("e").to_pylist(), table.column("v").to_pylist())) == [
        (1, "v1"), (2, "v2"), (3, "v3")]
    assert trace.stored_merge() is None  # nothing left to index


def test_a_merge_that_turns_out_small_keeps_no_index_files(spark, tmp_path):
    """Retractions can consolidate a merge to a batch small enough for the driver: the index
    files its job wrote are deleted."""
    trace = make(spark, local_limit=1, factor=2, directory=Location(str(tmp_path)))
    trace.append_pandas(rows((1, "a", 1), (2, "b", 1)), 1)
    trace.append_pandas(rows((1, "a", -1), (3, "c", 1)), 2)
    trace.append_pandas(rows((3, "c", -1)), 3)
    stored = trace.stored_merge()
    stored.run()
    assert stored.commit() == 2
    assert [b.is_local for b in trace.batches] == [True] and trace.batches[0].rows == 1
    assert accumulate(spark, trace, 3) == {(2, "b"): 1}
    assert not list(tmp_path.rglob("*.arrow"))


def test_a_failed_indexed_checkpoint_leaves_no_files(spark, tmp_path, monkeypatch):
    """If the job that stores a batch and writes its index files fails, the files it wrote
    are deleted and the error reaches the caller."""
    from factflow.arrangement import batch

    def failing(frame, key, directory):
        (tmp_path / "index" / "part-00000.arrow").write_bytes(b"partial")
        raise RuntimeError("task failed")

    (tmp_path / "index").mkdir()
    monkeypatch.setattr(batch, "write_index", failing)
    frame = spark.createDataFrame([(1, "a", 1, 1)], "e long, v string, _t long, _diff long")
    with pytest.raises(RuntimeError, match="task failed"):
        batch.checkpoint_indexed(frame, ("e",), Location(str(tmp_path / "index")))
    assert not (tmp_path / "index").exists()


def test_checkpoint_is_one_job_and_cuts_the_lineage(spark):
    """A stored batch is materialized and counted by one Spark job; afterwards its plan
    reads stored blocks, not the query that made them."""
    from factflow.arrangement.batch import checkpoint, release_checkpoint

    frame = spark.range(1000).selectExpr("id % 10 AS e", "id AS v").where("v % 3 = 0")
    made = []
    assert jobs_in_group(spark, "test-checkpoint", lambda: made.extend(checkpoint(frame))) == 1
    stored, rows = made
    assert rows == 334
    rdd = stored._jdf.queryExecution().analyzed().rdd()
    assert rdd.isCheckpointed()
    assert stored.where("e = 3").count() == sum(1 for v in range(0, 1000, 3) if v % 10 == 3)
    release_checkpoint(stored)


def test_batches_kept_in_files_read_merge_probe_and_release(spark, tmp_path):
    """On a cluster (``in_files``) stored batches are their index files: read back by a plan
    that scans the files (no checkpoint to lose with an executor), merged into new files,
    probed like any other, and gone from disk when released; small results come back to the
    driver from the files without a second job."""
    directory = Location(str(tmp_path))
    trace = make(spark, local_limit=2, factor=2, directory=directory, in_files=True)
    frame = spark.createDataFrame([(1, "a", 1, 1), (2, "b", 1, 1), (3, "c", 1, 1)], "e long, v string, _t long, _diff long")
    first = trace.materialize(frame, 1, 2)
    trace.append(first)
    assert not first.is_local and not first.owns_stored and first.index_paths
    plan = first.frame._jdf.queryExecution().optimizedPlan().toString()
    assert "LogicalRDD" not in plan and "MapInArrow" in plan  # a scan of the files, no checkpoint
    second = spark.createDataFrame([(1, "a", 2, -1), (4, "d", 2, 1), (5, "e", 2, 1)], "e long, v string, _t long, _diff long")
    trace.append(trace.materialize(second, 2, 3))
    assert accumulate(spark, trace, 2) == {(2, "b"): 1, (3, "c"): 1, (4, "d"): 1, (5, "e"): 1}
    files, local = trace.probe_sources(2)
    assert {d for d, _ in files} == {b.index for b in trace.batches} and local == []
    old = [b.index.path for b in trace.batches]
    stored = trace.stored_merge()
    stored.run()
    assert stored.commit() == 1 and len(trace.batches) == 1 and trace.batches[0].index_paths
    assert not any(os.path.exists(path) for path in old)  # the merged batches' files are gone
    assert accumulate(spark, trace, 2) == {(2, "b"): 1, (3, "c"): 1, (4, "d"): 1, (5, "e"): 1}
    small = trace.materialize(spark.createDataFrame([(9, "z", 3, 1)], "e long, v string, _t long, _diff long"), 3, 4)
    assert small.is_local and list(small.local["e"]) == [9]
    trace.close()
    assert not [p for p in os.listdir(str(tmp_path)) if os.listdir(os.path.join(str(tmp_path), p))]


def _deserialized(batch: Batch) -> bool:
    return batch.frame._jdf.queryExecution().analyzed().rdd().getStorageLevel().deserialized()


def test_large_checkpoints_keep_their_blocks_serialized(spark, monkeypatch):
    # rows as objects cost a small driver's heap three times what serialized blocks do:
    # batches expected to be large (a merge of large parts) are checkpointed serialized
    monkeypatch.setattr(batch_module, "SERIALIZED_ROWS", 3)
    trace = make(spark, local_limit=0, factor=100)
    trace.append_frame(spark.createDataFrame(rows((1, "a", 1), (2, "b", 1))), 1)
    trace.append_frame(spark.createDataFrame(rows((3, "c", 1), (4, "d", 1), (1, "a", -1))), 2)
    assert [_deserialized(b) for b in trace.batches] == [True, True]  # nothing said they would be large
    trace.maintain()
    assert len(trace.batches) == 1 and not _deserialized(trace.batches[0])
    assert accumulate(spark, trace, 2) == {(2, "b"): 1, (3, "c"): 1, (4, "d"): 1}
