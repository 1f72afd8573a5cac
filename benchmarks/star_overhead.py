"""The best case for join-at-a-time plans (thesis figure 8b): a star over four
cardinality-one attributes, where no strategy can beat binary joins.

Loads the LDBC SNB persons, installs the star join of four person attributes with each
strategy (one engine per strategy, so each pays for its own indexes), then runs epochs
that overwrite one attribute of a few random persons (cardinality one: each overwrite
retracts the old value). Reports install time and per-epoch latency (medians and p90,
the first two epochs excluded as warm-up) and wco's and delta's ratio to binary.

    python benchmarks/star_overhead.py [--epochs 15] [--changes 10]
"""

from __future__ import annotations

import argparse
import random

from common import machine_facts, median, percentile, report, session, timed

from factflow import Engine
from factflow.io.ldbc import load_ldbc

STAR = ("[:find ?p ?first ?last ?gender ?browser :where [?p :person/firstName ?first] "
        "[?p :person/lastName ?last] [?p :person/gender ?gender] [?p :person/browserUsed ?browser]]")
BROWSERS = ["Firefox", "Chrome", "Safari", "Opera", "Internet Explorer"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--changes", type=int, default=10)
    args = parser.parse_args()
    spark = session()
    figures: dict = {"query": STAR, "epochs": args.epochs, "changes_per_epoch": args.changes}
    for join in ("binary", "delta", "wco"):
        db = Engine(spark=spark)
        load_ldbc(db, places=False)
        ids = db.query("[:find [?p ...] :where [?p :person/firstName _]]", name="ids")
        persons = ids.results()
        ids.close()
        install, q = timed(lambda: db.query(STAR, name="star", join=join))
        rng = random.Random(7)
        times = []
        for _ in range(args.epochs):
            tx = [[":db/add", p, ":person/browserUsed", rng.choice(BROWSERS)]
                  for p in rng.sample(persons, args.changes)]
            times.append(timed(lambda: db.transact(tx))[0])
        steady = times[2:]
        figures[join] = {"install_s": round(install, 2), "median_epoch_s": round(median(steady), 3),
                         "p90_epoch_s": round(percentile(steady, 90), 3), "result": len(q.rows()),
                         "private_tuples": db.stats()["query_tuples"]["star"]}
        db.close()
    for join in ("delta", "wco"):
        figures[f"{join}_vs_binary_epoch"] = round(figures[join]["median_epoch_s"] / figures["binary"]["median_epoch_s"], 2)
        figures[f"{join}_vs_binary_install"] = round(figures[join]["install_s"] / figures["binary"]["install_s"], 2)
    report("star_overhead", machine_facts(spark), figures)


if __name__ == "__main__":
    main()
