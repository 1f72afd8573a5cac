"""The console behind tokens: a server with an admin token and tenants (one server and one
browser for the module).

Without a token nothing but the login page is served, and the WebSocket refuses every op;
a login with a token gives a session cookie that admits the page and, from the same origin
only, its WebSocket. In the browser an admin logs in and sees every page; a tenant sees
only the published queries it may join and its own rows, and no admin page.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from factflow import Engine
from factflow.client import Client
from factflow.server import ServerThread
from factflow.server.tenants import Tenants
from console_browser import ask, http_get

ADMIN = "admin-secret"
TOKENS = {"acme": "acme-secret", "globex": "globex-secret"}
WATCH = "[:find ?t ?d ?s :where [?t :param.watch/device ?d] [?d :device/speed ?s]]"


@pytest.fixture(scope="module")
def server(spark, tmp_path_factory):
    path = tmp_path_factory.mktemp("console-tenants") / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"name": name, "token_sha256": hashlib.sha256(token.encode()).hexdigest(),
                                             "role": "tenant"} for name, token in TOKENS.items()]}))
    db = Engine(spark=spark)
    with ServerThread(db, token=ADMIN, tenants=Tenants.load(str(path))) as running:
        with Client(running.url, token=ADMIN, timeout=120) as admin, \
                Client(running.url, token=TOKENS["acme"], timeout=120) as acme, \
                Client(running.url, token=TOKENS["globex"], timeout=120) as globex:
            admin.create_attribute(":device/speed", type="long", semantics="one")
            admin.create_attribute(":param.watch/device", type="ref", parameter=True)
            admin.publish("watch", WATCH, tenant="?t")
            admin.query("[:find ?d :where [?d :device/speed _]]", name="devices")
            admin.transact([[":db/add", d, ":device/speed", s] for d, s in [(101, 11), (102, 22), (103, 33)]])
            acme.transact([[":db/add", acme.entity, ":param.watch/device", 101]])
            globex.transact([[":db/add", globex.entity, ":param.watch/device", 102]])
            running.held = {"acme": acme.query(name="watch"), "globex": globex.query(name="watch")}
            running.ids = {"acme": acme.client_id, "globex": globex.client_id}
            yield running
    db.close()


def login(server, token: str) -> str:
    """A session cookie (``name=value``) for ``token``."""
    status, headers, _ = http_get(server.console_url + "login", {"Authorization": f"Bearer {token}"})
    assert status == 204, status
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    return cookie.split(";")[0]


def test_no_page_or_data_without_a_token(server):
    status, _, body = http_get(server.console_url)  # the login page
    assert status == 200 and b"login.js" in body and b"console.js" not in body
    for path in ("static/console.js", "static/index.html", "static/vendor/dagre.min.js"):
        assert http_get(server.console_url + path)[0] == 401, path
    assert http_get(server.console_url + "static/login.js")[0] == 200
    assert http_get(server.console_url + "login", {"Authorization": "Bearer forged"})[0] == 401
    assert b"console.js" not in http_get(server.console_url, {"Cookie": f"{server.server.pages.cookie}=forged"})[2]
    for op in ("status", "epochs", "queries", "state", "clients"):
        assert ask(server.url, op)["error"]["category"] == "forbidden", op


def test_a_session_cookie_admits_the_page_and_a_same_origin_socket_only(server):
    cookie = login(server, ADMIN)
    status, _, body = http_get(server.console_url, {"Cookie": cookie})
    assert status == 200 and b"console.js" in body
    assert http_get(server.console_url + "static/console.js", {"Cookie": cookie})[0] == 200
    origin = server.console_url.rstrip("/")
    assert ask(server.url, "state", {"Cookie": cookie, "Origin": origin})["ok"]
    assert ask(server.url, "state", {"Cookie": cookie, "Origin": "http://evil.example"})["error"]["category"] \
        == "forbidden"
    status, _, body = http_get(server.console_url + "logout", {"Cookie": cookie})  # redirected to /
    assert status == 200 and b"login.js" in body
    assert b"console.js" not in http_get(server.console_url, {"Cookie": cookie})[2]
    assert http_get(server.console_url + "static/console.js", {"Cookie": cookie})[0] == 401


def test_a_tenant_reads_only_its_own(server):
    cookie = login(server, TOKENS["acme"])
    headers = {"Cookie": cookie, "Origin": server.console_url.rstrip("/")}
    queries = ask(server.url, "queries", headers)["result"]["queries"]
    assert queries == [{"name": "watch", "tenant_routed": True, "interested": [server.ids["acme"]]}]
    for op in ("epochs", "state", "clients"):
        assert ask(server.url, op, headers)["error"]["category"] == "forbidden", op
    assert ask(server.url, "plan", headers, name="watch")["error"]["category"] == "forbidden"
    assert ask(server.url, "query", headers, query="[:find ?d :where [?d :device/speed _]]")["error"]["category"] \
        == "forbidden"


def test_in_the_browser_an_admin_logs_in_and_a_tenant_sees_only_its_own(server, browser):
    browser.open(server.console_url)
    field = browser.wait(lambda: browser.css("#token"), what="the login page")[0]
    assert not browser.css("#main")
    browser.screenshot("login")
    field.send_keys("wrong")
    browser.css("button[type=submit]")[0].click()
    browser.wait(lambda: browser.text("#login-error"), what="the refusal")
    assert [e for e in browser.errors() if "/login" not in e] == []  # the refused login's 401 only
    field.clear()
    field.send_keys(ADMIN)
    browser.css("button[type=submit]")[0].click()
    browser.wait(lambda: "admin" in browser.text("#status"), what="the admin's console")
    browser.driver.execute_script("location.hash = '#/clients'")
    browser.wait(lambda: browser.css(f'tr[data-client="{server.ids["globex"]}"]'), what="the clients")
    assert "globex (tenant)" in browser.text(f'tr[data-client="{server.ids["globex"]}"]')
    browser.wait(lambda: "acme" in browser.text("section"), what="the tenants table")
    browser.screenshot("clients-tenants")
    browser.open(server.console_url + "logout")
    field = browser.wait(lambda: browser.css("#token"), what="the login page again")[0]
    field.send_keys(TOKENS["acme"])
    browser.css("button[type=submit]")[0].click()
    browser.wait(lambda: "tenant acme" in browser.text("#status"), what="the tenant's console")
    browser.wait(lambda: browser.css('tr[data-query="watch"]'), what="the published queries")
    assert [row.get_attribute("data-query") for row in browser.css("tr[data-query]")] == ["watch"]
    assert [a.text for a in browser.css("#nav a") if a.is_displayed()] == ["Queries"]
    browser.driver.execute_script("location.hash = '#/state'")  # an admin page: the tenant gets its queries
    browser.wait(lambda: browser.css('tr[data-query="watch"]'), what="the queries page")
    browser.driver.execute_script("location.hash = '#/query/watch'")
    browser.wait(lambda: "1 distinct rows" in browser.text("#main"), what="acme's rows")
    assert "101" in browser.text("#main table") and "102" not in browser.text("#main table")
    assert "plans are shown to admins" in browser.text("#main")
    browser.screenshot("tenant-query")
    assert browser.errors() == []
