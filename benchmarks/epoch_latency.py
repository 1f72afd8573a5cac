"""Per-epoch latency of small transactions with several queries installed.

Loads the LDBC SNB persons, knows and places, installs five queries (selections, joins,
an input binding, a rule), then applies transactions of 1, 100 and 10,000 changes
(new persons, browser switches, new and removed friendships) and reports the median
epoch time per size next to a trivial Spark job on the same session, with the number of
Spark jobs an epoch ran.

    python benchmarks/epoch_latency.py [--epochs 12]
"""

from __future__ import annotations

import argparse
import random

from common import machine_facts, median, report, session, trivial_job_seconds

from factflow import Engine
from factflow.io.ldbc import load_ldbc

QUERIES = [
    "[:find ?p ?first :where [?p :person/firstName ?first] [?p :person/browserUsed \"Chrome\"]]",
    "[:find ?a ?b :where [?a :person/knows ?b] [?a :person/browserUsed ?x] [?b :person/browserUsed ?x]]",
    "[:find ?first ?last :in $ ?browser :where [?p :person/browserUsed ?browser] "
    "[?p :person/firstName ?first] [?p :person/lastName ?last]]",
    "[:find ?x ?city :where [?x :person/place ?c] [?c :place/name ?city] [?x :person/gender \"female\"]]",
    "[:find ?a ?c :where (friend ?a ?b) (friend ?b ?c) [(!= ?a ?c)]]",
]
RULES = "[[(friend ?a ?b) [?a :person/knows ?b]] [(friend ?a ?b) [?b :person/knows ?a]]]"
BROWSERS = ["Chrome", "Firefox", "Safari", "Internet Explorer", "Opera"]


def transaction(rng: random.Random, size: int, persons: list[int], next_id: list[int]) -> list:
    ops = []
    for _ in range(size):
        roll = rng.random()
        if roll < 0.3:
            p = next_id[0]
            next_id[0] += 1
            persons.append(p)
            ops.append([":db/add", p, ":person/firstName", f"New{p % 1000}"])
        elif roll < 0.6:
            ops.append([":db/add", rng.choice(persons), ":person/browserUsed", rng.choice(BROWSERS)])
        else:
            ops.append([":db/add", rng.choice(persons), ":person/knows", rng.choice(persons)])
    unique = {}
    for op in ops:  # one value per entity for cardinality-one attributes, no duplicate facts
        key = (op[1], op[2]) if op[2] != ":person/knows" else (op[1], op[2], op[3])
        unique[key] = op
    return list(unique.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12, help="epochs per transaction size")
    args = parser.parse_args()
    spark = session()
    db = Engine(spark=spark)
    load_ldbc(db)
    db.register(RULES)
    for i, text in enumerate(QUERIES):
        db.query(text, name=f"q{i + 1}", inputs=("Firefox",) if ":in" in text else ())
    persons = [int(r[0]) for r in spark.sql("SELECT DISTINCT e FROM " + db.arrangement(":person/firstName").forward.read(db.epoch)).collect()]
    rng = random.Random(7)
    next_id = [10**15]
    figures = {"queries_installed": len(QUERIES)}
    for size in (1, 100, 10_000):
        times, jobs, changes = [], [], []
        for _ in range(args.epochs):
            db.transact(transaction(rng, size, persons, next_id))
            r = db.epoch_log[-1]
            times.append(r.seconds)
            jobs.append(len(r.jobs))
            changes.append(r.changes)
        warm = times[2:]
        figures[f"epoch_{size}_median_s"] = round(median(warm), 3)
        figures[f"epoch_{size}_max_s"] = round(max(warm), 3)
        figures[f"epoch_{size}_spark_jobs_median"] = median(jobs[2:])
        figures[f"epoch_{size}_changes_median"] = median(changes[2:])
    trivial = trivial_job_seconds(spark)
    figures["trivial_spark_job_median_s"] = round(trivial, 4)
    for size in (1, 100, 10_000):
        figures[f"ratio_{size}_to_trivial_job"] = round(figures[f"epoch_{size}_median_s"] / trivial, 1)
    last = db.epoch_log[-1]
    figures["last_epoch_phases_s"] = {k: round(v, 3) for k, v in last.phases.items()}
    report("epoch_latency", machine_facts(spark), figures)
    db.close()


if __name__ == "__main__":
    main()
