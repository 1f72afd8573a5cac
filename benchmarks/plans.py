"""Plans as plain data: what planning costs beside installing, and how well fingerprints tell queries apart.

LDBC SNB tiny (persons, knows, places) with the 20 queries of benchmarks/epoch_latency.py
(the five, and three variants of each with other constants, inputs or attributes). Per
query: the median wall time of ``db.plan`` (planning and nothing else: no Spark job), of
``plan.to_data()`` and of computing the fingerprint (uncached), and the median wall time
of installing it with ``db.query`` (which plans again, allocates and evaluates; closed
after each install), measured alternately so that both see the same machine load. Then
whether the 20 plans have 20 distinct fingerprints and each query, its text spaced
differently, the same one.

The machine may be shared: compare figures of one run.

    python benchmarks/plans.py [--plans 50] [--installs 3]
    python benchmarks/plans.py --quick          # smoke run: 5 plans, 1 install per query
"""

from __future__ import annotations

import argparse

from common import describe_session, engine_session, machine_facts, median, report, timed
from epoch_latency import ALL, RULES

from factflow import Engine
from factflow.io.ldbc import load_ldbc


def respaced(text: str) -> str:
    """``text`` with other spacing (the same query)."""
    return " ".join(text.replace("[", "[ ").replace("]", " ]").split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=None, help="plans timed per query (default 50, quick 5)")
    parser.add_argument("--installs", type=int, default=None, help="installs timed per query (default 3, quick 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run")
    args = parser.parse_args()
    plans = args.plans or (5 if args.quick else 50)
    installs = args.installs or (1 if args.quick else 3)
    spark = engine_session()
    print("session:", describe_session(spark), flush=True)
    db = Engine(spark=spark)
    load_ldbc(db)
    db.register(RULES)
    rows = []
    for text, inputs in ALL:
        plan_s, data_s, fingerprint_s, install_s = [], [], [], []
        for i in range(max(plans, installs)):
            seconds, plan = timed(lambda: db.plan(text, inputs=inputs))
            plan_s.append(seconds)
            data_s.append(timed(plan.to_data)[0])
            plan._fingerprint = None  # time the digest, not its cache
            fingerprint_s.append(timed(plan.fingerprint)[0])
            if i < installs:
                seconds, query = timed(lambda: db.query(text, inputs=inputs))
                install_s.append(seconds)
                assert query.plan == plan
                query.close()
        row = {"query": text[:60], "operators": len(plan.to_data()["operators"]),
               "plan_ms": round(median(plan_s) * 1000, 2), "to_data_ms": round(median(data_s) * 1000, 2),
               "fingerprint_ms": round(median(fingerprint_s) * 1000, 3),
               "install_s": round(median(install_s), 3)}
        row["plan_share_of_install"] = round(median(plan_s) / median(install_s), 5)
        rows.append(row)
        print(f"  {row}", flush=True)
    fingerprints = [db.plan(t, inputs=i).fingerprint() for t, i in ALL]
    spaced = [db.plan(respaced(t), inputs=list(i)).fingerprint() for t, i in ALL]
    db.close()
    figures = {
        "queries": len(ALL),
        "plan_ms_median_over_queries": round(median([r["plan_ms"] for r in rows]), 2),
        "plan_ms_max": max(r["plan_ms"] for r in rows),
        "to_data_ms_median_over_queries": round(median([r["to_data_ms"] for r in rows]), 2),
        "fingerprint_ms_median_over_queries": round(median([r["fingerprint_ms"] for r in rows]), 3),
        "install_s_median_over_queries": round(median([r["install_s"] for r in rows]), 3),
        "plan_share_of_install_max": max(r["plan_share_of_install"] for r in rows),
        "operators_min_max": (min(r["operators"] for r in rows), max(r["operators"] for r in rows)),
        "distinct_fingerprints": len(set(fingerprints)),
        "respaced_text_same_fingerprint": sum(a == b for a, b in zip(fingerprints, spaced)),
        "per_query": rows,
    }
    report("plans", machine_facts(spark), figures)


if __name__ == "__main__":
    main()
