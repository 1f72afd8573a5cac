"""Server throughput: transactions committed per second with 1, 10 and 50 concurrent clients.

A server process (as a user starts it: ``serve(port=0)``, a default engine) gets a small
social schema (``:person/name`` string one, ``:person/knows`` ref set, ``:person/city``
string one), a seed of 300 people with names, cities and three friends each, and three
queries installed by one observer connection that stays interested and reads their diffs
throughout: friends' names (a join), people per city (a count aggregate) and two-hop
``:person/knows``. Then, per level, that many writer clients each send single-fact
transactions as fast as their replies come back (one in flight per client) for a fixed
duration: a name, a city or a friendship of the writer's own new people, in turn (no two
writers touch one entity, so no transaction has to wait for another's epoch).

Reports per level: transactions committed per second (replies received within the
window), epochs per second (distinct epochs in those replies), mean transactions per epoch
(and the median and largest epoch), and p50/p99 send-to-reply latency; and the ratio
tx/s(50) / tx/s(1), measured in the same run on the same server (target of issue 12: at
least 25x). One server serves every level in turn, after a warm-up at the largest level.
With ``--rounds R`` the levels run R times interleaved (1, 10, 50, 1, 10, 50, ...) and
the per-level figures are medians over rounds.

For what the server adds, after the server has stopped the same run applies the same
kind of single-fact transactions to a default ``factflow.Engine()`` in this process (same
schema, seed and queries, each with a subscriber) and reports the median ``transact``
time and its phases after 10 warm-up epochs (``--baseline-epochs``, 0 to skip): the
floor of one client's latency. It runs minutes after the levels, on a fresh JVM, so its
ratio to the 1-client latency is context, not a measurement of the server's overhead.

The clients are coroutines in this one Python process (one event loop): their JSON work
and scheduling are inside every latency measured here.

    python benchmarks/server_throughput.py [--levels 1,10,50] [--duration 20] [--warmup 10] [--rounds 1]
    python benchmarks/server_throughput.py --writers-interested   # writers also interested in the 3 queries
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter

from common import median, percentile, report
from server_common import (QUERIES, Client, ServerProcess, Tee, create_schema, memory, run_against_server,
                           seed_transaction, write_output)

INSTALLED = ["friends-names", "people-per-city", "two-hop"]
SEED_PERSONS = 300


class Writer:
    """One client sending single-fact transactions back to back about its own new people."""

    def __init__(self, index: int, seed_persons: int, rng: random.Random):
        self.index = index
        self.rng = rng
        self.seed_persons = seed_persons
        self.next_entity = 10**9 * (index + 1)
        self.current = None
        self.step = 0

    def next_fact(self) -> list:
        kind = self.step % 3
        self.step += 1
        if kind == 0 or self.current is None:
            self.current = self.next_entity
            self.next_entity += 1
            return [":db/add", self.current, ":person/name", f"w{self.index}-{self.current % 10**9}"]
        if kind == 1:
            return [":db/add", self.current, ":person/city", self.rng.choice(["Paris", "Lyon", "Berlin", "Oslo"])]
        return [":db/add", self.current, ":person/knows", self.rng.randint(1, self.seed_persons)]


async def run_level(url: str, writers: list[Writer], duration: float, interested: bool) -> dict:
    """Every writer transacts back to back for ``duration`` seconds; what came back within it."""
    clients = [await Client.open(url) for _ in writers]
    if interested:
        for client in clients:
            for name in INSTALLED:
                await client.ok("interest", name=name, query=QUERIES[name])
    records: list[tuple[float, float, int]] = []  # (sent, replied, epoch) of committed transactions
    errors: list[str] = []
    start = time.perf_counter()
    deadline = start + duration

    async def loop(writer: Writer, client: Client) -> None:
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            reply = await client.call("transact", tx=[writer.next_fact()])
            replied = time.perf_counter()
            if not reply.get("ok"):
                errors.append(str(reply.get("error")))
            elif replied <= deadline:
                records.append((sent, replied, reply["result"]["epoch"]))

    await asyncio.gather(*(loop(w, c) for w, c in zip(writers, clients)))
    finished = time.perf_counter()
    for client in clients:
        await client.close()
    per_epoch = Counter(epoch for _, _, epoch in records)
    latencies = [replied - sent for sent, replied, _ in records]
    tx = len(records)
    return {
        "clients": len(writers),
        "duration_s": round(duration, 1),
        "drain_after_window_s": round(finished - deadline, 2),
        "transactions": tx,
        "epochs": len(per_epoch),
        "tx_per_s": round(tx / duration, 2),
        "epochs_per_s": round(len(per_epoch) / duration, 3),
        "tx_per_epoch_mean": round(tx / len(per_epoch), 2) if per_epoch else 0,
        "tx_per_epoch_median": median(list(per_epoch.values())) if per_epoch else 0,
        "tx_per_epoch_max": max(per_epoch.values()) if per_epoch else 0,
        "latency_p50_s": round(percentile(latencies, 50), 3) if latencies else None,
        "latency_p99_s": round(percentile(latencies, 99), 3) if latencies else None,
        "epoch_sizes": [per_epoch[e] for e in sorted(per_epoch)],  # transactions per epoch, in epoch order
        "errors": errors,
    }


def engine_baseline(epochs: int, seed: int) -> dict:
    """Median ``Engine.transact`` wall time of single-fact transactions, in this process, no server."""
    from factflow import Engine
    from server_common import SCHEMA

    rng = random.Random(seed)
    db = Engine()
    try:
        for name, value_type, semantics in SCHEMA:
            db.create_attribute(name, type=value_type, semantics=semantics)
        db.transact(seed_transaction(rng, SEED_PERSONS))
        for name in INSTALLED:
            db.query(QUERIES[name], name=name).subscribe(lambda epoch, changes: None)
        writer = Writer(0, SEED_PERSONS, rng)
        walls, phases = [], {}
        warmup = 10  # the server's JVM has run every level's epochs by now; this one starts cold
        for i in range(epochs + warmup):
            started = time.perf_counter()
            db.transact([writer.next_fact()])
            if i >= warmup:
                walls.append(time.perf_counter() - started)
                for key, value in db.epoch_log[-1].phases.items():
                    phases.setdefault(key, []).append(value)
        return {"epochs": epochs, "transact_median_s": round(median(walls), 3),
                "transact_p99_s": round(percentile(walls, 99), 3),
                "phases_median_s": {k: round(median(v), 3) for k, v in phases.items()}}
    finally:
        db.close()


def show(level: dict, round_no: int | None = None) -> None:
    prefix = f"  round {round_no}: " if round_no is not None else "  "
    print(f"{prefix}{level['clients']:>3} clients: {level['tx_per_s']:7.2f} tx/s, "
          f"{level['epochs_per_s']:.3f} epochs/s, "
          f"{level['tx_per_epoch_mean']:5.1f} tx/epoch (median {level['tx_per_epoch_median']}, max "
          f"{level['tx_per_epoch_max']}), latency p50 {level['latency_p50_s']} s p99 {level['latency_p99_s']} s "
          f"({level['transactions']} tx in {level['epochs']} epochs; {len(level['errors'])} errors)", flush=True)


async def main_async(args) -> tuple[dict, dict]:
    figures, facts, _ = await run_against_server(measure, args)
    if args.baseline_epochs:
        baseline = engine_baseline(args.baseline_epochs, args.seed)
        print(f"engine alone (this process, no server, same queries): transact median "
              f"{baseline['transact_median_s']} s, "
              f"phases {baseline['phases_median_s']}", flush=True)
        figures["engine_alone_single_fact"] = baseline
        one = figures["levels"].get("1")
        if one and one["latency_p50_s"]:
            figures["server_1_client_p50_over_engine_alone"] = round(
                one["latency_p50_s"] / baseline["transact_median_s"], 2)
    return figures, facts


async def measure(server: ServerProcess, args) -> dict:
    rng = random.Random(args.seed)
    observed = Counter()
    observer = await Client.open(server.url, on_push=lambda message, at: observed.update([message["query"]]))
    await create_schema(observer)
    await observer.ok("transact", tx=seed_transaction(rng, SEED_PERSONS))
    for name in INSTALLED:
        await observer.ok("interest", name=name, query=QUERIES[name])
    listening = asyncio.create_task(observer.listen())
    memory_start = memory(server.pid)

    levels = [int(n) for n in args.levels.split(",")]
    figures: dict = {"queries": {name: QUERIES[name] for name in INSTALLED}, "seed_persons": SEED_PERSONS,
                     "writers_interested": args.writers_interested, "rounds": args.rounds}
    next_writer = iter(range(10**6))
    if args.warmup > 0:
        warm = await run_level(server.url, [Writer(next(next_writer), SEED_PERSONS, rng) for _ in range(max(levels))],
                               args.warmup, args.writers_interested)
        print(f"warm-up ({args.warmup:g} s, {max(levels)} clients): {warm['transactions']} tx in "
              f"{warm['epochs']} epochs",
              flush=True)
        figures["warmup"] = {k: v for k, v in warm.items() if k != "errors"} | {"errors": len(warm["errors"])}
    by_level: dict[int, list[dict]] = {n: [] for n in levels}
    for round_no in range(1, args.rounds + 1):
        for n in levels:
            result = await run_level(server.url, [Writer(next(next_writer), SEED_PERSONS, rng) for _ in range(n)],
                                     args.duration, args.writers_interested)
            show(result, round_no if args.rounds > 1 else None)
            by_level[n].append(result)

    summary = {}
    for n, results in by_level.items():
        keys = ["tx_per_s", "epochs_per_s", "tx_per_epoch_mean", "latency_p50_s", "latency_p99_s"]
        summary[n] = {k: round(median([r[k] for r in results]), 3) for k in keys}
        summary[n]["transactions"] = sum(r["transactions"] for r in results)
        summary[n]["errors"] = sum(len(r["errors"]) for r in results)
        if any(r["errors"] for r in results):
            summary[n]["first_errors"] = [e for r in results for e in r["errors"]][:3]
    figures["levels"] = {str(n): summary[n] for n in levels}
    figures["runs"] = {str(n): [{k: v for k, v in r.items() if k != "errors"} for r in rs]
                       for n, rs in by_level.items()}
    lo, hi = min(levels), max(levels)
    if summary[lo]["tx_per_s"]:
        figures[f"ratio_tx_per_s_{hi}_over_{lo}"] = round(summary[hi]["tx_per_s"] / summary[lo]["tx_per_s"], 1)
        if args.rounds > 1:
            per_round = [by_level[hi][i]["tx_per_s"] / by_level[lo][i]["tx_per_s"] for i in range(args.rounds)
                         if by_level[lo][i]["tx_per_s"]]
            figures[f"ratio_per_round_{hi}_over_{lo}"] = [round(r, 1) for r in per_round]
    probe = await Client.open(server.url)
    status = await probe.ok("status")
    await probe.close()
    figures["server_epoch_at_end"] = status["epoch"]
    figures["observer_diff_messages"] = dict(observed)
    figures["memory_start"] = memory_start
    figures["memory_end"] = memory(server.pid)
    await observer.close()
    await listening
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,10,50", help="numbers of concurrent clients")
    parser.add_argument("--duration", type=float, default=20, help="seconds per level")
    parser.add_argument("--warmup", type=float, default=10, help="seconds of warm-up at the largest level (0: none)")
    parser.add_argument("--rounds", type=int, default=1, help="run the levels this many times, interleaved (medians)")
    parser.add_argument("--writers-interested", action="store_true",
                        help="every writer is also interested in the three queries (gets their diffs)")
    parser.add_argument("--baseline-epochs", type=int, default=8,
                        help="single-fact epochs on an engine in this process after the server stops (0: skip)")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--name", default=None, help="results file name (default server_throughput[-interested])")
    args = parser.parse_args()
    with Tee() as tee:
        figures, facts = asyncio.run(main_async(args))
        levels = [int(n) for n in args.levels.split(",")]
        lo, hi = min(levels), max(levels)
        print(f"\n{'clients':>7} {'tx/s':>8} {'epochs/s':>9} {'tx/epoch':>9} {'p50':>7} {'p99':>7} {'errors':>6}")
        for n in levels:
            s = figures["levels"][str(n)]
            print(f"{n:>7} {s['tx_per_s']:>8.2f} {s['epochs_per_s']:>9.3f} {s['tx_per_epoch_mean']:>9.1f} "
                  f"{s['latency_p50_s']:>6.2f}s {s['latency_p99_s']:>6.2f}s {s['errors']:>6}")
        ratio = figures.get(f"ratio_tx_per_s_{hi}_over_{lo}")
        if ratio is not None:
            verdict = "met" if hi == 50 and lo == 1 and ratio >= 25 else ("NOT met" if (hi, lo) == (50, 1) else "n/a")
            print(f"tx/s({hi}) / tx/s({lo}) = {ratio}x (issue 12 target: 50 clients >= 25x one client: {verdict})")
        if "server_1_client_p50_over_engine_alone" in figures:
            print(f"1 client's p50 latency / engine-alone transact median = "
                  f"{figures['server_1_client_p50_over_engine_alone']}x (context: measured later, on a fresh JVM)")
        name = args.name or ("server_throughput" + ("-interested" if args.writers_interested else ""))
        report(name, facts, figures)
    write_output(name, tee.text())


if __name__ == "__main__":
    main()
