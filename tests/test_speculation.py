"""Small epochs whose effective changes are guessed and checked inside the queries' job
(factflow.engine.speculation): one Spark job when the guess is right, the exact result and
error when it is not."""

from __future__ import annotations

import datetime as dt

import pytest

from factflow import Engine, TransactionError
from factflow.engine.speculation import PAUSE


def add(e, a, v):
    return [":db/add", e, a, v]


def retract(e, a, v):
    return [":db/retract", e, a, v]


@pytest.fixture
def db(spark):
    engine = Engine(spark=spark)
    engine.create_attribute(":p/name", type="string", semantics="one")
    engine.create_attribute(":p/age", type="long", semantics="one")
    engine.create_attribute(":p/knows", type="ref")
    engine.create_attribute(":p/born", type="instant", semantics="one")
    engine.transact([add(i, ":p/name", f"n{i}") for i in range(1, 6)]
                    + [add(i, ":p/age", 20 + i) for i in range(1, 6)]
                    + [add(i, ":p/knows", i + 1) for i in range(1, 5)])
    yield engine
    engine.close()


def jobs(db) -> list[str]:
    """What the last epoch ran: its Spark jobs and its statements run on the driver."""
    return db.epoch_log[-1].steps


def test_a_right_guess_takes_one_job_and_a_wrong_one_the_exact_result(db):
    older = db.query("[:find ?n ?a :where [?p :p/name ?n] [?p :p/age ?a] [(> ?a 22)]]")
    pairs = db.query("[:find ?x ?z :where [?x :p/knows ?y] [?y :p/knows ?z]]")
    seen = []
    db.subscribe_attribute(":p/age", lambda epoch, changes: seen.append((epoch, sorted(changes))))

    db.transact([add(6, ":p/name", "n6"), add(6, ":p/age", 40), add(5, ":p/knows", 6)])
    assert len(jobs(db)) == 1, jobs(db)
    assert "effective changes" not in " ".join(jobs(db))
    assert older.results() == {("n3", 23): 1, ("n4", 24): 1, ("n5", 25): 1, ("n6", 40): 1}
    assert pairs.results() == {(1, 3): 1, (2, 4): 1, (3, 5): 1, (4, 6): 1}

    # a new age displaces the present one: the guess (an assertion alone) is wrong
    epoch = db.transact([add(3, ":p/age", 50), retract(1, ":p/knows", 2)])
    assert any("effective changes" in j for j in jobs(db)), jobs(db)
    assert older.results() == {("n3", 50): 1, ("n4", 24): 1, ("n5", 25): 1, ("n6", 40): 1}
    assert pairs.results() == {(2, 4): 1, (3, 5): 1, (4, 6): 1}
    assert seen[-1] == (epoch, [((3, 23), -1), ((3, 50), 1)])

    # the attribute guessed wrong is not guessed for a while; the others still are
    db.transact([add(2, ":p/age", 60)])
    assert any("effective changes" in j for j in jobs(db)), jobs(db)
    db.transact([add(7, ":p/knows", 1)])
    assert len(jobs(db)) == 1, jobs(db)
    for _ in range(PAUSE):
        db.transact([add(9, ":p/knows", 9)])
        db.transact([retract(9, ":p/knows", 9)])
    db.transact([add(7, ":p/age", 70)])
    assert len(jobs(db)) == 1, jobs(db)
    assert older.results() == {("n2", 60): 1, ("n3", 50): 1, ("n4", 24): 1, ("n5", 25): 1, ("n6", 40): 1}
    assert seen[-1][1] == [((7, 70), 1)]


@pytest.mark.parametrize("tx, reason", [
    ([add(1, ":p/knows", 2)], "an assertion of a present fact changes nothing"),
    ([retract(1, ":p/knows", 5)], "a retraction of an absent fact changes nothing"),
    ([add(1, ":p/name", "n1")], "an entity's present value asserted again"),
])
def test_epochs_whose_guess_may_be_wrong_equal_the_oracle(db, tx, reason):
    named = db.query("[:find ?p ?n :where [?p :p/name ?n]]")
    knows = db.query("[:find ?p ?q :where [?p :p/knows ?q]]")
    before = (named.results(), knows.results())
    db.transact(tx)
    assert any("effective changes" in j for j in jobs(db)), jobs(db)
    assert (named.results(), knows.results()) == before, reason


def test_guessed_values_of_every_kind_are_the_values_spark_would_have_stored(db):
    """An instant, a double and a boolean guessed on the driver are found again by value,
    and retracted by value, as the effective changes Spark computes would be."""
    db.create_attribute(":p/score", type="double")
    db.create_attribute(":p/active", type="boolean", semantics="one")
    when = dt.datetime(1990, 5, 17, 8, 30, 1, 250000, tzinfo=dt.timezone.utc)
    found = db.query('[:find ?p ?s ?ok :where [?p :p/born #inst "1990-05-17T08:30:01.250Z"] '
                     '[?p :p/score ?s] [?p :p/active ?ok]]')
    db.transact([add(2, ":p/born", when), add(2, ":p/score", 0.1 + 0.2), add(2, ":p/active", False)])
    assert len(jobs(db)) == 1, jobs(db)
    assert found.results() == {(2, 0.1 + 0.2, False): 1}
    db.transact([retract(2, ":p/born", when)])
    assert len(jobs(db)) == 1, jobs(db)
    assert found.results() == {}


def test_a_rejected_transaction_is_rejected_as_before_and_leaves_no_trace(db):
    names = db.query("[:find ?p ?n :where [?p :p/name ?n]]")
    before, epoch = names.results(), db.epoch
    with pytest.raises(TransactionError, match="has cardinality one, but entity 8 is given several values"):
        db.transact([add(8, ":p/name", "a"), add(8, ":p/name", "b")])
    with pytest.raises(TransactionError, match="both asserted and retracted"):
        db.transact([add(8, ":p/knows", 1), retract(8, ":p/knows", 1)])
    assert names.results() == before and db.epoch == epoch
    db.transact([add(9, ":p/knows", 1)])  # the epoch whose number the rejected ones had (their jobs are in its report)
    db.transact([add(8, ":p/name", "n8")])
    assert names.results() == {**before, (8, "n8"): 1}
    assert len(jobs(db)) == 1, "a rejected transaction kept the next from being guessed: " + str(jobs(db))


def test_each_further_wrong_guess_doubles_the_pause_and_wrong_guesses_in_a_row_pause_all():
    from factflow.engine.speculation import LONGEST_PAUSE, Guesses

    guesses = Guesses()
    guesses.wrong({4}, 10)
    assert guesses.attributes == {4: (10 + PAUSE, PAUSE)} and guesses.allowed({5}, 11)
    assert not guesses.allowed({4, 5}, 10 + PAUSE - 1) and guesses.allowed({4}, 10 + PAUSE)
    guesses.right()
    guesses.wrong({4, 5}, 50)  # after a right guess: not two in a row
    assert guesses.attributes == {4: (50 + 2 * PAUSE, 2 * PAUSE), 5: (50 + PAUSE, PAUSE)}
    assert guesses.allowed({6}, 51)
    guesses.wrong({6}, 51)  # two in a row: nothing is guessed for a while
    assert not guesses.allowed({7}, 52) and guesses.allowed({7}, 51 + PAUSE)
    for epoch in range(100, 120):
        guesses.wrong({4}, epoch)
    assert guesses.attributes[4] == (119 + LONGEST_PAUSE, LONGEST_PAUSE)
    assert guesses.everything == (119 + LONGEST_PAUSE, LONGEST_PAUSE)
