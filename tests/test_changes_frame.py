"""``Query.changes_frame`` against what subscribers received and against the oracle.

For every result kind (a set join, a multiset join, an aggregate, a ``:with`` aggregate,
negation, a recursive rule), slacks 0 and 50 with traces on the driver and 2 with traces
stored in Spark, a query installed before any data and one installed mid-stream: after a
random stream with retractions, the frame's rows of every epoch after ``since`` equal exactly the
changes subscribers received in that epoch, for every ``since`` the history keeps, and
summed from the install they equal the oracle's result. ``since`` older than the history
kept is refused; the install epoch is inside it while the slack covers it.
"""

from __future__ import annotations

from collections import Counter

import pytest

from factflow import Engine, EngineConfig, HistoryCompactedError, QueryError
from factflow.engine.history import oldest_available
from oracle import normalized
from storage.durable import define, new_oracle, valid_stream

QUERIES = [
    ("[:find ?a ?c :where [?a :d/friend ?b] [?b :d/friend ?c]]", "set"),
    ("[:find ?a ?c :where [?a :d/friend ?b] [?b :d/friend ?c]]", "multiset"),
    ("[:find ?n (count ?e) :where [?e :d/name ?n]]", "set"),
    ("[:find (count ?a) (sum ?a) :with ?e :where [?e :d/age ?a]]", "set"),
    ("[:find ?e :where [?e :d/name _] (not [?e :d/age _])]", "set"),
    ("[:find ?a ?b :where (reach ?a ?b)]", "set"),
]
EPOCHS = 8


def by_epoch(frame, width: int) -> dict[int, Counter]:
    """Rows of a change frame per epoch: ``{epoch: Counter({row: diff})}``."""
    out: dict[int, Counter] = {}
    for row in frame.collect():
        out.setdefault(row["epoch"], Counter())[tuple(row)[:width]] += row["diff"]
    return {e: normalized(c) for e, c in out.items()}


def accumulate(changes: dict[int, Counter]) -> Counter:
    total: Counter = Counter()
    for counter in changes.values():
        total.update(counter)
    return normalized(total)


@pytest.mark.parametrize("slack,local_limit", [(0, 20_000), (50, 20_000), (2, 3)],
                         ids=["slack0-driver", "slack50-driver", "slack2-stored"])
def test_changes_frame_equals_the_subscribers_and_the_oracle(spark, slack, local_limit):
    queries = QUERIES if local_limit == 20_000 else QUERIES[:3] + QUERIES[5:]
    stream = valid_stream(100 + slack + local_limit, EPOCHS, max_ops=6)
    oracle = new_oracle()
    db = Engine(spark=spark, config=EngineConfig(local_limit=local_limit))
    try:
        define(db)
        installed: dict[tuple, tuple] = {}  # key -> (query, received changes per epoch)

        def install(tag: str) -> None:
            for text, semantics in queries:
                q = db.query(text, semantics=semantics, slack=slack)
                got: dict[int, Counter] = {db.epoch: normalized(Counter(q.rows()))}  # the install's rows
                q.subscribe(lambda epoch, changes, got=got: got.setdefault(epoch, Counter()).update(dict(changes)))
                installed[(tag, text, semantics)] = (q, got)

        install("before data")
        for i, tx in enumerate(stream):
            db.transact(tx)
            oracle.transact(tx)
            if i == EPOCHS // 2:
                install("mid-stream")
        latest = db.epoch
        db.wait_for_maintenance()
        for (tag, text, semantics), (q, got) in installed.items():
            what = f"{text} ({semantics}, installed {tag} at {q.installed_at}, slack {slack})"
            got = {e: normalized(c) for e, c in got.items()}
            got = {e: c for e, c in got.items() if c}
            width = len(q.output_columns())
            assert accumulate(got) == normalized(oracle.query(text, (), semantics)), what
            q.dataflow.result.writer.compact()  # as far as the slack lets it (merges may not have run yet)
            oldest = oldest_available(q)
            kept = max(q.installed_at, latest - slack)  # the epochs whose changes the slack keeps readable
            assert oldest <= kept, f"{what}: compacted to {oldest}"
            for since in range(oldest, latest + 1):
                expected = {e: c for e, c in got.items() if e > since}
                assert by_epoch(q.changes_frame(since=since), width) == expected, f"{what}, since {since}"
            if oldest < q.installed_at:  # from before the install: its rows are the whole result then
                frame = by_epoch(q.changes_frame(since=q.installed_at - 1), width)
                assert accumulate(frame) == accumulate(got), what
            default = by_epoch(q.changes_frame(), width)
            assert default == {e: c for e, c in got.items() if e > max(oldest, q.installed_at - 1)}, what
            with pytest.raises(HistoryCompactedError):
                q.changes_frame(since=oldest - 1)
    finally:
        db.close()


def test_the_install_epoch_is_readable_while_the_slack_covers_it(engine):
    """The case a user found: installed at epoch 0 with slack 50, eight epochs later the
    changes after epoch 0 are all there (they were compacted into epoch 1)."""
    engine.create_attribute(":edge", type="ref")
    q = engine.query("[:find ?a ?c :where [?a :edge ?b] [?b :edge ?c]]", slack=50)
    got: dict[int, Counter] = {}
    q.subscribe(lambda epoch, changes: got.setdefault(epoch, Counter()).update(dict(changes)))
    for i in range(8):
        engine.transact([[":db/add", i, ":edge", i + 1], [":db/add", i + 1, ":edge", i + 2]]
                        + ([[":db/retract", i - 1, ":edge", i]] if i else []))
    q.dataflow.result.writer.compact()
    assert oldest_available(q) <= 0
    assert by_epoch(q.changes_frame(since=0), 2) == {e: normalized(c) for e, c in got.items() if normalized(c)}
    assert set(by_epoch(q.changes_frame(), 2)) == set(range(1, 9))


def test_a_pull_query_has_no_change_frame(engine):
    """Its subscribers receive changes below the pulled entity that a frame of entity ids
    would miss: refused, not answered differently."""
    engine.create_attribute(":p/name", type="string", semantics="one")
    q = engine.query("[:find (pull ?e [:p/name]) :where [?e :p/name _]]", slack=5)
    with pytest.raises(QueryError, match="changes_frame is not supported for pull queries"):
        q.changes_frame()
