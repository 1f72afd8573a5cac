"""db.load: files of any Spark source as facts in one epoch, checked against the oracle."""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd
import pytest

from factflow import Engine, EngineConfig, LoadError
from factflow.cli import main
from factflow.io.ldbc import find_ldbc, ldbc_file, load_ldbc
from oracle import Oracle

SCHEMA = [(":p/name", "string", "one"), (":p/age", "long", "one"), (":p/score", "double", "set"),
          (":p/active", "boolean", "one"), (":p/born", "instant", "one"), (":p/friend", "ref", "set")]
COLUMNS = {":p/name": "name", ":p/age": "age", ":p/score": "score", ":p/active": "active", ":p/born": "born",
           ":p/friend": "friend"}
UTC = dt.timezone.utc
# rows (id, name, age, score, active, born, friend); None cells are skipped
ROWS = [(1, "Ann", 31, 1.5, True, dt.datetime(1990, 1, 2, 3, 4, 5, tzinfo=UTC), 2),
        (2, "Bob", None, 2.25, False, None, 1),
        (3, None, 40, None, None, dt.datetime(2000, 6, 7, tzinfo=UTC), None)]

#: a load of at most ``local_limit`` facts and rows is checked and fetched in one job; one of
#: more is checked and applied in Spark (``local_limit=2`` sends every load here that way)
PATHS = {"small": None, "bulk": EngineConfig(local_limit=2)}


def _engine(spark, config: EngineConfig | None = None) -> tuple[Engine, set]:
    """An engine with SCHEMA, and the set of facts it holds, kept by attribute feeds."""
    db = Engine(spark=spark, config=config)
    facts: set = set()

    def follow(attribute):
        def changed(epoch, changes):
            for (e, v), diff in changes:
                (facts.add if diff > 0 else facts.discard)((e, attribute, v))
        return changed

    for name, kind, semantics in SCHEMA:
        db.create_attribute(name, type=kind, semantics=semantics)
        db.subscribe_attribute(name, follow(name))
    return db, facts


def _expected() -> set:
    oracle = Oracle()
    for name, kind, semantics in SCHEMA:
        oracle.create_attribute(name, kind, semantics)
    oracle.transact([[":db/add", row[0], attribute, value]
                     for row in ROWS for attribute, value in zip(COLUMNS, row[1:]) if value is not None])
    return {(e, a, v) for a, facts in oracle.facts.items() for (e, v), n in facts.items() if n}


def _write(tmp_path, spark, fmt: str) -> tuple[str, dict]:
    """ROWS as a real file of ``fmt``; returns its path and the reader options."""
    path = str(tmp_path / f"people.{fmt}")
    if fmt == "csv":  # text as a CSV file holds it: instants in milliseconds and in ISO-8601
        with open(path, "w") as out:
            out.write("id|name|age|score|active|born|friend\n")
            out.write("1|Ann|31|1.5|true|631249445000|2\n")
            out.write("2|Bob||2.25|false||1\n")
            out.write("3||40|||2000-06-07T00:00:00|\n")
        return path, {"header": "true", "sep": "|"}
    if fmt == "json":  # typed JSON values, nulls and absent fields
        with open(path, "w") as out:
            for row in ROWS:
                record = {k: v for k, v in zip(["id", *COLUMNS.values()], row) if v is not None}
                if "born" in record:
                    record["born"] = record["born"].strftime("%Y-%m-%dT%H:%M:%S")
                out.write(json.dumps(record) + "\n")
        return path, {}
    frame = pd.DataFrame(ROWS, columns=["id", *COLUMNS.values()]).astype({"age": "Int64", "friend": "Int64", "score": "Float64"})
    spark.createDataFrame(frame).write.parquet(path)  # typed columns: long, double, boolean, timestamp
    return path, {}


@pytest.mark.parametrize("fmt,path", [("csv", "small"), ("json", "small"), ("parquet", "small"), ("csv", "bulk")])
def test_load_maps_columns_to_attributes_in_one_epoch(spark, tmp_path, fmt, path):
    config = PATHS[path]
    path, options = _write(tmp_path, spark, fmt)
    db, facts = _engine(spark, config)
    try:
        report = db.load(path, format=fmt, entity="id", attributes=COLUMNS, options=options)
        assert report.epoch == db.epoch == 1  # one epoch
        assert report.rows == 3
        assert report.facts == {a: sum(row[i + 1] is not None for row in ROWS) for i, a in enumerate(COLUMNS)}
        assert facts == _expected()
        # the ref column joins as an entity reference
        friends = db.query("[:find ?n ?m :where [?a :p/friend ?b] [?a :p/name ?n] [?b :p/name ?m]]").results()
        assert friends == {("Ann", "Bob"): 1, ("Bob", "Ann"): 1}
    finally:
        db.close()


@pytest.mark.parametrize("way", sorted(PATHS))
def test_a_small_load_is_checked_and_fetched_by_one_job(spark, way):
    frame = spark.createDataFrame(pd.DataFrame(ROWS, columns=["id", *COLUMNS.values()]).astype(
        {"age": "Int64", "friend": "Int64", "score": "Float64"}))
    db, facts = _engine(spark, PATHS[way])
    tracker = spark.sparkContext.statusTracker()
    try:
        before = len(tracker.getJobIdsForGroup("factflow-load"))
        report = db.load(frame, entity="id", attributes=COLUMNS)
        # a larger load fetches at most the limit, then checks all rows in a second job
        assert len(tracker.getJobIdsForGroup("factflow-load")) - before == (1 if way == "small" else 2)
        assert (report.epoch, report.rows) == (1, 3)
        assert facts == _expected()
        db.load(frame.where("id = 3"), entity="id", attributes=COLUMNS, added=False)
        assert facts == {f for f in _expected() if f[0] != 3}
        assert not _load_views(spark)
    finally:
        db.close()


def _load_views(spark) -> list[str]:
    """The temp views a load registered and did not drop."""
    return [t.name for t in spark.catalog.listTables() if t.isTemporary and t.name.startswith(("ff_load", "ff_table"))]


@pytest.mark.parametrize("way", sorted(PATHS))
def test_a_value_that_does_not_convert_rejects_the_whole_load(spark, tmp_path, way):
    path = str(tmp_path / "bad.csv")
    with open(path, "w") as out:
        out.write("id,name,age,active\n1,Ann,31,true\n2,Bob,abc,false\n3,Cy,4.5,maybe\n4,Di,x,true\n")
    db, facts = _engine(spark, PATHS[way])
    try:
        with pytest.raises(LoadError) as info:
            db.load(path, entity="id", attributes={":p/name": "name", ":p/age": "age", ":p/active": "active"},
                    options={"header": "true"})
        message = str(info.value)
        assert ":p/age (column 'age'): 3 rows not convertible to long" in message
        assert ":p/active (column 'active'): 1 row not convertible to boolean, e.g. 'maybe' (entity 3)" in message
        assert any(example in message for example in ("'abc' (entity 2)", "'4.5' (entity 3)", "'x' (entity 4)"))
        assert db.epoch == 0 and facts == set()  # nothing applied
        with pytest.raises(LoadError, match="entity column 'name': 4 rows with a missing or non-integer entity id, "
                                            "e.g. 'Ann'"):
            db.load(path, entity="name", attributes={":p/age": "id"}, options={"header": "true"})
        with pytest.raises(LoadError, match="no column 'nope'"):
            db.load(path, attributes={":p/age": "nope"}, options={"header": "true"})
        with pytest.raises(LoadError, match=":p/unknown"):
            db.load(path, attributes={":p/unknown": "name"}, options={"header": "true"})
        assert db.epoch == 0
    finally:
        db.close()


def test_ldbc_tables_load_with_load(spark):
    db = Engine(spark=spark)
    try:
        epochs = load_ldbc(db)
        assert sorted(epochs.values()) == [1, 2, 3, 4]
        root = find_ldbc()
        persons = pd.read_csv(ldbc_file(root, "person_0_0.csv"), sep="|")
        knows = pd.read_csv(ldbc_file(root, "person_knows_person_0_0.csv"), sep="|")
        assert db.query("[:find (count ?p) . :where [?p :person/firstName _]]").results() == len(persons)
        pairs = db.query("[:find ?a ?b :where [?a :person/knows ?b]]").results()
        assert set(pairs) == set(zip(knows.iloc[:, 0].tolist(), knows.iloc[:, 1].tolist()))
        first = persons.iloc[0]
        born = db.query("[:find ?b . :in $ ?p :where [?p :person/birthday ?b]]", inputs=(int(first["id"]),)).results()
        assert born == dt.datetime.fromtimestamp(first["birthday"] / 1000, tz=UTC)
    finally:
        db.close()


def test_the_load_command_creates_attributes_and_applies_to_a_state_dir(spark, tmp_path, capsys):
    path, _ = _write(tmp_path, spark, "csv")
    state = str(tmp_path / "state")
    status = main(["load", path, "--state-dir", state, "--option", "header=true", "--option", "sep=|",
                   "--attr", ":p/name=name:string:one", "--attr", ":p/friend=friend:ref"])
    assert status == 0
    assert "epoch 1: 3 rows, facts :p/name 2, :p/friend 2" in capsys.readouterr().out
    assert main(["load", path, "--state-dir", state, "--attr", ":p/nope=name"]) == 1  # unknown, no type given
    assert ":p/nope" in capsys.readouterr().err
    with Engine(spark=spark, state_dir=state) as db:
        assert db.epoch == 1
        assert db.query("[:find ?n ?m :where [?a :p/friend ?b] [?a :p/name ?n] [?b :p/name ?m]]").results() == \
            {("Ann", "Bob"): 1, ("Bob", "Ann"): 1}


def test_tables_loaded_together_arrive_and_leave_in_one_epoch(spark):
    """load_tables: an order and its line items (a reference between them, a column name
    both tables use) in one epoch, and retracted in one, so the join never sees a line item
    without its order; a table given twice is refused, changing nothing."""
    from factflow.io.tables import Reference, Table, load_tables

    orders = Table("orders", key=("o_key",))
    lines = Table("lines", key=("l_order", "l_number"), references={"l_order": Reference("orders", ("l_order",))})
    order_rows = pd.DataFrame({"o_key": [1, 2], "note": ["rush", "slow"]})
    line_rows = pd.DataFrame({"l_order": [1, 1, 2], "l_number": [1, 2, 1], "note": ["a", "b", "c"]})
    tracker = spark.sparkContext.statusTracker()
    with Engine(spark=spark) as db:
        before = len(tracker.getJobIdsForGroup("factflow-load"))
        load_tables(db, [(order_rows, orders), (line_rows, lines)])  # creates the attributes
        # few rows of pandas frames are bound to slots of the load's statement, which the driver runs
        assert len(tracker.getJobIdsForGroup("factflow-load")) == before
        q = db.query("[:find ?o ?l ?n :where [?x :lines/l_order ?y] [?y :orders/o_key ?o] "
                     "[?y :orders/note ?n] [?x :lines/l_number ?l]]", name="lines-of-orders")
        epochs = []
        q.subscribe(lambda epoch, changes: epochs.append((epoch, sorted(changes))))
        assert q.results() == {(1, 1, "rush"): 1, (1, 2, "rush"): 1, (2, 1, "slow"): 1}
        before = db.epoch
        load_tables(db, [(line_rows[line_rows.l_order == 2], lines), (order_rows[order_rows.o_key == 2], orders)],
                    added=False)
        assert db.epoch == before + 1
        assert epochs == [(before + 1, [((2, 1, "slow"), -1)])]
        assert q.results() == {(1, 1, "rush"): 1, (1, 2, "rush"): 1}
        facts = db.query("[:find ?e ?n :where [?e :lines/note ?n]]", name="notes").results()
        assert sorted(n for _, n in facts) == ["a", "b"]  # each table's own "note" column
        with pytest.raises(LoadError, match="orders given twice"):
            load_tables(db, [(order_rows, orders), (order_rows, orders)])
        assert db.epoch == before + 1
        # a Spark DataFrame beside a pandas frame too large to write inline: the same entities
        many = pd.DataFrame({"l_order": [3] * 100, "l_number": range(100), "note": ["x"] * 100})
        load_tables(db, [(spark.createDataFrame(pd.DataFrame({"o_key": [3], "note": ["bulk"]})), orders),
                         (many, lines)])
        assert len(q.results()) == 102
        load_tables(db, [(many, lines)], added=False)
        assert sorted(q.results()) == [(1, 1, "rush"), (1, 2, "rush")]
        assert not _load_views(spark)
        # tables of the shape loaded first (rows bound, not written into the text): its plan again
        reused = db._state.load_binder.reused
        load_tables(db, [(order_rows[order_rows.o_key == 2], orders), (line_rows[line_rows.l_order == 2], lines)])
        assert db._state.load_binder.reused == reused + 1
        assert sorted(q.results()) == [(1, 1, "rush"), (1, 2, "rush"), (2, 1, "slow")]
