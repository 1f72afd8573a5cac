"""Intermediate state of join strategies (thesis figure 3): star joins of arity 2 to 7.

Loads the LDBC SNB persons (seven cardinality-one attributes each) and installs, for each
arity k, the star join of the first k person attributes on the person id with each join
strategy. Reports, per arity and strategy, the tuples held in the shared arrangements,
in the query's private intermediate state and in its result, all counted exactly by
``Engine.stats()``, and the install time.

    python benchmarks/intermediate_state.py
"""

from __future__ import annotations

from common import machine_facts, report, session, timed

from factflow import Engine
from factflow.io.ldbc import PERSON_ATTRIBUTES, load_ldbc

STRATEGIES = ("binary", "delta", "wco")


def star(arity: int) -> str:
    attributes = list(PERSON_ATTRIBUTES)[:arity]
    clauses = " ".join(f"[?p {a} ?v{i}]" for i, a in enumerate(attributes))
    return f"[:find ?p {' '.join(f'?v{i}' for i in range(arity))} :where {clauses}]"


def main() -> None:
    spark = session()
    rows = []
    for join in STRATEGIES:
        db = Engine(spark=spark)  # a fresh engine per strategy: count indexes are built by wco only
        load_ldbc(db, places=False)
        for arity in range(2, 8):
            seconds, q = timed(lambda: db.query(star(arity), name=f"star{arity}", join=join))
            stats = db.stats()
            rows.append({"strategy": join, "arity": arity, "shared": stats["shared_tuples"],
                         "private": stats["query_tuples"][q.name], "result": stats["result_tuples"][q.name],
                         "install_s": round(seconds, 2)})
            q.close()
        db.close()
    print(f"{'arity':>5} " + " ".join(f"{j + ' private':>15} {j + ' shared':>14}" for j in STRATEGIES))
    for arity in range(2, 8):
        line = [f"{arity:>5}"]
        for join in STRATEGIES:
            r = next(r for r in rows if r["strategy"] == join and r["arity"] == arity)
            line.append(f"{r['private']:>15} {r['shared']:>14}")
        print(" ".join(line))
    report("intermediate_state", machine_facts(spark), {"rows": rows})


if __name__ == "__main__":
    main()
