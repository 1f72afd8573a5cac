"""The console with 1,000 installed queries (issue 38): pages, ops and responsiveness in Chromium.

A server process (``factflow serve --port 0``: a default engine) gets the small social
schema of the server benchmarks and a seed of 300 people; one client installs N queries
(default 1,000) and stays connected: ten ``people in a city`` queries, one per city, and
parameterised variants of four shapes over ``:person/knows`` and ``:person/name`` (a
person's friends, their names, their count, the two-hop friends), the person a constant
of the text. Then, in headless Chromium (Debian's chromium driven by selenium, as in
tests/console), it measures:

- each page's load: from navigation start (a fresh load of the page's URL) and from the
  change of the location's hash (a click on the navigation), until its table is in the DOM
  and a frame has passed (median of ``--repeats``), with the DOM's elements and table rows;
- the ops ``queries``, ``state``, ``clients`` and ``epochs`` over a socket of their own
  (median seconds from request to parsed reply, and reply bytes);
- responsiveness while epochs arrive, on the Epochs, Queries and a changing query's page:
  a writer moves a person to another city every ``--interval`` seconds (or as soon as its
  previous transaction committed: each epoch evaluates the ten city queries) for
  ``--seconds``, while the page records its long tasks (the Long Tasks API: main-thread
  tasks over 50 ms) and the lag of a 50 ms timer, and a click every second on something
  the page redraws (the Queries page's pager, an epoch's row, a plan operator) is timed
  from the click event's time stamp to the frame after its effect is in the DOM.

    python benchmarks/console.py                              # 1,000 queries, 20 s of epochs per page
    python benchmarks/console.py --queries 100 --seconds 5    # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time

from common import ROOT, median, report
from server_common import (CITIES, SCHEMA, ServerProcess, Tee, loadavg, machine_facts, seed_transaction,
                           write_output)

from factflow.client import Client
from websockets.sync.client import connect

sys.path.insert(0, os.path.join(ROOT, "tests", "console"))
from console_browser import chromium  # noqa: E402 - the tests' headless Chromium

SEED_PERSONS = 300
#: Parameterised shapes, the person a constant of the text (no two queries share a text).
SHAPES = {
    "friends": "[:find ?b :where [{p} :person/knows ?b]]",
    "friends-names": "[:find ?n :where [{p} :person/knows ?b] [?b :person/name ?n]]",
    "friend-count": "[:find (count ?b) :where [{p} :person/knows ?b]]",
    "two-hop": "[:find ?c :where [{p} :person/knows ?b] [?b :person/knows ?c]]",
}
IN_CITY = '[:find ?p ?n :where [?p :person/city "{city}"] [?p :person/name ?n]]'

#: Each page: its hash, and the selector whose presence (with the text, if any) means it has rendered.
PAGES = {
    "epochs": ("#/epochs", "tr[data-epoch]", ""),
    "queries": ("#/queries", "tr[data-query]", ""),
    "query": ("#/query/city-Paris", ".plan svg", "distinct rows"),
    "state": ("#/state", "tr[data-arrangement]", ""),
    "clients": ("#/clients", "tr[data-client]", ""),
}

#: Calls back performance.now() in the frame after ``selector`` (holding ``text`` in #main)
#: is in the DOM, after first setting the location's hash if one is given.
WAIT_RENDERED = """
const [hash, selector, text, done] = arguments;
const started = performance.now();
const ready = () => document.querySelector(selector) && document.getElementById("main").textContent.includes(text);
const check = () => (ready() ? requestAnimationFrame(() => done([started, performance.now()])) : requestAnimationFrame(check));
if (hash) location.hash = hash;
check();
"""

#: Records the page's long tasks, the lag of a 50 ms timer, and a click's time stamp.
OBSERVE = """
window.bench = {long: [], lag: 0, clickAt: null, effectAt: null};
new PerformanceObserver((list) => { for (const e of list.getEntries()) bench.long.push(e.duration); })
  .observe({type: "longtask"});
let last = performance.now();
bench.timer = setInterval(() => { const now = performance.now(); bench.lag = Math.max(bench.lag, now - last - 50); last = now; }, 50);
addEventListener("click", (e) => { bench.clickAt = e.timeStamp; }, {capture: true});
"""

#: Sets bench.effectAt to the frame after ``selector``'s text includes ``text`` (or, ``text``
#: null, after nothing matches ``selector``).
EXPECT = """
const [selector, text] = arguments;
bench.clickAt = null;
bench.effectAt = null;
const main = document.getElementById("main");
const seen = () => {
  const node = document.querySelector(selector);
  return text === null ? !node : Boolean(node && node.textContent.includes(text));
};
const observer = new MutationObserver(() => {
  if (seen()) { observer.disconnect(); requestAnimationFrame(() => { bench.effectAt = performance.now(); }); }
});
observer.observe(main, {subtree: true, childList: true, characterData: true, attributes: true});
"""

DOM = """
return {elements: document.getElementsByTagName("*").length,
        rows: document.querySelectorAll("#main tbody tr").length,
        js_heap_mib: performance.memory ? Math.round(performance.memory.usedJSHeapSize / 2 ** 20 * 10) / 10 : null};
"""


def install(url: str, count: int) -> tuple[Client, dict]:
    """Schema, seed and ``count`` queries through one client that stays connected: (the client, figures)."""
    owner = Client(url, timeout=600)
    for name, value_type, semantics in SCHEMA:
        owner.create_attribute(name, type=value_type, semantics=semantics)
    owner.transact(seed_transaction(random.Random(7), SEED_PERSONS))
    queries = [(f"city-{city}", IN_CITY.format(city=city)) for city in CITIES]
    person = 0
    while len(queries) < count:
        person += 1
        queries += [(f"{shape}-{person}", text.format(p=person)) for shape, text in SHAPES.items()]
    times = []
    started = time.perf_counter()
    for i, (name, text) in enumerate(queries[:count], 1):
        seconds = time.perf_counter()
        owner.query(text, name=name)
        times.append(time.perf_counter() - seconds)
        if i % 100 == 0:
            print(f"  {i} queries installed, {time.perf_counter() - started:.0f} s", flush=True)
    return owner, {"queries_installed": count, "install_total_s": round(time.perf_counter() - started, 1),
                   "install_median_s": round(median(times), 3), "install_max_s": round(max(times), 3)}


def ops(url: str, runs: int) -> dict:
    """Median seconds from request to parsed reply, and reply bytes, of the console's polled ops."""
    figures = {}
    with connect(url, max_size=None) as ws:
        ws.send(json.dumps({"op": "hello", "id": 0, "protocol": 1}))
        ws.recv(timeout=60)
        for op, fields in (("queries", {}), ("state", {}), ("clients", {}), ("epochs", {"limit": 1000})):
            times = []
            for i in range(runs):
                started = time.perf_counter()
                ws.send(json.dumps({"op": op, "id": i + 1, **fields}))
                frame = ws.recv(timeout=120)
                reply = json.loads(frame)
                times.append(time.perf_counter() - started)
                assert reply.get("ok"), reply
            figures[op] = {"median_s": round(median(times), 4), "max_s": round(max(times), 4),
                           "reply_kib": round(len(frame) / 1024, 1)}
    return figures


def loads(browser, console: str, repeats: int) -> dict:
    """Each page's load from navigation start and from a hash change, and its DOM's size."""
    driver = browser.driver
    figures = {}
    for page, (hash_, selector, text) in PAGES.items():
        fresh, switched = [], []
        for _ in range(repeats):
            driver.get("about:blank")
            driver.get(console + hash_)
            _, rendered = driver.execute_async_script(WAIT_RENDERED, "", selector, text)
            fresh.append(rendered / 1000)
            driver.execute_script("location.hash = '#/ask'")
            browser.wait(lambda: browser.css("#ask"), what="the ask page")
            started, rendered = driver.execute_async_script(WAIT_RENDERED, hash_, selector, text)
            switched.append((rendered - started) / 1000)
        figures[page] = {"from_navigation_s": round(median(fresh), 3), "from_hash_change_s": round(median(switched), 3),
                         "from_hash_change_max_s": round(max(switched), 3),
                         **driver.execute_script(DOM)}
    return figures


class Writer(threading.Thread):
    """Moves a person to another city (drawn from ``rng``) every ``interval`` seconds (or when
    its previous transaction committed, if later) until stopped; keeps each transaction's
    seconds and epoch."""

    def __init__(self, url: str, interval: float, rng: random.Random):
        super().__init__(daemon=True)
        self.client = Client(url, timeout=600)
        self.interval = interval
        self.rng = rng
        self.seconds: list[float] = []
        self.epochs: set[int] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.perf_counter()
            person = self.rng.randint(1, SEED_PERSONS)
            self.epochs.add(self.client.transact([[":db/add", person, ":person/city", self.rng.choice(CITIES)]]))
            self.seconds.append(time.perf_counter() - started)
            self.stopping.wait(max(0.0, self.interval - (time.perf_counter() - started)))

    def stop(self) -> None:
        self.stopping.set()
        self.join()
        self.client.close()


def clicks(page: str) -> list[tuple[str, str, str | None]]:
    """What to click on ``page`` in turn: the element's selector, then the selector and text of
    its effect (text None: the effect is that nothing matches)."""
    if page == "queries":
        return [(".pager button:last-child", ".pager span", "page 2 of"),
                (".pager button:first-child", ".pager span", "page 1 of")]
    if page == "epochs":
        return [("tr[data-epoch]", "tr.detail", ""), ("tr:has(+ tr.detail)", "tr.detail", None)]
    return [(".plan svg g.node:nth-of-type(1)", "pre.operator", "operator 0"),
            (".plan svg g.node:nth-of-type(2)", "pre.operator", "operator 1")]


def click(browser, selector: str) -> None:
    """Click the first element matching ``selector`` (again if the page redrew it meanwhile)."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        browser.css(selector)[0].click()
    except StaleElementReferenceException:
        browser.css(selector)[0].click()


def responsiveness(browser, console: str, url: str, page: str, seconds: float, interval: float,
                   rng: random.Random) -> dict:
    """Long tasks, timer lag and click latencies on ``page`` while a writer commits epochs."""
    driver = browser.driver
    hash_, selector, text = PAGES[page]
    driver.get(console + hash_)
    driver.execute_async_script(WAIT_RENDERED, "", selector, text)
    driver.execute_script(OBSERVE)
    writer = Writer(url, interval, rng)
    writer.start()
    latencies, missed, turn = [], 0, 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            target, effect, expected = clicks(page)[turn % 2]
            turn += 1
            driver.execute_script(EXPECT, effect, expected)
            try:
                click(browser, target)
                browser.wait(lambda: driver.execute_script("return bench.effectAt !== null && bench.clickAt !== null"),
                             timeout=10, what="the click's effect")
                latencies.append(driver.execute_script("return bench.effectAt - bench.clickAt") / 1000)
            except AssertionError:
                missed += 1
            time.sleep(max(0.0, started + turn - time.monotonic()))
    finally:
        writer.stop()
    observed = driver.execute_script("clearInterval(bench.timer); return bench")
    diffs = len(browser.css("tr[data-diff-epoch]"))
    long = observed["long"]
    return {"transactions": len(writer.seconds), "epochs": len(writer.epochs),
            "transaction_median_s": round(median(writer.seconds), 3) if writer.seconds else None,
            "long_tasks": len(long), "long_task_max_ms": round(max(long, default=0)),
            "long_task_total_ms": round(sum(long)), "timer_lag_max_ms": round(observed["lag"]),
            "clicks": len(latencies), "clicks_without_effect": missed,
            "click_to_frame_median_ms": round(median(latencies) * 1000) if latencies else None,
            "click_to_frame_max_ms": round(max(latencies) * 1000) if latencies else None,
            **({"diffs_shown": diffs} if page == "query" else {})}


def measure(args) -> tuple[dict, dict]:
    server = ServerProcess()
    console = "http" + server.url[2:] + "/"
    print(f"server: {server.description}, pid {server.pid}, ready in {server.startup_s:.1f} s at {console}", flush=True)
    facts = dict(machine_facts(server), clients="factflow.client.Client (threads) in the benchmark's process")
    figures = {}
    try:
        owner, figures["install"] = install(server.url, args.queries)
        print(f"installed: {figures['install']}", flush=True)
        figures["ops"] = ops(server.url, args.runs)
        print(f"ops: {figures['ops']}", flush=True)
        with chromium() as browser:
            facts["chromium"] = browser.driver.capabilities.get("browserVersion")
            figures["pages"] = loads(browser, console, args.repeats)
            print(f"pages: {figures['pages']}", flush=True)
            figures["while_epochs_arrive"] = {}
            moves = random.Random(11)
            for page in ("epochs", "queries", "query"):
                figures["while_epochs_arrive"][page] = responsiveness(browser, console, server.url, page,
                                                                      args.seconds, args.interval, moves)
                print(f"while epochs arrive, {page}: {figures['while_epochs_arrive'][page]}", flush=True)
            figures["browser_errors"] = browser.errors()
        owner.close()
    finally:
        figures["server_exit_code"] = server.stop()
        facts["load_average_end"] = loadavg()
    return figures, facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1000, help="installed queries")
    parser.add_argument("--runs", type=int, default=7, help="requests of each op")
    parser.add_argument("--repeats", type=int, default=3, help="loads of each page")
    parser.add_argument("--seconds", type=float, default=20, help="seconds of epochs on each page")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between the writer's transactions")
    parser.add_argument("--name", default="console", help="results file name")
    args = parser.parse_args()
    with Tee() as tee:
        figures, facts = measure(args)
        report(args.name, facts, figures)
    write_output(args.name, tee.text())


if __name__ == "__main__":
    main()
