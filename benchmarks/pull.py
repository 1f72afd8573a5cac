"""Pull maintained incrementally versus rebuilt with PySpark: every LDBC person with their friends' names.

Loads the LDBC SNB tiny persons and who-knows-whom (``factflow.io.ldbc``), installs

    [:find (pull ?p [:db/id :person/firstName {:person/knows [:person/firstName]}])
     :where [?p :person/firstName]]

and applies epochs of small changes (a person renamed, which changes their own map and the
map of everyone who knows them, plus a friendship added and one retracted). Each epoch is
also answered the way a Spark user would without factflow: apply the changes to cached
DataFrames of names and friendships and build the same nested result again with joins,
``collect_list`` and ``struct``, collected to the driver (where the pulled maps are too).
Reports the install against one such rebuild, the medians per epoch and their same-run
ratio, and the Spark jobs per epoch; the results of both are compared at the end. Then the
pull is closed and the same kind of epochs run against the flat join query of the same
facts (person, name, friend, friend's name), to show what the pull adds to the engine's
own per-epoch cost.

    python benchmarks/pull.py [--epochs 15]
"""

from __future__ import annotations

import argparse
import random

from common import engine_session, machine_facts, median, report, timed, trivial_job_seconds
from pyspark.sql import functions as F

from factflow import Engine
from factflow.io.ldbc import find_ldbc, load_ldbc

PULL = ("[:find (pull ?p [:db/id :person/firstName {:person/knows [:person/firstName]}]) "
        ":where [?p :person/firstName]]")

#: the same facts as flat rows (a person, their name, a friend and the friend's name)
FLAT = ("[:find ?p ?n ?f ?m :where [?p :person/firstName ?n] [?p :person/knows ?f] "
        "[?f :person/firstName ?m]]")


def rebuild(names, knows) -> dict:
    """The pulled maps in plain PySpark: friends' names gathered per person, collected."""
    friends = (knows.join(names.withColumnRenamed("id", "dst").withColumnRenamed("name", "friend"), "dst")
               .groupBy("src").agg(F.collect_list(F.struct("friend")).alias("friends")))
    rows = names.join(friends, names.id == friends.src, "left").select("id", "name", "friends").collect()
    return {r.id: (r.name, sorted(f.friend for f in r.friends or [])) for r in rows}


def pulled(results: dict) -> dict:
    """The engine's result in the shape :func:`rebuild` gives."""
    out = {}
    for (value,) in results:
        person = value.to_dict()
        out[person[":db/id"]] = (person[":person/firstName"],
                                 sorted(f[":person/firstName"] for f in person.get(":person/knows", [])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    args = parser.parse_args()
    spark = engine_session()
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    db = Engine(spark=spark)
    load_s, _ = timed(lambda: load_ldbc(db, find_ldbc(), places=False))
    install_s, q = timed(lambda: db.query(PULL, name="pull"))
    rows = q.results()
    delivered = []
    q.subscribe(lambda epoch, changes: delivered.append(len(changes)))

    names_now = {r[0]: r[1] for r in db.query("[:find ?p ?n :where [?p :person/firstName ?n]]", name="names")
                 .results()}
    db.queries["names"].close()
    knows_now = {tuple(r) for r in db.query("[:find ?a ?b :where [?a :person/knows ?b]]", name="knows").results()}
    db.queries["knows"].close()
    names = spark.createDataFrame(sorted(names_now.items()), "id long, name string").repartition(partitions).cache()
    knows = spark.createDataFrame(sorted(knows_now), "src long, dst long").repartition(partitions).cache()
    first_rebuild_s, _ = timed(lambda: rebuild(names, knows))

    rng = random.Random(15)
    people = sorted(names_now)

    def changes(epoch: int):
        """One epoch's transaction (a rename, a friendship retracted and one added), applied to the copies."""
        person = rng.choice(people)
        new_name = f"{names_now[person].split('-')[0]}-{epoch}"
        gone = rng.choice(sorted(knows_now))
        added = (rng.choice(people), rng.choice(people))
        while added in knows_now:
            added = (rng.choice(people), rng.choice(people))
        names_now[person] = new_name
        knows_now.discard(gone)
        knows_now.add(added)
        tx = [[":db/add", person, ":person/firstName", new_name],
              [":db/retract", gone[0], ":person/knows", gone[1]], [":db/add", added[0], ":person/knows", added[1]]]
        return tx, person, new_name, gone, added

    inc, rec, jobs, phases = [], [], [], []
    for epoch in range(args.epochs):
        tx, person, new_name, gone, added = changes(epoch)
        seconds, _ = timed(lambda: db.transact(tx))
        inc.append(seconds)
        jobs.append(len(db.epoch_log[-1].jobs))
        phases.append(db.epoch_log[-1].phases)

        renamed = spark.createDataFrame([(person, new_name)], "id long, name string")
        retracted = spark.createDataFrame([gone], "src long, dst long")
        asserted = spark.createDataFrame([added], "src long, dst long")
        next_names = names.filter(F.col("id") != person).unionByName(renamed).repartition(partitions).cache()
        next_knows = knows.subtract(retracted).unionByName(asserted).repartition(partitions).cache()
        seconds, rebuilt = timed(lambda: rebuild(next_names, next_knows))
        names.unpersist()
        knows.unpersist()
        names, knows = next_names, next_knows
        rec.append(seconds)

    assert pulled(q.results()) == rebuilt, "the maintained pull and the PySpark rebuild differ"
    q.close()

    # The same facts as a flat join query, maintained by the same engine: what pull adds.
    flat_install_s, _ = timed(lambda: db.query(FLAT, name="flat"))
    flat = [timed(lambda: db.transact(changes(args.epochs + epoch)[0]))[0] for epoch in range(args.epochs)]
    warm = slice(2, None)
    figures = {
        "persons": len(rows), "knows": len(knows_now), "load_s": round(load_s, 2),
        "install_s": round(install_s, 2), "rebuild_once_s": round(first_rebuild_s, 2),
        "epochs": args.epochs, "changes_per_epoch": "1 rename + 1 friendship retracted + 1 added",
        "incremental_median_s": round(median(inc[warm]), 3), "incremental_max_s": round(max(inc[warm]), 3),
        "rebuild_median_s": round(median(rec[warm]), 3),
        "speedup_median": round(median(rec[warm]) / median(inc[warm]), 2),
        "spark_jobs_per_epoch_median": median(jobs[warm]),
        "phases_median_s": {k: round(median([p[k] for p in phases[warm] if k in p]), 3) for k in phases[-1]},
        "rows_delivered_per_epoch_median": median(delivered[warm]),
        "flat_join_install_s": round(flat_install_s, 2), "flat_join_median_s": round(median(flat[warm]), 3),
        "pull_over_flat_join_median": round(median(inc[warm]) / median(flat[warm]), 2),
        "trivial_spark_job_s": round(trivial_job_seconds(spark), 4),
    }
    print(db.epoch_log[-1].describe())
    db.close()
    report("pull", machine_facts(spark), figures)


if __name__ == "__main__":
    main()
