"""The demo tells its story: newcomers in Berlin become neighbours, diffs name people."""

import io
import re
from importlib import resources

from factflow.demo import run_demo


def test_the_demo_shows_newcomers_as_neighbours_and_names_in_every_diff(spark):
    out = io.StringIO()
    db = run_demo(str(resources.files("factflow") / "data" / "ldbc-snb-tiny"), out=out, spark=spark)
    db.close()
    text = out.getvalue()
    epochs = re.split(r"^epoch \d+: ", text, flags=re.M)
    friends = epochs[2]  # "they become friends, closing a triangle"
    assert "friend-triangles  +1 (Ada, Bo, Cy)" in friends, text
    for pair in ("Ada, Bo", "Bo, Cy", "Cy, Ada"):
        assert f"neighbours        +1 ({pair}, Berlin)" in friends, text
    assert "neighbours        -1 (Bo, Cy, Berlin)" in epochs[4], text
    assert not re.search(r"\d{16}", text), text  # no raw entity ids


def test_the_server_demo_shows_two_clients_sharing_one_query(spark):
    from factflow.demo import run_server_demo

    out = io.StringIO()
    run_server_demo(str(resources.files("factflow") / "data" / "ldbc-snb-tiny"), out=out, spark=spark)
    text = out.getvalue()
    assert "2 clients share one dataflow" in text, text
    for who in ("alice", "bob"):
        assert re.search(rf"\[{who}\] epoch \d+: \+ \(Ada, Bo, Berlin\)", text), text
        assert re.search(rf"\[{who}\] epoch \d+: - \(Bo, Cy, Berlin\)", text), text
    assert "bob leaves: 1 client left" in text and "torn down" in text, text
