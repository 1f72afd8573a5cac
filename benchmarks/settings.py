"""Attribute settings and introspection: what ``index``/``support`` save, what introspection costs.

1. Memory (Facebook graph, facebook_combined.txt loaded as ``:edge`` facts as
   benchmarks/state_independence.py loads it): the same query,
   ``[:find ?b ?c :where [?a :edge ?b] [?b :edge ?c] [?a :edge ?c] [(= ?a NODE)]]``
   (the triangles at one node; cyclic, so ``auto`` picks wco where it may), installed with
   ``join="auto"`` on an engine whose ``:edge`` has each of the settings
   both/wco (the default), both/delta, forward/wco and forward/basic, then epochs of random
   edge changes (``state_independence.change_plan``). Per setting: the strategy chosen,
   tuples held (``db.stats()``: shared indexes per face, the query's private state), the
   bytes of the engine's cached/checkpointed blocks and index files (the difference of
   ``state_independence.memory_snapshot`` before the engine and after the epochs), the
   install time and the median epoch. Every setting must give the same result (checked).
2. Introspection cost (LDBC SNB tiny, the five queries and 1-change transactions of
   benchmarks/epoch_latency.py): the median ``transact`` wall time (which includes
   computing the introspection facts, done before the epoch's own timer starts) and the
   median ``EpochReport.seconds`` of three engines on one session, without
   introspection, with it, and with it plus a query reading it (total arranged tuples per
   query), each with the same transactions; their epochs are interleaved round-robin, so
   each round sees the same machine load, and the median per-round difference is given.

Medians exclude the first two epochs. The machine may be shared: compare figures of one run.

    python benchmarks/settings.py [--epochs 12] [--node 0] [--changes 20]
    python benchmarks/settings.py --quick          # smoke run: 4 epochs, 20,000 Facebook lines
"""

from __future__ import annotations

import argparse
import os
import random

from common import GRAPHS, describe_session, engine_session, machine_facts, median, report, timed
from epoch_latency import FIVE, RULES, persons_of, transaction as ldbc_transaction
from state_independence import as_facts, change_plan, memory_snapshot, transaction as edge_transaction

from factflow import Engine
from factflow.io.graphs import read_edges
from factflow.io.ldbc import load_ldbc

SETTINGS = (("both", "wco"), ("both", "delta"), ("forward", "wco"), ("forward", "basic"))
TRIANGLES_AT = "[:find ?b ?c :where [?a :edge ?b] [?b :edge ?c] [?a :edge ?c] [(= ?a {node})]]"
PER_QUERY = ("[:find ?q (sum ?t) :with ?a :where [?a :factflow.arrangement/query ?q] "
             "[?a :factflow.arrangement/tuples ?t]]")
WARM = 2
BYTES = ("cached_rdd_blocks_memory", "cached_rdd_blocks_disk", "state_dir_files")


def steady(values: list[float]) -> list[float]:
    return values[WARM:] if len(values) > WARM else values


def settings_run(spark, graph, plan: list, node: int, index: str, support: str) -> dict:
    """One engine with ``:edge`` under the given settings: load, install, epochs, figures."""
    before = memory_snapshot(spark)
    db = Engine(spark=spark)
    try:
        db.create_attribute(":edge", type="ref", index=index, support=support)
        db.transact(as_facts(graph))
        install_s, q = timed(lambda: db.query(TRIANGLES_AT.format(node=node), name="triangles-at"))
        epochs = []
        for removed, added in plan:
            epochs.append(timed(lambda: db.transact(edge_transaction(removed, added)))[0])
        stats = db.stats()
        after = memory_snapshot(spark, db.state_dir)
        faces = {name.rsplit(" ", 1)[1]: tuples for name, tuples in stats["arrangements"].items()}
        figures = {
            "strategy": q.dataflow.strategy,
            "shared_tuples_by_face": faces,
            "shared_tuples": stats["shared_tuples"],
            "query_private_tuples": stats["query_tuples"]["triangles-at"],
            "result_tuples": stats["result_tuples"]["triangles-at"],
            "bytes": {k: after[k] - before.get(k, 0) for k in BYTES},
            "install_s": round(install_s, 3),
            "epoch_median_s": round(median(steady(epochs)), 3),
        }
        figures["bytes"]["total"] = sum(figures["bytes"].values())
        result = q.rows()
    finally:
        db.close()
    print(f"  {index}/{support}: {figures['strategy']}, shared {figures['shared_tuples']:,} tuples {faces}, "
          f"private {figures['query_private_tuples']:,}, {figures['bytes']['total']:,} bytes, install "
          f"{figures['install_s']} s, epoch median {figures['epoch_median_s']} s", flush=True)
    return {"figures": figures, "result": result}


def ldbc_engine(spark, introspection: bool, reader: bool) -> Engine:
    """An engine holding the LDBC data with the five queries (and the introspection reader)."""
    db = Engine(spark=spark, introspection=introspection)
    load_ldbc(db)
    db.register(RULES)
    for i, (text, inputs) in enumerate(FIVE):
        db.query(text, name=f"q{i + 1}", inputs=inputs)
    if reader:
        db.query(PER_QUERY, name="tuples-per-query")
    return db


def introspection_part(spark, epochs: int) -> dict:
    """Measurement 2: three engines (off, on, on with a reader) on one session, their epochs
    interleaved round-robin so that each round sees the same machine load."""
    variants = {"off": (False, False), "on": (True, False), "on_with_reader": (True, True)}
    engines = {k: ldbc_engine(spark, *v) for k, v in variants.items()}
    try:
        streams = {k: (random.Random(7), persons_of(db), [10**15]) for k, db in engines.items()}
        wall: dict[str, list[float]] = {k: [] for k in engines}
        to_results: dict[str, list[float]] = {k: [] for k in engines}
        for _ in range(epochs):
            for k, db in engines.items():
                rng, persons, next_id = streams[k]
                wall[k].append(timed(lambda: db.transact(ldbc_transaction(rng, 1, persons, next_id)))[0])
                to_results[k].append(db.epoch_log[-1].seconds)
        assert engines["on_with_reader"].queries["tuples-per-query"].rows(), "the reader saw no arrangements"
    finally:
        for db in engines.values():
            db.close()
    cost: dict = {}
    for k in engines:
        cost[k] = {"transact_median_s": round(median(steady(wall[k])), 4),
                   "epoch_report_median_s": round(median(steady(to_results[k])), 4)}
        print(f"  {k}: {cost[k]}", flush=True)
    for k in ("on", "on_with_reader"):
        cost[f"{k}_transact_ratio_to_off"] = round(cost[k]["transact_median_s"] / cost["off"]["transact_median_s"], 2)
        # per round, the same load: the median of the per-round differences
        cost[f"{k}_median_extra_s"] = round(median([a - b for a, b in zip(steady(wall[k]), steady(wall["off"]))]), 4)
    return cost


def memory_part(spark, args, epochs: int) -> dict:
    """Measurement 1: the query under every setting (results checked equal)."""
    graph = read_edges(spark, os.path.join(GRAPHS, "facebook_combined.txt"))
    if args.quick:
        graph = graph.limit(20_000)
    graph = graph.cache()
    edges = {(r[0], r[1]) for r in graph.collect()}
    plan = change_plan(edges, epochs, args.changes, seed=11)
    print(f"facebook_combined: {len(edges):,} edges; triangles at node {args.node}", flush=True)
    runs = {f"{i}/{s}": settings_run(spark, graph, plan, args.node, i, s) for i, s in SETTINGS}
    graph.unpersist()
    results = [r["result"] for r in runs.values()]
    assert all(r == results[0] for r in results), "the settings gave different results"
    memory = {k: r["figures"] for k, r in runs.items()}
    default = memory["both/wco"]
    for f in memory.values():
        f["shared_tuples_vs_default"] = round(f["shared_tuples"] / default["shared_tuples"], 3)
        f["bytes_vs_default"] = round(f["bytes"]["total"] / default["bytes"]["total"], 3) \
            if default["bytes"]["total"] else None
    return {"facebook_edges": len(edges), "node": args.node, "result_rows": len(results[0]),
            "memory_by_setting": memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None, help="epochs per engine (default 12, quick 4)")
    parser.add_argument("--node", type=int, default=0, help="the node whose triangles the query finds")
    parser.add_argument("--changes", type=int, default=20, help="edge changes per Facebook epoch")
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 epochs, first 20,000 lines")
    parser.add_argument("--part", choices=("both", "memory", "introspection"), default="both",
                        help="run only one of the two measurements")
    args = parser.parse_args()
    epochs = args.epochs or (4 if args.quick else 12)
    spark = engine_session()
    print("session:", describe_session(spark), flush=True)
    figures = {"epochs": epochs, "session": describe_session(spark)}
    if args.part in ("both", "memory"):
        figures.update(memory_part(spark, args, epochs))
    if args.part in ("both", "introspection"):
        print("introspection (LDBC, 5 queries, 1-change epochs, engines interleaved):", flush=True)
        figures["introspection"] = introspection_part(spark, epochs)
    suffix = ("" if args.part == "both" else f"-{args.part}") + ("-quick" if args.quick else "")
    report("settings" + suffix, machine_facts(spark), figures)


if __name__ == "__main__":
    main()
