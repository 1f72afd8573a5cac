"""Bound rows: small epochs' statements planned once and run again with new rows.

Every small epoch of the suite's default engines runs through :mod:`factflow.arrangement.bound`
(the differential tests check its results against the oracle); these tests check that
plans are in fact kept and run again with the rows of later epochs, and that a plan is
kept only where running it again is sound.
"""

from __future__ import annotations

import itertools
import re
import tempfile
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import types as T

from factflow import Engine, EngineConfig
from factflow.arrangement import bound
from factflow.arrangement.views import drop_view, register_view
from factflow.engine.apply import small_statements
from test_differential import CATALOG, JOIN_CATALOG, run_stream

SCHEMA = T.StructType([T.StructField("e", T.LongType()), T.StructField("v", T.StringType())])


def _frame(rows: list[tuple[int, str]]) -> pd.DataFrame:
    return pd.DataFrame({"e": pd.array([e for e, _ in rows], dtype="Int64"), "v": [v for _, v in rows]})


@pytest.fixture
def binder(spark):
    assert bound.supported(spark), "factflow's sessions put its jar on the driver's class path"
    binder = bound.Binder(spark)
    yield binder
    binder.close()


def test_the_jar_is_built_from_its_source():
    with zipfile.ZipFile(bound.JAR) as jar:
        recorded = jar.read("factflow/jvm/source.sha256").decode().strip()
    assert recorded == bound.source_digest(), "the Java source changed: run scripts/build_jvm.sh"


def test_a_kept_plan_reads_the_rows_bound_when_it_runs(spark, binder):
    def count_by_value(rows):
        with bound.binding(binder):
            relation = binder.relation(_frame(rows), SCHEMA)
            table = bound.run(spark, f"SELECT v, count(*) AS n FROM {relation} GROUP BY v")
        return dict(zip(table.column("v").to_pylist(), table.column("n").to_pylist()))

    assert count_by_value([(1, "a"), (2, "a"), (3, "it's")]) == {"a": 2, "it's": 1}
    assert (binder.planned, binder.reused) == (1, 0)
    assert count_by_value([(4, "b"), (5, None)]) == {"b": 1, None: 1}
    assert count_by_value([(6, "c")] * 3) == {"c": 3}
    assert (binder.planned, binder.reused) == (1, 2)  # one plan, run three times
    assert count_by_value([]) == {}  # no rows: written inline, a plan of its own
    assert binder.planned == 2


def test_a_batch_read_twice_in_a_statement_is_bound_once(spark, binder):
    owner = object()
    with bound.binding(binder):
        first = binder.relation(_frame([(1, "a")]), SCHEMA, owner=owner)
        assert binder.relation(_frame([(1, "a")]), SCHEMA, owner=owner) == first
        assert binder.relation(_frame([(1, "a")]), SCHEMA) != first
    with bound.binding(binder):  # a new statement group numbers its slots from the first
        assert binder.relation(_frame([(2, "b")]), SCHEMA, owner=owner) == first


def test_plans_that_cannot_run_again_soundly_are_not_kept(spark, binder):
    with bound.binding(binder):
        relation = binder.relation(_frame([(1, "a"), (2, "b")]), SCHEMA)
        before = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", "2")  # a GROUP BY over two partitions shuffles
        try:
            text = f"SELECT v, count(*) AS n FROM (SELECT * FROM {relation} DISTRIBUTE BY e) GROUP BY v"
            for _ in range(2):
                assert bound.run(spark, text).num_rows == 2
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", before)
    assert (binder.planned, binder.reused, binder.reanalysed) == (2, 0, 1)


def test_a_plan_that_cannot_run_again_is_planned_from_its_kept_analysis_with_the_rows_of_its_run(spark, binder):
    """A statement that persists a probe it reads twice (as small epochs persist their
    shared probes) is planned anew every time, from its kept analysed plan after the first:
    ``prepare`` gets the same counts of the views it reads, persists that run's probe, and
    the result is of the rows bound for that run."""
    seen = []

    def run(rows: list[tuple[int, str]]) -> list[tuple[str, int]]:
        with bound.binding(binder):
            relation = binder.relation(_frame(rows), SCHEMA)
            definition = f"SELECT e, v FROM {relation} WHERE e > 0"
            view, probe = binder.probe_view(definition, lambda: spark.sql(definition))
            persisted = []

            def prepare(reads) -> bool:
                seen.append(reads()[view])
                persisted.append(probe.persist())
                return True

            try:
                table = bound.run(spark, f"SELECT a.v, count(*) AS n FROM {view} a JOIN {view} b ON a.e = b.e "
                                         "GROUP BY a.v", prepare)
            finally:
                for frame in persisted:
                    frame.unpersist()
        return sorted(zip(table.column("v").to_pylist(), table.column("n").to_pylist()))

    assert run([(1, "a"), (2, "a"), (0, "z")]) == [("a", 2)]
    assert run([(3, "b")]) == [("b", 1)]
    assert run([(4, "c"), (5, "d"), (6, "c")]) == [("c", 2), ("d", 1)]
    assert (binder.planned, binder.reused, binder.reanalysed) == (3, 0, 2)
    assert seen == [2, 2, 2]


def test_a_plan_whose_entries_are_computed_once_runs_again_on_the_driver_with_the_rows_of_its_run(spark, binder):
    """A small epoch's statement that computes a ``WITH`` entry once (an exchange into one
    partition, read again through Spark's reuse of it) runs on the driver, which computes the
    exchange anew at every run: so its plan is kept, and each later run reads the rows bound
    for it. (Run as a job, the kept plan would read the first run's shuffle output again.)"""

    def run(rows: list[tuple[int, str]]) -> list[tuple[int, int]]:
        with small_statements(spark, EngineConfig().small_conf), bound.binding(binder):
            relation = binder.relation(_frame(rows), SCHEMA)
            definition = f"SELECT e, length(v) AS l FROM {relation} WHERE e > 0"
            view, _ = binder.probe_view(definition, lambda: spark.sql(definition))
            table = bound.run(spark, f"WITH w AS (SELECT * FROM (SELECT a.e, a.l FROM {view} a JOIN {view} b "
                                     "ON a.e = b.e) WHERE rand() >= 0) "
                                     "SELECT x.l, count(*) AS n FROM w x JOIN w y ON x.e = y.e GROUP BY x.l")
        return sorted(zip(table.column("l").to_pylist(), table.column("n").to_pylist()))

    assert run([(1, "a"), (2, "b"), (0, "zz")]) == [(1, 2)]
    (kept,) = binder._plans.values()
    assert "ReusedExchange" in kept.frame._jdf.queryExecution().executedPlan().toString()
    # the plan runs again as it was prepared on the driver: its RDDs built once
    assert _rdds_built(spark, lambda: run([(3, "bb")])) == ([(2, 1)], 0)
    assert _rdds_built(spark, lambda: run([(4, "c"), (5, "dd"), (6, "c")])) == ([(1, 2), (2, 1)], 0)
    assert (binder.planned, binder.reused) == (1, 2)
    assert len(binder.take_on_driver()) == 3


def _rdds_built(spark, action):
    """What ``action()`` returns, and how many RDDs the driver built meanwhile."""
    context = spark._jsc.sc()
    before = context.newRddId()
    result = action()
    return result, context.newRddId() - before - 1


def test_a_plan_reading_persisted_probes_runs_again_on_the_driver_as_their_scans_are_partitioned(spark, binder,
                                                                                                  monkeypatch):
    """A small epoch's statement that reads persisted probes, one of whose plans reads another
    (as TPC-H's Q13 counts orders per customer from probed changes and state), runs on the
    driver, which computes each probe there anew at every run: so its plan is kept, and each
    later run reads the rows bound for it. A probe computed there is read as partitioned as
    its scan says: here a union of it with other rows in one partition stays one partition,
    and the sum over it one row per key (said to be partitioned otherwise, the union split in
    two, and Q13 at scale factor 0.1 counted a customer's new order alone)."""

    runs = itertools.count()

    def run(changes: list[tuple[int, str]], state: list[tuple[int, str]]) -> tuple[list[tuple[int, int]], int]:
        with small_statements(spark, EngineConfig().small_conf), bound.binding(binder):
            delta, old = binder.relation(_frame(changes), SCHEMA), binder.relation(_frame(state), SCHEMA)
            counted = f"SELECT e, length(v) AS d FROM {delta}"
            inner_view, inner = binder.probe_view(counted, lambda: spark.sql(counted))
            summed = (f"SELECT e, sum(d) AS n FROM (SELECT e, d FROM {inner_view} "
                      f"UNION ALL SELECT e, length(v) AS d FROM {old}) GROUP BY e")
            outer_view, outer = binder.probe_view(summed, lambda: spark.sql(summed))
            persisted = []

            def prepare(reads) -> bool:
                persisted.extend([inner.persist(), outer.persist()])  # the outer's cached plan reads the inner
                return True

            try:
                table, jobs = _jobs_in(spark, f"factflow-test-persisted-{next(runs)}", lambda: bound.run(
                    spark, f"SELECT x.e, x.n FROM (SELECT /*+ COALESCE(1) */ a.e, a.n FROM {outer_view} a "
                           f"JOIN {outer_view} b ON a.e = b.e AND a.n = b.n) x JOIN {inner_view} c ON x.e = c.e",
                    prepare))
            finally:
                for frame in persisted:
                    frame.unpersist()
        return sorted(zip(table.column("e").to_pylist(), table.column("n").to_pylist())), jobs

    assert run([(1, "a"), (2, "bb")], [(1, "ccc"), (3, "d")]) == ([(1, 4), (2, 2)], 0)
    (kept,) = binder._plans.values()
    assert "InMemoryTableScan" in kept.frame._jdf.queryExecution().executedPlan().toString()
    assert _rdds_built(spark, lambda: run([(3, "bb")], [(3, "d"), (1, "a")])) == (([(3, 3)], 0), 0)
    assert run([(1, "a"), (1, "bb")], [(1, "ccc")]) == ([(1, 6), (1, 6)], 0)
    assert (binder.planned, binder.reused) == (1, 2)
    assert len(binder.take_on_driver()) == 3
    # where the driver gives up (parts too large to hold), the kept plan is planned anew and
    # run as a job (it would read its probes' first cache), then runs on the driver again
    monkeypatch.setattr(bound, "DRIVER_HELD_FRACTION", 0)
    rows, jobs = run([(2, "a"), (2, "b")], [(2, "cc")])
    assert rows == [(2, 4), (2, 4)] and jobs >= 1
    assert run([(5, "a")], [(5, "b"), (6, "c")])[0] == [(5, 2)]
    monkeypatch.undo()
    assert _rdds_built(spark, lambda: run([(7, "abc")], [(7, "d")])) == (([(7, 4)], 0), 0)
    assert (binder.planned, binder.reused) == (1, 5)


def test_a_statement_whose_parts_computed_once_are_too_large_for_the_driver_runs_as_a_job(spark, binder, tmp_path):
    """The rows a statement run on the driver computes once (a ``WITH`` entry read twice) are
    held there for the run; past the bytes it may hold (``DRIVER_HELD_FRACTION`` of the heap)
    the driver gives up, leaving nothing behind, and the statement runs as a job, whose parts
    Spark may spill."""
    with small_statements(spark, EngineConfig().small_conf), bound.binding(binder):
        relation = binder.relation(_frame([(i, "v" * (i % 7)) for i in range(1, 301)]), SCHEMA)
        frame = spark.sql(f"WITH w AS (SELECT * FROM (SELECT e, length(v) AS l FROM {relation}) WHERE rand() >= 0) "
                          "SELECT x.l, count(*) AS n FROM w x JOIN w y ON x.e = y.e GROUP BY x.l")
        driver_run = spark._jvm.factflow.jvm.DriverRun
        assert driver_run.collect(frame._jdf, str(tmp_path), 1_000) is None
        assert not list(tmp_path.iterdir())
        found = driver_run.collect(frame._jdf, str(tmp_path), 1 << 20)
        assert found is not None
        Path(found.file()).unlink()
        table, jobs = _jobs_in(spark, "factflow-test-held-default", lambda: bound.collected(frame).table)
        assert jobs == 0  # the default allows these 300 rows
    assert sorted(table.column("n").to_pylist()) == [42] + [43] * 6


def test_statements_run_on_the_driver_leave_the_block_managers_writers_outside_tasks_alone(spark):
    """A statement run on the driver registers its task with the block manager and releases its
    locks after, as an executor does (memory it needs may evict cached blocks). Its task's id
    must never be the one the block manager gives writers outside tasks: counting ids down from
    -1, the 1,024th run released that writer's locks, and the next broadcast failed."""
    frame = spark.sql("SELECT * FROM VALUES (1), (2) AS t(one)")
    for _ in range(1_100):
        assert bound.collected(frame).read_on_driver is not None
    broadcast = spark.sparkContext.broadcast([1, 2, 3])  # written by the driver outside any task
    assert broadcast.value == [1, 2, 3]
    broadcast.destroy()


def test_kept_plans_hold_no_more_than_their_memory_by_the_length_of_their_text(spark):
    binder = bound.Binder(spark, memory=100 * bound.PLAN_BYTES_PER_CHARACTER)  # 100 characters of text
    try:
        texts = [f"SELECT {n} AS n" for n in range(8)]  # 13 characters each
        texts.append("SELECT 8 AS n, " + ", ".join(f"{k} AS c{k}" for k in range(20)))  # over 100: never kept
        with bound.binding(binder):
            for text in texts:
                bound.run(spark, text)
            assert texts[-1] not in binder._plans
            assert list(binder._plans) == texts[1:8], "the least recently used is dropped to make room"
            bound.run(spark, texts[7])
        assert binder.reused == 1
    finally:
        binder.close()


def test_kept_statements_are_counted_by_their_characters_times_their_weight():
    """A kept plan that reads probes persisted for it holds their cached relations' plans
    too, so it is counted at ``PERSISTED_PLAN_WEIGHT`` times its characters."""
    kept = bound._Kept(capacity=10, memory=100, per_character=1)
    statement = bound._Statement(None, frozenset({"ff_view1"}), lambda: None, frozenset())
    kept.add("a" * 40, statement)
    kept.add("b" * 40, statement, weight=1.5)  # 60: 100 in all
    assert list(kept) == ["a" * 40, "b" * 40]
    kept.add("c" * 10, statement)  # 110: the least recently used goes
    assert list(kept) == ["b" * 40, "c" * 10]
    kept.add("d" * 70, statement, weight=1.5)  # 105 alone: never kept
    assert list(kept) == ["b" * 40, "c" * 10]
    kept.keep_reading(frozenset())  # the view they read is gone
    assert not list(kept) and kept._characters == 0


def test_a_closed_querys_statements_go_and_its_probe_views_once_no_query_reads_them(spark):
    """A statement kept for an evaluation goes once any query it evaluated is closed (its
    text never comes again); a probe view once every query that read it is, unless the
    engine's own statements (no owner) read it too."""
    kept = bound._Kept(capacity=10, memory=1000, per_character=1)
    for sql, owners in (("a", {"q1"}), ("b", {"q1", "q2"}), ("c", {"q2"}), ("d", set())):
        kept.add(sql, bound._Statement(None, frozenset(), lambda: None, frozenset(owners)))
    kept.forget("q1")
    assert list(kept) == ["c", "d"] and kept._characters == 2
    binder = bound.Binder(spark)
    try:
        definitions = [f"SELECT {n} AS n" for n in range(3)]

        def probe(n: int, owners: list[str]) -> str:
            with bound.binding(binder, owners=owners):
                return binder.probe_view(definitions[n], lambda: spark.sql(definitions[n]))[0]

        names = [probe(0, ["q1"]), probe(1, ["q1"]), probe(2, ["q1"])]
        probe(1, ["q2"])  # read by q2 too
        probe(2, [])  # and by the engine's own statements
        assert binder.owners == frozenset(), "the owners are the block's alone"
        binder.forget("q1")
        assert list(binder._probes) == names[1:] and not spark.catalog.tableExists(names[0])
        assert binder._probe_characters == len(definitions[1]) + len(definitions[2])
        binder.forget("q2")
        assert list(binder._probes) == names[2:] and not spark.catalog.tableExists(names[1])
    finally:
        binder.close()


def test_closing_a_query_drops_the_plans_kept_for_its_epochs_alone(engine):
    engine.create_attribute(":n", type="long")
    engine.create_attribute(":m", type="long")
    first = engine.query("[:find ?e ?n :where [?e :n ?n] [(> ?n 2)]]")
    second = engine.query("[:find ?e ?m :where [?e :m ?m] [(> ?m 2)]]")
    for e in range(1, 5):  # each epoch affects one query
        engine.transact([[":db/add", e, ":n", e]])
        engine.transact([[":db/add", e, ":m", e]])
    binder = engine._state.binder
    owners = {owner for kept in binder._plans.values() for owner in kept.owners}
    assert {first.dataflow, second.dataflow} <= owners
    first.close()
    assert all(first.dataflow not in kept.owners for kept in binder._plans.values())
    assert any(second.dataflow in kept.owners for kept in binder._plans.values())
    reused = binder.reused
    engine.transact([[":db/add", 9, ":m", 9]])
    assert binder.reused > reused, "the other query's plans are still kept"
    assert second.results() == {(e, e): 1 for e in (3, 4, 9)}


def test_probe_views_hold_half_the_memory_by_their_text_as_analysed_plans(spark):
    """Between statement groups, the least recently used parameterized probe views go while
    their definitions, at ``ANALYSED_BYTES_PER_CHARACTER``, take more than half the memory."""
    binder = bound.Binder(spark, memory=2 * 100 * bound.ANALYSED_BYTES_PER_CHARACTER)  # 100 characters of probes
    try:
        definitions = [f"SELECT {n} AS n".ljust(40) for n in range(3)]  # 40 characters each
        names = [binder.probe_view(d, lambda d=d: spark.sql(d))[0] for d in definitions[:2]]
        binder.restart()
        assert list(binder._probes) == names, "80 characters: both kept"
        binder.probe_view(definitions[0], lambda: spark.sql(definitions[0]))  # used again: the most recent
        names.append(binder.probe_view(definitions[2], lambda: spark.sql(definitions[2]))[0])
        binder.restart()
        assert list(binder._probes) == [names[0], names[2]], "120 characters: the least recently used went"
        assert not spark.catalog.tableExists(names[1])
    finally:
        binder.close()


def test_a_kept_plan_is_dropped_with_a_view_it_reads(spark, binder):
    view = register_view(spark.range(3), prefix="ff_b", lasting=True)
    text = f"SELECT id FROM {view} WHERE id > 0"  # no exchange: kept
    with bound.binding(binder):
        assert sorted(bound.run(spark, text).column("id").to_pylist()) == [1, 2]
        assert sorted(bound.run(spark, text).column("id").to_pylist()) == [1, 2]
        assert (binder.planned, binder.reused) == (1, 1)
        drop_view(spark, view)
        view_again = register_view(spark.range(5), prefix="ff_b", lasting=True)
        try:
            assert bound.run(spark, f"SELECT id FROM {view_again}").num_rows == 5
        finally:
            drop_view(spark, view_again)
        bound.run(spark, "SELECT 1 AS one")  # a kept plan is dropped at the next run after its view
    assert not any(kept.views for kept in binder._plans.values()), "no plan outlives the views it reads"


def test_statements_without_an_active_binder_are_planned_as_before(spark, binder):
    relation = binder.relation(_frame([(1, "a")]), SCHEMA)  # bound, but not active when run
    assert bound.current() is None
    assert bound.run(spark, f"SELECT count(*) AS n FROM {relation}").column("n").to_pylist() == [1]
    assert binder.planned == 0


REUSED = [q for q in CATALOG + JOIN_CATALOG if any(s in q[0] for s in (
    ":d/friend ?b] [?b :d/friend ?c]",
    "?n (count ?e)",
    "(mutual ?a ?b)",
    "(not [?b :d/friend ?a])",
))]


@pytest.mark.parametrize("join", ["delta", "wco"])
def test_small_epochs_reuse_their_plans_and_match_the_oracle(spark, monkeypatch, join):
    """One-operation transactions repeat a few shapes: most epochs run kept plans, with
    their own rows, and every query matches the oracle after every epoch. (Their changes
    are computed in a statement of their own, not guessed: that statement's one shape is
    what the claim counts on; guessed epochs are covered in tests/test_speculation.py.)"""
    binders: list[bound.Binder] = []
    original = bound.Binder.__init__

    def tracked(self, *args, **kwargs):
        original(self, *args, **kwargs)
        binders.append(self)

    monkeypatch.setattr(bound.Binder, "__init__", tracked)
    assert len(REUSED) >= 4
    run_stream(spark, 41, epochs=16, queries=REUSED, join=join, max_ops=1, config=EngineConfig(guess_changes=False))
    assert len(binders) == 1
    assert binders[0].reused >= binders[0].planned, (binders[0].planned, binders[0].reused)


def test_an_engine_on_a_session_without_the_jar_plans_every_statement(spark, monkeypatch):
    monkeypatch.setattr(bound, "supported", lambda session: False)
    with Engine(spark=spark) as db:
        assert db._state.binder is None
        db.create_attribute(":n", type="long")
        q = db.query("[:find ?e ?n :where [?e :n ?n]]")
        db.transact([[":db/add", 1, ":n", 5]])
        assert q.results() == {(1, 5): 1}


def test_an_epoch_reports_the_statements_it_ran_from_kept_plans(engine):
    engine.create_attribute(":n", type="long")
    q = engine.query("[:find ?e ?n :where [?e :n ?n] [(> ?n 2)]]")
    for e in range(1, 9):  # the same transaction shape every epoch: one new fact
        engine.transact([[":db/add", e, ":n", e]])
    reports = engine.epoch_log[-8:]
    assert all(0 <= r.plans_reused <= r.statements for r in reports)
    assert sum(r.plans_reused for r in reports) >= 4, [r.describe() for r in reports]
    assert re.search(r"statements? from kept plans", reports[-1].describe())
    assert q.results() == {(e, e): 1 for e in range(3, 9)}


TYPED = T.StructType([T.StructField("e", T.LongType()), T.StructField("name", T.StringType()),
                      T.StructField("score", T.DoubleType()), T.StructField("ok", T.BooleanType()),
                      T.StructField("at", T.TimestampType()), T.StructField("day", T.DateType()),
                      T.StructField("amount", T.DecimalType(12, 2))])


def _typed(n: int) -> pd.DataFrame:
    import datetime as dt
    from decimal import Decimal

    return pd.DataFrame({
        "e": pd.array(range(n), dtype="Int64"),
        "name": [None if i % 11 == 0 else ("b\x00c" if i % 5 == 0 else ("b" if i % 2 else "Zoë")) for i in range(n)],
        "score": [None if i % 13 == 0 else i / 7 for i in range(n)],
        "ok": pd.array([None if i % 17 == 0 else i % 3 == 0 for i in range(n)], dtype="boolean"),
        "at": [dt.datetime(2026, 11, 30, 8, 30, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i * 1.25)
               for i in range(n)],
        "day": [dt.date(1992, 1, 1) + dt.timedelta(days=i) for i in range(n)],
        "amount": [Decimal(i * 1001) / 100 for i in range(n)],
    })


def _jobs_in(spark, group: str, run) -> tuple[object, int]:
    """What ``run()`` returns and how many Spark jobs it ran (in a job group of its own)."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        result = run()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return result, len(sc.statusTracker().getJobIdsForGroup(group))


def _driver_run_files() -> set[Path]:
    """The files of driver runs in the temporary directory (a process killed while reading
    one may have left one behind)."""
    return set(Path(tempfile.gettempdir()).glob("factflow-driver-run-*"))


def test_a_statement_over_bound_rows_runs_on_the_driver_and_gives_what_a_job_gives(spark, binder):
    """A join, an aggregate and a sort over bound rows of every value type (nulls, a string
    with a NUL, a decimal, an instant) run in the driver's JVM with no Spark job, and give
    the table the same statement gives as a job, with the rows its scans read."""
    from factflow.engine.apply import small_statements

    n = 400
    files = _driver_run_files()
    with bound.binding(binder), small_statements(spark, EngineConfig().small_conf):
        relation = binder.relation(_typed(n), TYPED)
        text = (f"SELECT a.*, g.n, g.total, g.first FROM {relation} a JOIN (SELECT name, count(*) AS n, "
                f"sum(amount) AS total, min(at) AS first FROM {relation} GROUP BY name) g ON a.name <=> g.name "
                f"WHERE a.score IS NULL OR a.score < 40 ORDER BY a.e DESC")
        frame = spark.sql(text)
        on_driver, jobs = _jobs_in(spark, "factflow-test-driver-run", lambda: bound.collected(frame))
        assert jobs == 0 and on_driver.read_on_driver == 2 * n  # the slot, scanned by both sides
        as_job, jobs = _jobs_in(spark, "factflow-test-as-job", frame.toArrow)
        assert jobs >= 1
        empty = spark.sql(f"SELECT * FROM {relation} WHERE e < 0")
        assert bound.collected(empty).table.equals(empty.toArrow())
    assert _driver_run_files() == files  # the rows' files read and removed
    assert on_driver.table.num_rows == as_job.num_rows > n // 2
    assert on_driver.table.equals(as_job)
    assert on_driver.table.to_pandas().equals(as_job.to_pandas())


def test_a_driver_run_leaves_the_call_site_as_it_found_it(spark, binder):
    """A driver run sets a call site for the RDDs it builds (so that each is not read off a
    stack trace) and leaves the thread's call site as it found it, set or not."""
    sc = spark.sparkContext
    relation = binder.relation(_frame([(1, "a"), (2, "b")]), SCHEMA)
    frame = spark.sql(f"SELECT v, count(*) AS n FROM {relation} GROUP BY v")
    for before in (None, "the caller's"):
        for form in ("callSite.short", "callSite.long"):
            sc.setLocalProperty(form, before)
        try:
            assert bound.collected(frame).read_on_driver == 2
            assert [sc.getLocalProperty(form) for form in ("callSite.short", "callSite.long")] == [before, before]
        finally:
            for form in ("callSite.short", "callSite.long"):
                sc.setLocalProperty(form, None)


def test_statements_the_driver_cannot_run_alone_run_as_jobs(spark, binder):
    """A plan that shuffles, calls Python other than ``mapInArrow`` or reads anything but
    bound and literal rows is not run on the driver."""
    before = spark.conf.get("spark.sql.shuffle.partitions")
    with bound.binding(binder):
        relation = binder.relation(_frame([(1, "a"), (2, "b"), (3, "a")]), SCHEMA)
        spark.range(5).createOrReplaceTempView("factflow_test_range_view")
        spark.conf.set("spark.sql.shuffle.partitions", "2")
        try:
            for text in (f"SELECT v, count(*) AS n FROM (SELECT * FROM {relation} DISTRIBUTE BY e) GROUP BY v",
                         f"SELECT e FROM {relation} WHERE e IN (SELECT id FROM factflow_test_range_view)",
                         f"SELECT e, id FROM {relation} JOIN factflow_test_range_view ON e = id"):
                frame = spark.sql(text)
                found = bound.collected(frame)
                assert found.read_on_driver is None, text
                assert found.table.equals(frame.toArrow()), text
            spark.udf.register("factflow_test_upper", lambda v: v.upper())
            udf = spark.sql(f"SELECT e, factflow_test_upper(v) AS v FROM {relation}")
            found = bound.collected(udf)
            assert found.read_on_driver is None
            assert found.table.column("v").to_pylist() == ["A", "B", "A"]
            literal = spark.sql("SELECT * FROM VALUES (1, 'x'), (2, 'y') AS t(e, v) WHERE e > 1")
            found = bound.collected(literal)
            assert (found.table, found.read_on_driver) == (literal.toArrow(), 0)
            # a limit over several partitions gathers them through a shuffle of its own
            rows = ", ".join(f"({i}L)" for i in range(40))
            spark.sql(f"SELECT * FROM VALUES {rows} AS t(e)").createOrReplaceTempView("factflow_test_rows_view")
            for text in ("SELECT x FROM (SELECT explode(sequence(0, e)) AS x FROM factflow_test_rows_view) LIMIT 30",
                         "SELECT e FROM factflow_test_rows_view ORDER BY e DESC LIMIT 3"):
                frame = spark.sql(text)
                found = bound.collected(frame)
                assert found.read_on_driver is None, text
                assert found.table.num_rows == frame.toArrow().num_rows == (30 if "explode" in text else 3), text
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", before)
            drop_view(spark, "factflow_test_range_view")
            drop_view(spark, "factflow_test_rows_view")


def test_a_python_function_mapped_over_bound_rows_runs_in_a_python_worker_of_the_driver(spark, binder):
    """``mapInArrow`` over bound rows (factflow's probes of index files) runs without a Spark
    job, in a Python worker the driver starts, with the job's rows; a Python error reaches
    the caller, leaves no task context behind, and the next statement runs there again."""
    from pyspark.errors import PySparkException

    def _doubled(batches):  # defined here: Python workers cannot import test modules
        import pyarrow.compute as pc

        for batch in batches:
            yield batch.set_column(0, "e", pc.multiply(batch.column(0), 2))

    def _failing(batches):
        for _ in batches:
            raise ValueError("factflow-test: probe failed")
        yield from ()

    with bound.binding(binder):
        relation = binder.relation(_frame([(1, "a"), (2, "b"), (3, "a")]), SCHEMA)
        doubled = spark.sql(f"SELECT e, v FROM {relation}").mapInArrow(_doubled, SCHEMA).where("v = 'a'")
        found = bound.collected(doubled)
        assert found.read_on_driver == 3
        assert found.table.equals(doubled.toArrow())
        assert sorted(found.table.column("e").to_pylist()) == [2, 6]
        failing = spark.sql(f"SELECT e, v FROM {relation}").mapInArrow(_failing, SCHEMA)
        files = _driver_run_files()
        with pytest.raises(PySparkException, match="factflow-test: probe failed"):
            bound.collected(failing)
        assert spark._jvm.org.apache.spark.TaskContext.get() is None
        assert _driver_run_files() == files  # its file removed
        assert bound.collected(doubled).read_on_driver == 3


def test_a_statement_that_fails_on_the_driver_raises_and_leaves_no_task_behind(spark, binder):
    """An error raised while the driver runs a statement (an ANSI cast) reaches the caller;
    the driver's thread is left without a task context, and the next statement runs."""
    from pyspark.errors import PySparkException

    files = _driver_run_files()
    with bound.binding(binder):
        relation = binder.relation(_frame([(1, "7"), (2, "seven")]), SCHEMA)
        failing = spark.sql(f"SELECT e, CAST(v AS INT) AS n FROM {relation} ORDER BY n")
        with pytest.raises(PySparkException, match="'seven'.* cannot be cast"):
            bound.collected(failing)
        assert spark._jvm.org.apache.spark.TaskContext.get() is None
        assert _driver_run_files() == files  # its file removed
        fine = spark.sql(f"SELECT e, v FROM {relation} ORDER BY e DESC")
        assert bound.collected(fine).table.column("v").to_pylist() == ["seven", "7"]
