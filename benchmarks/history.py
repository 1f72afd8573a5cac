"""The cost of history (slack) and of event time.

Two engines in one session hold the same state (1,000 entities with a cardinality-one
``:h/score`` and 2,000 ``:h/knows`` edges) and the same two queries (a join of the edges
with the scores, and a count/sum aggregate over the scores); one with slack 0 everywhere
(today's behaviour), one with ``slack=SLACK`` (default 10) on both attributes and both
queries. The same stream of epochs of 100 changes each (70 score overwrites, 15 new and
15 retracted edges) goes to both, alternating which engine goes first. Reported: the
median epoch of each and their ratio, the tuples each holds after the stream (shared
indexes, query results, query-private state), and the median time of a read as of the
oldest epoch kept next to a read of the latest.

Event time: a third engine, ``time="event"`` with slack 0, gets the same epochs in the
same loop (the three engines take turns going first), each as ten transactions of 10
changes buffered for one time in shuffled order (``transact(tx, time=T)``, checked on the
driver and buffered), closed by ``advance_to(T + 1)`` (one epoch). Reported: the median
buffering call, and the median ``advance_to`` and its ratio to the slack-0 engine's epoch.

    python benchmarks/history.py [--epochs 30] [--slack 10]
"""

from __future__ import annotations

import argparse
import random
import time

from common import describe_session, engine_session, machine_facts, median, report, trivial_job_seconds

from factflow import Engine

ENTITIES = 1_000
EDGES = 2_000
JOIN = "[:find ?a ?s :where [?a :h/knows ?b] [?b :h/score ?s]]"
AGGREGATE = "[:find (count ?e) (sum ?s) :where [?e :h/score ?s]]"


def define(db: Engine, slack: int) -> None:
    db.create_attribute(":h/score", type="long", semantics="one", slack=slack)
    db.create_attribute(":h/knows", type="ref", slack=slack)


def initial(rng: random.Random) -> tuple[list, set]:
    edges = set()
    while len(edges) < EDGES:
        a, b = rng.randrange(ENTITIES), rng.randrange(ENTITIES)
        if a != b:
            edges.add((a, b))
    ops = [[":db/add", e, ":h/score", rng.randrange(100)] for e in range(ENTITIES)]
    ops += [[":db/add", a, ":h/knows", b] for a, b in sorted(edges)]
    return ops, edges


def changes(rng: random.Random, edges: set) -> list:
    """One epoch of 100 changes: 70 score overwrites, 15 new edges, 15 retracted ones."""
    ops = [[":db/add", e, ":h/score", rng.randrange(100, 10_000)] for e in rng.sample(range(ENTITIES), 70)]
    gone = rng.sample(sorted(edges), 15)
    edges.difference_update(gone)
    ops += [[":db/retract", a, ":h/knows", b] for a, b in gone]
    new = set()
    while len(new) < 15:
        a, b = rng.randrange(ENTITIES), rng.randrange(ENTITIES)
        if a != b and (a, b) not in edges and (a, b) not in gone:
            new.add((a, b))
    edges.update(new)
    ops += [[":db/add", a, ":h/knows", b] for a, b in sorted(new)]
    return ops


def held(db: Engine) -> dict:
    stats = db.stats()
    return {"shared": stats["shared_tuples"], "results": sum(stats["result_tuples"].values()),
            "private": sum(stats["query_tuples"].values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--slack", type=int, default=10)
    args = parser.parse_args()
    spark = engine_session()
    print("session:", describe_session(spark))
    rng = random.Random(14)
    load, edges = initial(rng)
    stream = [changes(rng, edges) for _ in range(args.epochs)]

    engines = {0: Engine(spark=spark), args.slack: Engine(spark=spark)}
    queries = {}
    for slack, db in engines.items():
        define(db, slack)
        db.transact(load)
        queries[slack] = [db.query(JOIN, slack=slack), db.query(AGGREGATE, slack=slack)]
    event = Engine(spark=spark, time="event")
    define(event, 0)
    event.transact(load, time=1)
    event.advance_to(2)
    event.query(JOIN)
    event.query(AGGREGATE)

    def close_time(t: int, ops: list) -> None:
        parts = [ops[j::10] for j in range(10)]  # ten transactions of one time; they commute
        rng.shuffle(parts)
        for part in parts:
            start = time.perf_counter()
            event.transact(part, time=t)
            buffering.append(time.perf_counter() - start)
        start = time.perf_counter()
        event.advance_to(t + 1)
        times["event"].append(time.perf_counter() - start)

    times: dict = {0: [], args.slack: [], "event": []}
    buffering: list[float] = []
    for i, ops in enumerate(stream):
        turns = [0, args.slack, "event"]
        for which in turns[i % 3:] + turns[:i % 3]:
            if which == "event":
                close_time(i + 2, ops)
                continue
            start = time.perf_counter()
            engines[which].transact(ops)
            times[which].append(time.perf_counter() - start)
    kept = engines[args.slack]
    oldest = kept.epoch - args.slack
    read_old, read_new = [], []
    for _ in range(5):
        start = time.perf_counter()
        queries[args.slack][0].rows(as_of=oldest)
        read_old.append(time.perf_counter() - start)
        start = time.perf_counter()
        queries[args.slack][0].rows()
        read_new.append(time.perf_counter() - start)
    base = median(times[0][2:])
    figures = {
        "epochs": args.epochs, "changes_per_epoch": 100, "slack": args.slack,
        "trivial_job_s": round(trivial_job_seconds(spark), 4),
        "epoch_median_s_slack0": round(base, 4),
        f"epoch_median_s_slack{args.slack}": round(median(times[args.slack][2:]), 4),
        "epoch_ratio": round(median(times[args.slack][2:]) / base, 2),
        "tuples_slack0": held(engines[0]),
        f"tuples_slack{args.slack}": held(kept),
        "read_as_of_oldest_kept_s": round(median(read_old), 4),
        "read_latest_s": round(median(read_new), 4),
        "event_buffer_median_ms": round(median(buffering) * 1000, 2),
        "event_advance_median_s": round(median(times["event"][2:]), 4),
        "event_advance_ratio_to_slack0_epoch": round(median(times["event"][2:]) / base, 2),
    }
    for db in [*engines.values(), event]:
        db.close()
    report("history", machine_facts(spark), figures)
    spark.stop()


if __name__ == "__main__":
    main()
