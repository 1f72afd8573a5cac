"""Unit tests of traces: batches, reading as of an epoch, merging, compaction, handles."""

import pandas as pd
import pytest

from factflow import FactflowError
from factflow.arrangement.batch import Layout
from factflow.arrangement.trace import MergePolicy, Trace
from factflow.model.types import Kind

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
