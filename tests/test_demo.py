"""The demo tells its story: newcomers in Berlin become friends and neighbours, every epoch
says what changed (or that nothing did), diffs name people, and it ends with a summary,
not a plan dump."""

import io
import re
from importlib import resources

from factflow.demo import QUERIES, WHY_SECONDS, run_demo

DATA = str(resources.files("factflow") / "data" / "ldbc-snb-tiny")
CHANGE = re.compile(r"^    (\S+) +([+-])1 \((.*)\)$", re.M)


def test_the_demo_tells_its_story(spark):
    out = io.StringIO()
    db = run_demo(DATA, out=out, spark=spark)
    db.close()
    text = out.getvalue()
    assert not re.search(r"\d{16}", text), text  # no raw entity ids
    for step in ("1. Start Spark", "2. Register two rules", "3. Install three queries", "4. Change the data",
                 "5. What the engine holds now"):
        assert re.search(rf"^{re.escape(step)}", text, re.M), text

    head, *epochs = re.split(r"^epoch \d+: ", text, flags=re.M)
    assert len(epochs) == 5, text
    epochs[-1] = epochs[-1].split("\n5. ")[0]
    changes = [[(q, sign, row) for q, sign, row in CHANGE.findall(epoch)] for epoch in epochs]
    for epoch, found in zip(epochs, changes):  # every epoch prints its changes or says there were none
        assert bool(found) != ("no query changed" in epoch), epoch
        assert re.search(r"^    cost: [\d.]+s for \d+ fact changes?: \d+ Spark jobs?, \d+ statements? on the driver, "
                         r"plans reused for \d+ of \d+ statements$", epoch, re.M), epoch
    assert text.count(WHY_SECONDS) == 1 and WHY_SECONDS in epochs[0], text  # the cost explained once

    arrive, befriend, reverse, safari, unfriend = changes
    assert arrive == [] and reverse == [], text  # a link that already held the other way changes nothing
    # neighbours read the symmetric friend rule with (< ?x ?y): each pair once, the lower id first
    assert sorted(befriend) == [("friend-triangles", "+", "Greta, Jonas, Mira"),
                                ("neighbours", "+", "Greta, Jonas, Berlin"),
                                ("neighbours", "+", "Greta, Mira, Berlin"),
                                ("neighbours", "+", "Jonas, Mira, Berlin")], text
    assert safari == [("safari-users", "+", "Greta, Hoffmann")], text
    assert sorted(unfriend) == [("friend-triangles", "-", "Greta, Jonas, Mira"),
                                ("neighbours", "-", "Jonas, Mira, Berlin")], text
    assert "(friend ?x ?y) [(< ?x ?y)]" in dict((n, t) for n, _, t, _ in QUERIES)["neighbours"]

    summary = text.split("\n5. What the engine holds now")[1]
    for name, _, _, _ in QUERIES:  # one strategy line per query ...
        assert re.search(rf"^   {name} +(binary|delta|wco) \(", summary, re.M), summary
    assert "explain()" in summary, summary  # ... says how to see the whole plan ...
    for dump in ("plan:", "pipeline", "Scan [", "Distinct (", "conjunctions:"):  # ... and dumps none
        assert dump not in text, text
    assert len(summary.strip().splitlines()) <= 20, summary  # a summary, not the 35-line plan


def test_the_server_demo_shows_two_clients_sharing_one_query(spark):
    from factflow.demo import run_server_demo

    out = io.StringIO()
    run_server_demo(DATA, out=out, spark=spark)
    text = out.getvalue()
    assert "2 clients share one dataflow" in text, text
    for who in ("alice", "bob"):
        assert re.search(rf"\[{who}\] epoch \d+: \+ \(Greta, Jonas, Berlin\)", text), text
        assert re.search(rf"\[{who}\] epoch \d+: - \(Jonas, Mira, Berlin\)", text), text
        assert not re.search(rf"\[{who}\] epoch \d+: . \(Jonas, Greta", text), text  # each pair once
    steps = re.split(r"^(?:alice|bob) says: ", text, flags=re.M)[1:]
    assert len(steps) == 5, text
    for step in steps:  # every epoch prints the clients' changes or says there were none
        assert bool(re.search(r"^    \[(alice|bob)\] epoch", step, re.M)) != ("'neighbours' did not change" in step), step
    assert "bob leaves: 1 client left" in text and "torn down" in text, text
    assert not re.search(r"\d{16}", text), text
