"""The main demo: a social network (LDBC SNB) kept live while it changes.

It loads persons, who-knows-whom and where people live, installs a few queries (a join
with an input, a rule-based symmetric friendship, triangles of friends, friends living
in the same city), then streams changes: new people and friendships, a browser switch
(a cardinality-one overwrite), a removed friendship. After every epoch it prints the
changes each query reports, and at the end the state the engine holds and what the
epochs cost.
"""

from __future__ import annotations

import sys
import time

from pyspark.sql import SparkSession

from factflow.client import Client
from factflow.engine.engine import Engine
from factflow.errors import FactflowError
from factflow.io.ldbc import find_ldbc, load_ldbc

__all__ = ["run_demo", "run_server_demo"]

RULES = """[
 [(friend ?a ?b) [?a :person/knows ?b]]
 [(friend ?a ?b) [?b :person/knows ?a]]
 [(lives-in ?p ?city) [?p :person/place ?c] [?c :place/name ?city]]
]"""

QUERIES = [
    ("safari-users", "who uses a given browser (an input binding)",
     "[:find ?first ?last :in $ ?browser :where [?p :person/browserUsed ?browser] "
     "[?p :person/firstName ?first] [?p :person/lastName ?last]]", ("Safari",)),
    ("friend-triangles", "triangles of friends (a cyclic join over a rule)",
     "[:find ?a ?b ?c :where (friend ?a ?b) (friend ?b ?c) (friend ?a ?c) [(< ?a ?b)] [(< ?b ?c)]]", ()),
    ("neighbours", "friends who live in the same city",
     "[:find ?x ?y ?city :where [?x :person/knows ?y] (lives-in ?x ?city) (lives-in ?y ?city)]", ()),
]
CITY = "[:find ?c . :in $ ?name :where [?c :place/name ?name] [?c :place/type \"city\"]]"
FIRST_NAMES = "[:find ?p ?name :in $ [?p ...] :where [?p :person/firstName ?name]]"


def _stream(first_id: int, berlin: int) -> list[tuple[str, list]]:
    a, b, c = first_id, first_id + 1, first_id + 2
    return [
        ("three new people arrive in Berlin", [
            *[[":db/add", p, ":person/firstName", n] for p, n in ((a, "Ada"), (b, "Bo"), (c, "Cy"))],
            *[[":db/add", p, ":person/lastName", "Newcomer"] for p in (a, b, c)],
            *[[":db/add", p, ":person/browserUsed", "Firefox"] for p in (a, b, c)],
            *[[":db/add", p, ":person/place", berlin] for p in (a, b, c)],
        ]),
        ("they become friends, closing a triangle", [
            [":db/add", a, ":person/knows", b], [":db/add", b, ":person/knows", c], [":db/add", c, ":person/knows", a],
        ]),
        ("Ada switches to Safari (cardinality one: the old browser is retracted)", [
            [":db/add", a, ":person/browserUsed", "Safari"],
        ]),
        ("Bo and Cy stop being friends", [
            [":db/retract", b, ":person/knows", c],
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


def _first_names(db: Engine, rows: list[tuple]) -> dict[int, str]:
    """The first names of the persons among the values of ``rows``, by a query for just those ids."""
    ids = sorted({x for row in rows for x in row if type(x) is int})
    if not ids:
        return {}
    lookup = db.query(FIRST_NAMES, name="first-names", inputs=(ids,))
    names = {person: name for person, name in lookup.results()}
    lookup.close()
    return names


def _show(row: tuple, names: dict[int, str]) -> str:
    return "(" + ", ".join(str(names.get(x, x)) for x in row) + ")"


def run_demo(data: str | None = None, master: str | None = None, out=sys.stdout,
             spark: SparkSession | None = None) -> Engine:
    """Run the demo, printing to ``out``, on ``spark`` or a new session; returns the (still open) engine."""
    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    say("factflow demo: a live social network on Spark")
    started = time.perf_counter()
    db = Engine(spark=spark, master=master)
    root = find_ldbc(data)
    say(f"loading LDBC SNB persons, knows and places from {root} ...")
    load_ldbc(db, root)
    stats = db.stats()
    say(f"  {stats['shared_tuples']} facts arranged at epoch {db.epoch} ({time.perf_counter() - started:.1f}s incl. Spark start)")
    db.register(RULES)
    say("registered rules: friend (symmetric knows), lives-in")
    queries = {}
    for name, what, text, inputs in QUERIES:
        mark = time.perf_counter()
        q = db.query(text, name=name, inputs=inputs)
        queries[name] = q
        say(f"  installed {name}: {what}: {len(q.results())} rows ({time.perf_counter() - mark:.2f}s)")

    diffs: list[tuple[str, list]] = []  # (query, changes) of the current epoch
    for name, q in queries.items():
        q.subscribe(lambda epoch, changes, name=name: diffs.append((name, changes)))
    for title, tx in _stream(10**15, _city(db, "Berlin")):
        say(f"epoch {db.epoch + 1}: {title}")
        db.transact(tx)
        report = db.epoch_log[-1]
        names = _first_names(db, [row for _, changes in diffs for row, _ in changes])
        for name, changes in diffs:
            for row, diff in sorted(changes, key=lambda c: (-c[1], repr(c[0]))):
                say(f"    {name:17s} {'+' if diff > 0 else '-'}{abs(diff)} {_show(row, names)}")
        diffs.clear()
        say(f"    ({report.changes} changes, {len(report.jobs)} Spark jobs, {report.seconds:.2f}s)")
    stats = db.stats()
    say("state held in arrangements:")
    say(f"  shared (attribute indexes): {stats['shared_tuples']} tuples")
    for name in queries:
        say(f"  {name}: {stats['query_tuples'][name]} private + {stats['result_tuples'][name]} result tuples")
    say(queries["friend-triangles"].explain())
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
        say(f"loading LDBC SNB persons, knows and places from {root} ...")
        load_ldbc(db, root)
        berlin = _city(db, "Berlin")
        first = 10**15
        names = {first: "Ada", first + 1: "Bo", first + 2: "Cy"}  # the newcomers of _stream
        with ServerThread(db) as server:
            say(f"serving {server.url} (in this process; `factflow serve` runs one on its own)")
            with Client(server.url) as alice, Client(server.url) as bob:
                alice.register(RULES)
                _, _, text, _ = QUERIES[2]
                views = {who: client.query(text, name="neighbours") for who, client in (("alice", alice), ("bob", bob))}
                for who, view in views.items():
                    say(f"  {who} is interested in 'neighbours' (friends living in the same city): "
                        f"{len(view.results())} rows at epoch {view.epoch}")
                    view.subscribe(lambda epoch, changes, who=who: _print_changes(say, names, who, epoch, changes))
                say(f"  status: {alice.status()['queries']['neighbours']} clients share one dataflow")
                for (title, tx), writer in zip(_stream(first, berlin), ("alice", "bob", "alice", "bob")):
                    client, other = (alice, bob) if writer == "alice" else (bob, alice)
                    say(f"{writer} says: {title}")
                    client.transact(tx)  # returns once the writer's own subscriber has printed the epoch
                    other.explain("neighbours")  # its reply comes after the epoch's diff: the other has printed too
                views["bob"].close()
                say(f"bob leaves: {alice.status()['queries'].get('neighbours', 0)} client left on 'neighbours'")
                views["alice"].close()  # answered once the server has torn the dataflow down
                say(f"alice leaves: the dataflow is gone ({'neighbours' in db.queries and 'still there' or 'torn down'})")
    finally:
        db.close()


def _print_changes(say, names: dict[int, str], who: str, epoch: int, changes: list) -> None:
    """Print one client's diff, the persons by first name."""
    for row, diff in changes:
        say(f"    [{who}] epoch {epoch}: {'+' if diff > 0 else '-'} {_show(tuple(row), names)}")
