"""The main demo: a social network (LDBC SNB tiny) kept live while it changes.

It loads persons, who-knows-whom and where people live, registers two rules (``friend``,
which makes the one-way ``:person/knows`` link symmetric, and ``lives-in``), installs
three queries (a join with an input, triangles of friends, friends living in the same
city), then streams five small transactions: three newcomers move to Berlin, become
friends, one records a link that already held the other way, one switches browser (a
cardinality-one overwrite), two stop being friends. Every epoch prints each query's
changes, or "no query changed", and what the epoch cost; the first epoch's cost is
explained once. It ends with the state the engine holds and one line per query saying
how it is planned (``q.explain()`` gives the whole plan).

``run_server_demo`` tells the same story over the WebSocket server, as two clients that
share one query.
"""

from __future__ import annotations

import itertools
import sys
import textwrap
import time

from pyspark.sql import SparkSession

from factflow.client import Client
from factflow.engine.engine import Engine
from factflow.engine.query import Query
from factflow.errors import FactflowError
from factflow.io.ldbc import find_ldbc, load_ldbc
from factflow.text import plural

__all__ = ["run_demo", "run_server_demo"]

RULES = """[
 [(friend ?a ?b) [?a :person/knows ?b]]
 [(friend ?a ?b) [?b :person/knows ?a]]
 [(lives-in ?p ?city) [?p :person/place ?c] [?c :place/name ?city]]
]"""

#: (name, what it finds, query text, inputs)
QUERIES = [
    ("safari-users", "people whose browser is the input ?browser, here \"Safari\"",
     "[:find ?first ?last :in $ ?browser :where [?p :person/browserUsed ?browser] "
     "[?p :person/firstName ?first] [?p :person/lastName ?last]]", ("Safari",)),
    ("friend-triangles", "three people who are all friends of each other (each triangle once: ?a < ?b < ?c)",
     "[:find ?a ?b ?c :where (friend ?a ?b) (friend ?b ?c) (friend ?a ?c) [(< ?a ?b)] [(< ?b ?c)]]", ()),
    ("neighbours", "two friends who live in the same city (each pair once: ?x < ?y)",
     "[:find ?x ?y ?city :where (friend ?x ?y) [(< ?x ?y)] (lives-in ?x ?city) (lives-in ?y ?city)]", ()),
]
CITY = "[:find ?c . :in $ ?name :where [?c :place/name ?name] [?c :place/type \"city\"]]"
FIRST_NAMES = "[:find ?p ?name :in $ [?p ...] :where [?p :person/firstName ?name]]"

#: the entity id of the first newcomer (LDBC's ids are below 10**14)
FIRST_NEWCOMER = 10**15
#: the newcomers: (first name, last name); their ids are FIRST_NEWCOMER, +1, +2 (in this order)
NEWCOMERS = [("Greta", "Hoffmann"), ("Jonas", "Keller"), ("Mira", "Schulz")]

#: printed once, after the first epoch's cost
WHY_SECONDS = """\
    Why seconds for a dozen facts? However many queries it updates, a small epoch is one or
    two SQL statements, and what they cost is Spark's fixed overhead, not the facts: Spark
    plans the epoch's statements, then runs them over the state they join with, which at
    this size stays on the driver and is read whole by each join (large state is kept in
    Spark and probed by key). A statement that reads only what the driver holds runs there,
    without a Spark job ("on the driver"). A fresh process pays most: each statement of a
    new shape is planned while the JVM's JIT compiler is still warming up on the same cores
    (installs also generate and compile code). An epoch whose statements have a shape seen
    before reuses their plans ("plans reused"). On a quiet 2-core machine a warm one-change
    epoch with five simple queries costs about 0.05 s (docs/benchmarks-summary.md); these
    queries join more state, and a machine busy with other Spark jobs shows more."""


def _stream(first_id: int, berlin: int) -> list[tuple[str, str, list]]:
    """The demo's transactions: (what it does, what to expect, operations)."""
    g, j, m = first_id, first_id + 1, first_id + 2
    (greta, greta_last), (jonas, jonas_last), (mira, mira_last) = NEWCOMERS
    return [
        (f"{greta} {greta_last}, {jonas} {jonas_last} and {mira} {mira_last} move to Berlin, all using Firefox",
         "Nobody knows them yet and none uses Safari, so no result changes.", [
             *[[":db/add", p, ":person/firstName", first] for p, (first, _) in zip((g, j, m), NEWCOMERS)],
             *[[":db/add", p, ":person/lastName", last] for p, (_, last) in zip((g, j, m), NEWCOMERS)],
             *[[":db/add", p, ":person/browserUsed", "Firefox"] for p in (g, j, m)],
             *[[":db/add", p, ":person/place", berlin] for p in (g, j, m)],
         ]),
        (f"{greta} knows {jonas}, {jonas} knows {mira}, {mira} knows {greta}",
         "Three one-way links: through the friend rule they close a triangle, and the three "
         "are pairs of friends in Berlin.", [
             [":db/add", g, ":person/knows", j], [":db/add", j, ":person/knows", m], [":db/add", m, ":person/knows", g],
         ]),
        (f"{jonas} records that he knows {greta} too",
         f"{greta} already knew {jonas}, and the friend rule holds either way: no result changes.", [
             [":db/add", j, ":person/knows", g],
         ]),
        (f"{greta} switches to Safari",
         ":person/browserUsed is cardinality one: the new value retracts Firefox, and she "
         "enters safari-users.", [
             [":db/add", g, ":person/browserUsed", "Safari"],
         ]),
        (f"{jonas} no longer knows {mira}",
         "That was their only link, so they stop being friends: the triangle and their pair go.", [
             [":db/retract", j, ":person/knows", m],
         ]),
    ]


def _city(db: Engine, name: str) -> int:
    """The entity id of the city called ``name`` in the loaded data."""
    lookup = db.query(CITY, name="city", inputs=(name,))
    city = lookup.results()
    lookup.close()
    if city is None:
        raise FactflowError(f"the loaded LDBC data has no city named {name}")
    return city


def _newcomer_names(first_id: int) -> dict[int, str]:
    return {first_id + i: first for i, (first, _) in enumerate(NEWCOMERS)}


def _first_names(db: Engine, rows: list[tuple], known: dict[int, str]) -> dict[int, str]:
    """``known`` plus the first names of the other persons among the values of ``rows``,
    by a query for just those ids (none in the demo's own stream: it names newcomers only)."""
    ids = sorted({x for row in rows for x in row if type(x) is int and x not in known})
    if not ids:
        return known
    lookup = db.query(FIRST_NAMES, name="first-names", inputs=(ids,))
    names = {**known, **{person: name for person, name in lookup.results()}}
    lookup.close()
    return names


def _show(row: tuple, names: dict[int, str]) -> str:
    return "(" + ", ".join(str(names.get(x, x)) for x in row) + ")"


def _strategy(q: Query) -> str:
    """One line: how the query's own conjunction is joined and why, and the rules' strategies."""
    plan = q.plan
    own = [f"{strategy} ({reason})" for conjunction, strategy, reason in plan.strategies
           if conjunction == "query" and strategy]
    rules = sorted({f"{conjunction.split()[1].lstrip('[(')} {strategy}" for conjunction, strategy, _ in plan.strategies
                    if conjunction.startswith("rule ") and strategy})
    line = own[0] if own else str(plan.strategy)
    return line + (f"; rules: {', '.join(rules)}" if rules else "")


def run_demo(data: str | None = None, master: str | None = None, out=sys.stdout,
             spark: SparkSession | None = None) -> Engine:
    """Run the demo, printing to ``out``, on ``spark`` or a new session; returns the (still open) engine."""
    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    started = time.perf_counter()
    say("factflow demo: a small social network kept live on Spark")
    say("")
    say("1. Start Spark (local mode) and load the data")
    db = Engine(spark=spark, master=master)
    root = find_ldbc(data)
    say(f"   LDBC SNB tiny from {root}: persons, who knows whom, places, who lives where")
    epochs = load_ldbc(db, root)
    stats = db.stats()
    say(f"   {plural(stats['shared_tuples'], 'tuple')} in the shared attribute indexes after {len(epochs)} load epochs "
        f"(one per file), {time.perf_counter() - started:.1f}s, most of it starting Spark")
    say("")
    say("2. Register two rules")
    say("   friend    (friend ?a ?b) holds when ?a knows ?b or ?b knows ?a (:person/knows is one-way in the data)")
    say("   lives-in  (lives-in ?p ?city): the name of the city person ?p lives in")
    db.register(RULES)
    say("")
    say("3. Install three queries: each is computed once over all the data (Spark jobs over the")
    say("   whole state), then kept up to date by the epochs that follow")
    queries: dict[str, Query] = {}
    for name, what, text, inputs in QUERIES:
        mark = time.perf_counter()
        q = db.query(text, name=name, inputs=inputs)
        queries[name] = q
        say(f"   {name:17s} {what}")
        say(f"   {'':17s} {plural(len(q.results()), 'row')}, installed in {time.perf_counter() - mark:.1f}s")
    say("")
    say("4. Change the data: each transaction is one epoch, after which every query reports how")
    say("   its result changed: '+1 row' entered it, '-1 row' left it (people shown by first name)")

    diffs: list[tuple[str, list]] = []  # (query, changes) of the current epoch
    for name, q in queries.items():
        q.subscribe(lambda epoch, changes, name=name: diffs.append((name, changes)))
    known = _newcomer_names(FIRST_NEWCOMER)
    for number, (title, expect, tx) in enumerate(_stream(FIRST_NEWCOMER, _city(db, "Berlin"))):
        say("")
        say(f"epoch {db.epoch + 1}: {title}")
        say(textwrap.fill(expect, 92, initial_indent="    ", subsequent_indent="    "))
        db.transact(tx)
        report = db.epoch_log[-1]
        changed = [(name, changes) for name, changes in diffs if changes]
        names = _first_names(db, [row for _, changes in changed for row, _ in changes], known)
        for name, changes in changed:
            for row, diff in sorted(changes, key=lambda c: (-c[1], repr(c[0]))):
                say(f"    {name:17s} {'+' if diff > 0 else '-'}{abs(diff)} {_show(row, names)}")
        if not changed:
            say("    no query changed")
        diffs.clear()
        say(f"    cost: {report.seconds:.2f}s for {plural(report.changes, 'fact change')}: "
            f"{plural(len(report.jobs), 'Spark job')}, {plural(len(report.on_driver), 'statement')} on the driver, "
            f"plans reused for {report.plans_reused} of {report.statements} statements")
        if number == 0:
            say(WHY_SECONDS)
    say("")
    stats = db.stats()
    say("5. What the engine holds now")
    say(f"   shared attribute indexes: {plural(stats['shared_tuples'], 'tuple')}, read by every query (more than")
    say("   after loading: the queries asked for reverse and count indexes of some attributes)")
    for name in queries:
        say(f"   {name:17s} {plural(stats['query_tuples'][name], 'tuple')} of private state, "
            f"{stats['result_tuples'][name]:,} of result")
    for rule in stats["shared_rules"].values():  # a rule's relation is kept once for all its readers
        users = rule["users"]
        say(f"   {'rule ' + '/'.join(rule['rules']):17s} {plural(rule['tuples'], 'tuple')}, kept "
            f"{'once for ' if len(users) > 1 else 'for '}{' and '.join(users)}")
    say("   How each query is joined (strategy and why):")
    for name, q in queries.items():
        say(f"   {name:17s} {_strategy(q)}")
    say("   The whole plan of a query is q.explain() (about 35 lines for friend-triangles), e.g.")
    say("     .venv/bin/python -c \"from factflow.demo import run_demo; "
        "print(run_demo().queries['friend-triangles'].explain())\"")
    say("   or `factflow explain URL NAME` for a query on a server; `factflow -v demo` logs every")
    say("   epoch's Spark jobs.")
    say(f"done in {time.perf_counter() - started:.0f}s")
    return db


def run_server_demo(data: str | None = None, master: str | None = None, out=sys.stdout,
                    spark: SparkSession | None = None) -> None:
    """The demo over the server: two clients share one query and see each other's changes."""
    from factflow.server import ServerThread

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    say("factflow demo --server: two clients share one live query")
    db = Engine(spark=spark, master=master)
    try:
        root = find_ldbc(data)
        say(f"loading LDBC SNB tiny (persons, who knows whom, places) from {root} ...")
        load_ldbc(db, root)
        berlin = _city(db, "Berlin")
        names = _newcomer_names(FIRST_NEWCOMER)
        with ServerThread(db) as server:
            say(f"serving {server.url} (in this process; `factflow serve` runs one on its own)")
            with Client(server.url) as alice, Client(server.url) as bob:
                alice.register(RULES)
                say("alice registers the rules friend (symmetric knows) and lives-in")
                name, what, text, _ = QUERIES[2]
                seen: list[str] = []  # who printed a change in the current epoch
                views = {who: client.query(text, name=name) for who, client in (("alice", alice), ("bob", bob))}
                for who, view in views.items():
                    rows = plural(len(view.results()), 'row')
                    say(f"  {who} is interested in '{name}', {what}: {rows} at epoch {view.epoch}")
                    view.subscribe(lambda epoch, changes, who=who:
                                   _print_changes(say, names, who, epoch, changes, seen))
                say(f"  status: {plural(alice.status()['queries'][name], 'client')} share one dataflow")
                for (title, _, tx), writer in zip(_stream(FIRST_NEWCOMER, berlin), itertools.cycle(("alice", "bob"))):
                    client, other = (alice, bob) if writer == "alice" else (bob, alice)
                    say(f"{writer} says: {title}")
                    client.transact(tx)  # returns once the writer's own subscriber has printed the epoch
                    other.explain(name)  # its reply comes after the epoch's diff: the other has printed too
                    if not seen:
                        say(f"    '{name}' did not change")
                    seen.clear()
                views["bob"].close()
                say(f"bob leaves: {plural(alice.status()['queries'].get(name, 0), 'client')} left on '{name}'")
                views["alice"].close()  # answered once the server has torn the dataflow down
                say(f"alice leaves: the dataflow is gone ({name in db.queries and 'still there' or 'torn down'})")
    finally:
        db.close()


def _print_changes(say, names: dict[int, str], who: str, epoch: int, changes: list, seen: list[str]) -> None:
    """Print one client's diff, the persons by first name; note in ``seen`` who printed one."""
    if changes:
        seen.append(who)
    for row, diff in sorted(changes, key=lambda c: (-c[1], repr(c[0]))):
        say(f"    [{who}] epoch {epoch}: {'+' if diff > 0 else '-'} {_show(tuple(row), names)}")
