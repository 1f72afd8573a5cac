"""Installs over small state: fetched like a small epoch against checkpointed per operator.

An install over at most ``EngineConfig.local_limit`` rows of state runs its evaluation as a
small epoch does (one statement per round in one partition, fetched to the driver with
one job; :mod:`factflow.engine.install`); over more, each stateful operator is
checkpointed in Spark, a job each. This runs both on the same engine and state, in turns:
the LDBC SNB tiny persons, knows and places of ``epoch_latency.py`` with its five queries
installed (its shared ``friend`` rule among them), then ``--turns`` installs of each query
below in each form (the checkpointed form forced by building the install's context as
not small), each closed after it. Reports per query and form the median install time and
Spark jobs, and the ratio of the medians.

    python benchmarks/small_installs.py [--turns 7]
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

from common import engine_session, machine_facts, median, report
from epoch_latency import FIVE, RULES

import factflow.engine.install as install_module
from factflow import Engine
from factflow.dataflow.context import EpochContext
from factflow.engine.reports import spark_jobs
from factflow.io.ldbc import load_ldbc

#: (name, text): a selection, a three-way join, a join on a shared rule, an aggregate
INSTALLS = [
    ("selection", "[:find ?p ?n :where [?p :person/lastName ?n] [?p :person/gender \"male\"] "
                  "[?p :person/browserUsed \"Opera\"]]"),
    ("join", "[:find ?a ?b :where [?a :person/knows ?b] [?a :person/gender ?g] [?b :person/gender ?g]]"),
    ("rule", "[:find ?a ?c :where (friend ?a ?b) (friend ?b ?c) [(< ?a ?c)]]"),
    ("aggregate", "[:find ?city (count ?x) :where [?x :person/place ?c] [?c :place/name ?city]]"),
]


def _checkpointed(epoch, spark, install=False, small=False):
    """An install's context as before: never small."""
    return EpochContext(epoch, spark, install=install)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=7)
    args = parser.parse_args()
    spark = engine_session()
    figures: dict = {}
    with Engine(spark=spark) as db:
        load_ldbc(db)
        db.register(RULES)
        for i, (text, inputs) in enumerate(FIVE):
            db.query(text, name=f"q{i + 1}", inputs=inputs)
        db.wait_for_maintenance()
        figures["shared_tuples"] = db.stats()["shared_tuples"]
        runs: dict = {}
        for turn in range(args.turns):
            for form in ("fetched", "checkpointed"):
                for name, text in INSTALLS:
                    query = f"{name}-{form}-{turn}"
                    patch = mock.patch.object(install_module, "EpochContext", _checkpointed) \
                        if form == "checkpointed" else mock.patch.object(install_module, "EpochContext", EpochContext)
                    with patch:
                        began = time.perf_counter()
                        q = db.query(text, name=query)
                        seconds = time.perf_counter() - began
                    jobs = len(spark_jobs(spark, f"factflow-{db._id}-install-{query}"))
                    q.close()
                    db.wait_for_maintenance()
                    runs.setdefault((name, form), []).append((seconds, jobs))
        for name, _ in INSTALLS:
            row = {}
            for form in ("fetched", "checkpointed"):
                warm = runs[(name, form)][1:]  # the first turn plans every shape anew
                row[form] = {"median_s": round(median([s for s, _ in warm]), 3),
                             "jobs_median": median([j for _, j in warm])}
            row["ratio"] = round(row["checkpointed"]["median_s"] / row["fetched"]["median_s"], 2)
            figures[name] = row
            print(f"{name:>10}: fetched {row['fetched']['median_s']:.3f} s ({row['fetched']['jobs_median']} jobs), "
                  f"checkpointed {row['checkpointed']['median_s']:.3f} s ({row['checkpointed']['jobs_median']} jobs), "
                  f"{row['ratio']}x", flush=True)
    report("small_installs", machine_facts(spark), figures)


if __name__ == "__main__":
    main()
