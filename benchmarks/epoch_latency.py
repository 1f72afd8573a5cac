"""Per-epoch latency of small transactions with several queries installed.

Loads the LDBC SNB persons, knows and places, installs five queries (selections, joins,
an input binding, a rule), then applies transactions of 1, 100 and 10,000 changes
(new persons, browser switches, new and removed friendships) and reports the median
epoch time per size next to a trivial Spark job on the same session, with the number of
Spark jobs an epoch ran. Target: at most 10x the trivial job for 1 change (aim: 3x).

With ``--queries 1,5,20`` the same transactions (same seed) run on a fresh engine per
number of installed queries, to show how an epoch grows with them:

- 1: the first query below (a selection join: persons with a first name using Chrome);
- 5: the five queries of the default run (``QUERIES``);
- 20: the five and three variants of each (``VARIANTS``), distinct dataflows that read
  the same attributes with other constants or inputs: the selection join with Firefox,
  Safari and Opera; the join across ``:person/knows`` on equal gender, last name and place
  instead of browser; the ``:in`` binding with Chrome, Safari and Internet Explorer; the
  place join for males and for Chrome and Firefox users instead of females; friends of
  friends restricted to Chrome users or to males, and with ``<`` instead of ``!=``
  (every rule query reads the same shared ``friend`` rule).

Reports per (queries, size): median and max epoch, Spark jobs and statements run on the
driver without a job per epoch (medians), the share of statements run from plans kept
since an earlier epoch, and the ratio of the median to a trivial Spark job. Medians
exclude the first two epochs of each size. The session is configured as a default ``factflow.Engine()`` configures its own
(``common.engine_session()``: 2 GB driver; the output says whether it differs).

    python benchmarks/epoch_latency.py [--epochs 12] [--queries 5]
    python benchmarks/epoch_latency.py --queries 1,5,20       # growth with installed queries
    python benchmarks/epoch_latency.py --quick --queries 1,5,20   # smoke run: 3 epochs per size
    python benchmarks/epoch_latency.py --no-plan-reuse   # every statement planned anew (as before)
"""

from __future__ import annotations

import argparse
import random

from common import describe_session, engine_session, machine_facts, median, report, trivial_job_seconds

from factflow import Engine, EngineConfig
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
SIZES = (1, 100, 10_000)
#: (text, inputs) of the five queries, as installed by the default run
FIVE = [(text, ("Firefox",) if ":in" in text else ()) for text in QUERIES]
#: three variants of each of the five: same shapes and attributes, other constants or inputs
VARIANTS = [
    *[(QUERIES[0].replace('"Chrome"', f'"{b}"'), ()) for b in ("Firefox", "Safari", "Opera")],
    *[("[:find ?a ?b :where [?a :person/knows ?b] " + f"[?a {attr} ?x] [?b {attr} ?x]]", ())
      for attr in (":person/gender", ":person/lastName", ":person/place")],
    *[(QUERIES[2], (b,)) for b in ("Chrome", "Safari", "Internet Explorer")],
    (QUERIES[3].replace('"female"', '"male"'), ()),
    *[(QUERIES[3].replace(':person/gender "female"', f':person/browserUsed "{b}"'), ()) for b in ("Chrome", "Firefox")],
    (QUERIES[4].replace("[(!= ?a ?c)]", '[(!= ?a ?c)] [?a :person/browserUsed "Chrome"]'), ()),
    (QUERIES[4].replace("[(!= ?a ?c)]", '[(!= ?a ?c)] [?a :person/gender "male"]'), ()),
    (QUERIES[4].replace("[(!= ?a ?c)]", "[(< ?a ?c)]"), ()),
]
ALL = FIVE + VARIANTS
assert len(ALL) == 20 and len({(t, i) for t, i in ALL}) == 20


def installed(count: int) -> list[tuple[str, tuple]]:
    """The first ``count`` queries of the five followed by their variants."""
    if count > len(ALL):
        raise SystemExit(f"at most {len(ALL)} queries are defined")
    return ALL[:count]


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


def persons_of(db: Engine) -> list[int]:
    """The ids of the persons with a first name, sorted (through a query, closed afterwards)."""
    ids = db.query("[:find [?p ...] :where [?p :person/firstName _]]", name="persons")
    persons = ids.results()
    ids.close()
    return persons


def run(spark, count: int, epochs: int, reuse_plans: bool = True) -> tuple[dict, dict]:
    """A fresh engine with ``count`` queries installed through the transactions of every size:
    per size its figures, and the phases of the last epoch."""
    db = Engine(spark=spark, config=EngineConfig(reuse_plans=reuse_plans))
    load_ldbc(db)
    db.register(RULES)
    for i, (text, inputs) in enumerate(installed(count)):
        db.query(text, name=f"q{i + 1}", inputs=inputs)
    persons = persons_of(db)
    rng = random.Random(7)
    next_id = [10**15]
    figures = {}
    for size in SIZES:
        times, jobs, on_driver, changes, reused = [], [], [], [], []
        for _ in range(epochs):
            db.transact(transaction(rng, size, persons, next_id))
            r = db.epoch_log[-1]
            times.append(r.seconds)
            jobs.append(len(r.jobs))
            on_driver.append(len(r.on_driver))
            changes.append(r.changes)
            reused.append(r.plans_reused / r.statements if r.statements else 0.0)
        warm = slice(2, None) if epochs > 2 else slice(None)
        figures[size] = {"median_s": round(median(times[warm]), 3), "max_s": round(max(times[warm]), 3),
                         "spark_jobs_median": median(jobs[warm]), "on_driver_median": median(on_driver[warm]),
                         "changes_median": median(changes[warm]),
                         "statements_from_kept_plans": round(sum(reused[warm]) / len(reused[warm]), 2)}
        print(f"  {count} queries, {size} changes: median {figures[size]['median_s']} s, max "
              f"{figures[size]['max_s']} s, {figures[size]['spark_jobs_median']} jobs and "
              f"{figures[size]['on_driver_median']} statements on the driver (medians), "
              f"{figures[size]['changes_median']} fact changes (median), "
              f"{figures[size]['statements_from_kept_plans']:.0%} of statements from kept plans", flush=True)
    phases = {k: round(v, 3) for k, v in db.epoch_log[-1].phases.items()}
    db.close()
    return figures, phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None, help="epochs per transaction size (default 12, quick 3: one after the two warm-up epochs)")
    parser.add_argument("--queries", default="5", help="numbers of installed queries, e.g. 1,5,20 (a fresh engine each)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 epochs per size")
    parser.add_argument("--no-plan-reuse", action="store_true",
                        help="engines with EngineConfig(reuse_plans=False): every statement planned anew")
    args = parser.parse_args()
    epochs = args.epochs or (3 if args.quick else 12)
    counts = [int(c) for c in args.queries.split(",")]
    spark = engine_session()
    print("session:", describe_session(spark), flush=True)
    by_count, phases = {}, {}
    for count in counts:
        by_count[count], phases[count] = run(spark, count, epochs, reuse_plans=not args.no_plan_reuse)
    trivial = trivial_job_seconds(spark)
    for count in counts:
        for size in SIZES:
            by_count[count][size]["ratio_to_trivial_job"] = round(by_count[count][size]["median_s"] / trivial, 1)

    main_count = 5 if 5 in counts else counts[0]
    main_figures = by_count[main_count]
    figures = {"queries_installed": main_count}
    for size in SIZES:
        figures[f"epoch_{size}_median_s"] = main_figures[size]["median_s"]
        figures[f"epoch_{size}_max_s"] = main_figures[size]["max_s"]
        figures[f"epoch_{size}_spark_jobs_median"] = main_figures[size]["spark_jobs_median"]
        figures[f"epoch_{size}_changes_median"] = main_figures[size]["changes_median"]
    figures["trivial_spark_job_median_s"] = round(trivial, 4)
    for size in SIZES:
        figures[f"ratio_{size}_to_trivial_job"] = main_figures[size]["ratio_to_trivial_job"]
    figures["last_epoch_phases_s"] = phases[main_count]
    figures["session"] = describe_session(spark)
    figures["reuse_plans"] = not args.no_plan_reuse
    if counts != [5]:
        figures["epochs_per_size"] = epochs
        figures["queries"] = {str(c): [{"query": t, "inputs": list(i)} for t, i in installed(c)] for c in counts}
        figures["by_queries"] = {str(c): {str(size): f for size, f in by_count[c].items()} for c in counts}
        print(f"\n{'queries':>7} {'changes':>7} {'median':>8} {'max':>8} {'jobs':>5} {'x trivial':>9}")
        for c in counts:
            for size in SIZES:
                f = by_count[c][size]
                print(f"{c:>7} {size:>7} {f['median_s']:>7.3f}s {f['max_s']:>7.3f}s {f['spark_jobs_median']:>5g} "
                      f"{f['ratio_to_trivial_job']:>8.1f}x")
    print(f"trivial Spark job {trivial:.4f} s; 1 change with {main_count} queries: "
          f"{figures['ratio_1_to_trivial_job']}x the trivial job (target <= 10x, aim 3x)")
    name = ("epoch_latency" + ("" if counts == [5] else "-q" + "-".join(map(str, counts))) + ("-quick" if args.quick else "")
            + ("-no-plan-reuse" if args.no_plan_reuse else ""))
    report(name, machine_facts(spark), figures)


if __name__ == "__main__":
    main()
