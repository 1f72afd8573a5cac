"""The console on a server without tokens: its read-only ops and pages over real sockets,
then in headless Chromium (one server and one browser for the module).

A client installs four queries on a small graph of people (names; triangles of friends
once per join strategy) and stays connected; the browser checks every page loads without
console errors, that another client's transaction reaches the epochs table and an open
query's diffs within 2 s, the plan graph of each strategy, and the Ask page's table and
marked error. Screenshots of every page go to test-artifacts/console/.
"""

from __future__ import annotations

import time

import pytest

import pandas as pd

from factflow import Engine
from factflow.client import Client
from factflow.server import ServerThread
from console_browser import ask, http_get

TRIANGLES = "[:find ?a ?b ?c :where [?a :p/knows ?b] [?b :p/knows ?c] [?a :p/knows ?c]]"
STRATEGIES = ("binary", "delta", "wco")


@pytest.fixture(scope="module")
def server(spark):
    db = Engine(spark=spark)
    with ServerThread(db) as running:
        with Client(running.url, timeout=120) as owner:
            owner.create_attribute(":p/name", type="string", semantics="one")
            owner.create_attribute(":p/knows", type="ref")
            owner.transact([[":db/add", e, ":p/name", name] for e, name in enumerate(["Ann", "Bo", "Cy", "Di"], 1)]
                           + [[":db/add", a, ":p/knows", b] for a, b in [(1, 2), (2, 3), (1, 3), (3, 4)]])
            owner.query("[:find ?n :where [_ :p/name ?n]]", name="names")
            for join in STRATEGIES:
                owner.query(TRIANGLES, name=f"tri-{join}", join=join)
            yield running
    db.close()


def page(browser, server, hash_: str) -> None:
    """Show a page of the console (loading it first if another page is not open yet)."""
    if not browser.driver.current_url.startswith(server.console_url):
        browser.open(server.console_url)
        browser.wait(lambda: browser.text("#status").startswith("epoch"), what="the console to connect")
    browser.driver.execute_script("location.hash = arguments[0]", hash_)


# ------------------------------------------------------------------ the ops, without a browser
def test_epochs_report_time_jobs_and_phases(server):
    with Client(server.url, timeout=120) as c:
        epoch = c.transact([[":db/add", 5, ":p/name", "Eve"]])
        reply = c.request("epochs", since=epoch - 1)
        assert [r["epoch"] for r in reply["epochs"]] == [epoch]
        report = reply["epochs"][0]
        assert abs(report["time"] - time.time()) < 60 and report["seconds"] > 0 and report["changes"] == 1
        # a small epoch over state the driver holds: its statements ran there, described as jobs
        assert report["on_driver"] and {"description", "seconds", "rows_read"} <= set(report["on_driver"][0])
        assert all(f"epoch {epoch}" in r["description"] for r in report["on_driver"])
        assert all({"id", "description", "tasks", "seconds", "rows_read"} <= set(j) for j in report["jobs"])
        assert report["changed"] == 1  # names changed, the triangles did not
        assert len(c.request("epochs", limit=1)["epochs"]) == 1


def test_queries_list_names_clients_rows_and_join_strategies(server):
    with Client(server.url, timeout=120) as c:
        queries = {q["name"]: q for q in c.request("queries")["queries"]}
    assert set(queries) >= {"names", "tri-binary", "tri-delta", "tri-wco"}
    for join in STRATEGIES:
        q = queries[f"tri-{join}"]
        assert q["joins"] == [["query", join]] and q["strategy"] == join and q["join"] == join
        assert q["clients"] == 1 and len(q["interested"]) == 1 and q["text"] == TRIANGLES
        assert q["rows"] == 1 and q["installed_at"] >= 1 and q["installed_time"] <= time.time()
    assert queries["names"]["last_change"] is not None


def test_plan_state_and_clients(server):
    with Client(server.url, timeout=120) as c:
        plan = c.request("plan", name="tri-wco")
        assert any(op["op"] == "DeltaJoin" and op["strategy"] == "wco" for op in plan["plan"]["operators"])
        assert plan["strategies"][0][:2] == ["query", "wco"] and "tri-wco" in plan["explain"]
        with pytest.raises(Exception, match="no query named"):
            c.request("plan", name="nope")
        arrangements = {a["name"]: a for a in c.request("state")["arrangements"]}
        knows = arrangements[":p/knows forward"]
        assert knows["kind"] == "attribute" and knows["tuples"] == 4 and knows["driver_bytes"] > 0
        assert set(knows["readers"]) >= {"tri-binary", "tri-delta", "tri-wco"}  # the sharing
        assert arrangements["tri-binary: result"]["readers"] == ["tri-binary"]
        clients = c.request("clients")["clients"]
        mine = next(x for x in clients if x["client"] == c.client_id)
        assert mine["queries"] == [] and mine["waiting_rows"] == 0 and mine["address"].startswith("127.0.0.1:")
        owner = next(x for x in clients if x["queries"])
        assert set(owner["queries"]) == {"names", "tri-binary", "tri-delta", "tri-wco"}


def test_state_counts_the_bytes_of_batches_stored_in_spark_and_their_index_files(server):
    db = server.server.engine
    db.create_attribute(":huge/n", type="long")
    rows = db.config.local_limit + 1  # one batch too large for the driver
    db.transact(pd.DataFrame({"e": range(rows), "a": ":huge/n", "v": range(rows)}))
    with Client(server.url, timeout=120) as c:
        deadline = time.monotonic() + 60
        while True:  # its index files are written by the maintenance after the epoch
            forward = next(a for a in c.request("state")["arrangements"] if a["name"] == ":huge/n forward")
            if forward["index_bytes"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert forward["tuples"] == rows and forward["driver_batches"] < forward["batches"]
    assert forward["spark_memory_bytes"] + forward["spark_disk_bytes"] > 0 and forward["index_bytes"] > 0
    assert forward["readers"] == []


def test_pages_are_served_over_http_on_the_websocket_port(server):
    status, headers, body = http_get(server.console_url)
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"console.js" in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for path in ("static/console.js", "static/vendor/uPlot.iife.min.js", "static/vendor/dagre.min.js",
                 "static/vendor/LICENSE.uPlot.txt"):
        assert http_get(server.console_url + path)[0] == 200, path
    assert http_get(server.console_url + "static/nope.js")[0] == 404
    assert http_get(server.console_url + "etc/passwd")[0] == 404
    assert ask(server.url, "status")["ok"]  # the WebSocket on the same port


# ------------------------------------------------------------------ in the browser
def test_every_page_loads_without_console_errors(server, browser):
    page(browser, server, "#/epochs")
    browser.wait(lambda: browser.css("tr[data-epoch]"), what="the epochs table")
    browser.wait(lambda: browser.css(".chart .u-over"), what="the charts")
    browser.screenshot("epochs")
    page(browser, server, "#/queries")
    browser.wait(lambda: browser.css('tr[data-query="tri-wco"]'), what="the queries table")
    browser.screenshot("queries")
    page(browser, server, "#/state")
    browser.wait(lambda: "shared by" in browser.text('tr[data-arrangement=":p/knows forward"]'), what="sharing")
    browser.screenshot("state")
    page(browser, server, "#/clients")
    browser.wait(lambda: "(this console)" in browser.text("table"), what="the clients table")
    browser.screenshot("clients")
    page(browser, server, "#/ask")
    browser.wait(lambda: browser.css("#ask"), what="the ask form")
    assert browser.errors() == []


def test_another_clients_transaction_reaches_the_epochs_table_and_an_open_querys_diffs_within_2s(server, browser):
    page(browser, server, "#/epochs")
    browser.wait(lambda: browser.css("tr[data-epoch]"), what="the epochs table")
    with Client(server.url, timeout=120) as writer:
        epoch = writer.transact([[":db/add", 6, ":p/name", "Fay"]])
        committed = time.monotonic()
        browser.wait(lambda: browser.css(f'tr[data-epoch="{epoch}"]'), timeout=2, what=f"epoch {epoch} in the table")
        assert time.monotonic() - committed < 2
        page(browser, server, "#/query/names")
        browser.wait(lambda: "Fay" in browser.text(".columns section:nth-child(2) table"), what="the current rows")
        epoch = writer.transact([[":db/add", 7, ":p/name", "Gus"]])
        committed = time.monotonic()
        browser.wait(lambda: browser.css(f'tr[data-diff-epoch="{epoch}"]'), timeout=2, what=f"the diff of {epoch}")
        assert time.monotonic() - committed < 2
        assert "+Gus" in browser.text(f'tr[data-diff-epoch="{epoch}"]')
        browser.wait(lambda: "Gus" in browser.text(".columns section:nth-child(2) table"), timeout=2, what="Gus")
    browser.screenshot("query")
    assert browser.errors() == []


@pytest.mark.parametrize("join", STRATEGIES)
def test_the_plan_graph_renders_for_each_join_strategy(server, browser, join):
    page(browser, server, f"#/query/tri-{join}")
    svg = browser.wait(lambda: browser.css(".plan svg"), what="the plan graph")[0]
    nodes = browser.css(".plan svg g.node")
    assert len(nodes) == int(svg.get_attribute("data-operators")) > 3
    assert browser.css(".plan svg path.edge")
    assert browser.css(".plan svg g.node.Join" if join == "binary" else ".plan svg g.node.DeltaJoin")
    assert f"({join})" in browser.text(".plan") or join == "binary"
    browser.wait(lambda: "1 distinct rows" in browser.text(".columns section:nth-child(2)"), what="the triangle")
    browser.screenshot(f"plan-{join}")
    nodes[0].click()
    assert "operator 0" in browser.text("pre.mono")
    assert browser.errors() == []


def test_ask_shows_a_table_or_the_error_with_its_item_marked(server, browser):
    page(browser, server, "#/ask")
    box = browser.wait(lambda: browser.css("textarea"), what="the ask form")[0]
    box.clear()
    box.send_keys("[:find ?a ?b :where [?a :p/knows ?b]]")
    browser.css("#ask")[0].click()
    browser.wait(lambda: browser.text("#ask-summary").startswith("4 rows"), what="the rows")
    assert len(browser.css("#main table tbody tr")) == 4
    browser.screenshot("ask")
    box.clear()
    box.send_keys("[:find ?n :where [?p :p/nme ?n]]")
    browser.css("#ask")[0].click()
    browser.wait(lambda: browser.css("#ask-error"), what="the error")
    assert "unknown attribute :p/nme" in browser.text("#ask-error")
    assert browser.text("#ask-mark") == "[?p :p/nme ?n]"
    box.clear()
    box.send_keys("[:find ?n :where [?p :p/name ?n] [(> ?z 1)]]")
    browser.css("#ask")[0].click()
    browser.wait(lambda: "?z" in browser.text("#ask-error"), what="the unbound variable")
    assert browser.text("#ask-mark") == "[(> ?z 1)]"
    browser.screenshot("ask-error")
    assert browser.errors() == []


def test_a_10000_row_result_is_paged(server, browser):
    """A large result reaches the page in one diff and is shown a page of 100 rows at a time."""
    db = server.server.engine
    db.create_attribute(":big/n", type="long")
    with Client(server.url, timeout=120) as owner:
        owner.query("[:find ?e ?n :where [?e :big/n ?n]]", name="big")
        db.transact(pd.DataFrame({"e": range(10_000, 20_000), "a": ":big/n", "v": range(10_000)}))
        page(browser, server, "#/query/big")
        started = time.monotonic()
        browser.wait(lambda: "10,000 distinct rows" in browser.text("#main"), what="10,000 rows")
        assert time.monotonic() - started < 5
        assert browser.driver.execute_script(
            "return document.querySelector('.columns section:nth-child(2) .table').querySelectorAll('tbody tr').length") \
            == 100
        assert "page 1 of 100" in browser.text(".pager")
        browser.css(".pager button")[1].click()
        assert "page 2 of 100" in browser.text(".pager")
    assert browser.errors() == []
