"""Server soak: 20 clients coming and going for 10 minutes; memory, epochs, errors.

A server process (``serve(port=0)``, a default engine) gets the small social schema and
a seed of 300 people (ids 1..300; clients touch ids 1..500, so the data stays bounded).
An observer stays connected throughout, interested in two of four queries (friends'
names, people per city); the other two (names of people in Paris, friends per person)
are installed when a client first shows interest and torn down when the last interested
client leaves, so installs and teardowns recur. Each of 20 clients, in a loop until the
time is up: connects, says hello, expresses interest in one of the four queries at
random, sends 1-6 transactions of 1-3 operations (a name or city of a random person,
a friendship added or retracted) with 0-2 s pauses, and leaves: cleanly (sometimes after
``uninterest``), or abruptly right after sending a transaction, without waiting for its
reply; then reconnects after 0-3 s.

Reports: server memory at start (after setup) and end, and its largest sample (taken
every 30 s): the driver Python process's RSS, the JVM's RSS and its heap in use (``jcmd
GC.heap_info``; at start and end also after a forced ``GC.run``, the live heap); epochs,
transactions committed, transactions abandoned by departing clients, reconnects, and
errors (an ``ok: false`` reply, a connection the server dropped, a reply not within
``--timeout``): there must be none. At the end the observer's accumulated diffs and a
fresh client's first results of all four queries are checked against ``query`` over the
wire, and the server must stop with exit code 0 on SIGTERM.

The clients are coroutines in this one Python process (one event loop).

    python benchmarks/server_soak.py [--minutes 10] [--clients 20]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter

from websockets.exceptions import ConnectionClosed

from common import median, report
from server_common import (QUERIES, Client, ServerProcess, Tee, create_schema, memory, run_against_server,
                           seed_transaction, write_output)

SOAK_QUERIES = ["friends-names", "people-per-city", "in-paris", "friend-count"]
OBSERVED = ["friends-names", "people-per-city"]
SEED_PERSONS = 300
ENTITIES = 500


class Tally:
    def __init__(self):
        self.counts = Counter()
        self.errors: list[str] = []
        self.latencies: dict[str, list[float]] = {}
        self.epochs = Counter()  # transactions committed per epoch

    def error(self, text: str) -> None:
        self.counts["errors"] += 1
        if len(self.errors) < 20:
            self.errors.append(f"{time.strftime('%H:%M:%S')} {text}")
        print(f"  ERROR: {text}", flush=True)


def random_tx(rng: random.Random) -> list:
    ops = []
    used_one = set()
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        e = rng.randint(1, ENTITIES)
        if roll < 0.3 and (e, "name") not in used_one:
            used_one.add((e, "name"))
            ops.append([":db/add", e, ":person/name", f"p{e}-{rng.randint(0, 9)}"])
        elif roll < 0.6 and (e, "city") not in used_one:
            used_one.add((e, "city"))
            ops.append([":db/add", e, ":person/city", rng.choice(["Paris", "Lyon", "Berlin", "Oslo", "Rome"])])
        else:
            op = ":db/add" if rng.random() < 0.55 else ":db/retract"
            ops.append([op, e, ":person/knows", rng.randint(1, ENTITIES)])
    # one fact at most once per transaction, in one direction
    seen, unique = set(), []
    for op in ops:
        key = (op[1], op[2], op[3]) if op[2] == ":person/knows" else (op[1], op[2])
        if key not in seen:
            seen.add(key)
            unique.append(op)
    return unique


async def timed_call(client: Client, tally: Tally, timeout: float, op: str, **fields) -> dict | None:
    started = time.perf_counter()
    try:
        reply = await asyncio.wait_for(client.call(op, **fields), timeout)
    except asyncio.TimeoutError:
        tally.error(f"{op}: no reply within {timeout} s")
        return None
    if not reply.get("ok"):
        tally.error(f"{op}: {reply.get('error')}")
        return None
    tally.latencies.setdefault(op, []).append(time.perf_counter() - started)
    if op == "transact":
        tally.epochs[reply["result"]["epoch"]] += 1
    return reply["result"]


async def visitor(index: int, url: str, end: float, tally: Tally, args) -> None:
    """One client's loop: connect, interest, transact, leave, reconnect, until ``end``."""
    rng = random.Random(args.seed * 1000 + index)
    first = True
    while time.perf_counter() < end:
        if not first:
            tally.counts["reconnects"] += 1
        first = False
        try:
            client = await asyncio.wait_for(Client.open(url), args.timeout)
        except Exception as exc:  # noqa: BLE001 - counted, and the client tries again
            tally.error(f"client {index}: connect failed: {type(exc).__name__}: {exc}")
            await asyncio.sleep(1)
            continue
        tally.counts["connections"] += 1
        try:
            name = rng.choice(SOAK_QUERIES)
            if await timed_call(client, tally, args.timeout, "interest", name=name, query=QUERIES[name]) is not None:
                tally.counts["interests"] += 1
            abrupt = rng.random() < 0.2
            count = rng.randint(1, 6)
            for i in range(count):
                if time.perf_counter() >= end:
                    break
                if abrupt and i == count - 1:
                    await client.send("transact", tx=random_tx(rng))
                    tally.counts["abandoned_transactions"] += 1
                    break
                if await timed_call(client, tally, args.timeout, "transact", tx=random_tx(rng)) is not None:
                    tally.counts["transactions"] += 1
                await asyncio.sleep(rng.uniform(0, 2))
            else:
                if rng.random() < 0.3:
                    if await timed_call(client, tally, args.timeout, "uninterest", name=name) is not None:
                        tally.counts["uninterests"] += 1
            tally.counts["abrupt_leaves" if abrupt else "clean_leaves"] += 1
        except ConnectionClosed as exc:
            tally.error(f"client {index}: connection closed by the server: {exc}")
        except Exception as exc:  # noqa: BLE001 - counted, and the client goes on
            tally.error(f"client {index}: {type(exc).__name__}: {exc}")
        finally:
            try:
                await asyncio.wait_for(client.close(), args.timeout)
            except Exception as exc:  # noqa: BLE001
                tally.error(f"client {index}: close failed: {type(exc).__name__}: {exc}")
        await asyncio.sleep(rng.uniform(0, 3))


def accumulate(total: dict, message: dict) -> None:
    rows = total.setdefault(message["query"], Counter())
    for row, diff in message["changes"]:
        rows[tuple(row)] += diff


def as_counter(rows: list) -> Counter:
    return Counter(tuple(r) for r in rows)


async def measure(server: ServerProcess, args) -> dict:
    rng = random.Random(args.seed)
    tally = Tally()
    observed: dict[str, Counter] = {}
    observer = await Client.open(server.url, on_push=lambda m, at: accumulate(observed, m))
    await create_schema(observer)
    await observer.ok("transact", tx=seed_transaction(rng, SEED_PERSONS))
    for name in OBSERVED:
        await observer.ok("interest", name=name, query=QUERIES[name])
    listening = asyncio.create_task(observer.listen())

    probe = await Client.open(server.url)
    epoch_start = (await probe.ok("status"))["epoch"]
    memory_start = memory(server.pid, collect=True)
    print(f"start: epoch {epoch_start}, memory {memory_start}", flush=True)
    samples = [{"t_s": 0, **{k: v for k, v in memory_start.items() if k != "jvm_heap_used_after_gc_mib"}}]

    started = time.perf_counter()
    end = started + args.minutes * 60
    visitors = [asyncio.create_task(visitor(i, server.url, end, tally, args)) for i in range(args.clients)]
    while time.perf_counter() < end:
        await asyncio.sleep(min(args.sample, max(0.0, end - time.perf_counter())))
        if not server.alive():
            tally.error(f"the server process exited with {server.process.returncode}")
            break
        sample = {"t_s": round(time.perf_counter() - started), **memory(server.pid)}
        status = await timed_call(probe, tally, args.timeout, "status")
        if status is not None:
            sample["epoch"] = status["epoch"]
            sample["clients"] = status["clients"]
            sample["queries"] = len(status["queries"])
        samples.append(sample)
        print(f"  {sample['t_s']:>4} s: epoch {sample.get('epoch')}, {tally.counts['transactions']} tx, "
              f"{tally.counts['reconnects']} reconnects, {tally.counts['errors']} errors; driver RSS "
              f"{sample['driver_python_rss_mib']} MiB, JVM RSS {sample['jvm_rss_mib']} MiB, heap used "
              f"{sample.get('jvm_heap_used_mib')} MiB", flush=True)
    await asyncio.gather(*visitors)
    ran_s = time.perf_counter() - started

    # checks over the wire: what the observer accumulated, and a fresh client's first results
    checks = {}
    epoch_end = (await probe.ok("status"))["epoch"]
    await asyncio.sleep(2)  # the observer's last diffs
    fresh_first: dict[str, Counter] = {}
    fresh = await Client.open(server.url, on_push=lambda m, at: accumulate(fresh_first, m))
    for name in SOAK_QUERIES:
        await fresh.ok("interest", name=name, query=QUERIES[name])
    for name in SOAK_QUERIES:
        truth = as_counter((await fresh.ok("query", query=QUERIES[name]))["rows"])
        checks[name] = {"rows": sum(truth.values()),
                        "fresh_interest_matches_query": +fresh_first.get(name, Counter()) == truth}
        if name in OBSERVED:
            checks[name]["observer_accumulated_matches_query"] = +observed.get(name, Counter()) == truth
    await fresh.close()
    for name, check in checks.items():
        if not all(v for k, v in check.items() if k != "rows"):
            tally.error(f"check failed for {name}: {check}")
    memory_end = memory(server.pid, collect=True)
    samples.append({"t_s": round(time.perf_counter() - started),
                    **{k: v for k, v in memory_end.items() if k != "jvm_heap_used_after_gc_mib"}})
    await probe.close()
    await observer.close()
    await listening

    def largest(key):
        values = [s[key] for s in samples if s.get(key) is not None]
        return max(values) if values else None

    latency = {op: {"count": len(v), "p50_s": round(median(v), 3), "max_s": round(max(v), 3)}
               for op, v in sorted(tally.latencies.items()) if op != "status"}
    sizes = list(tally.epochs.values())
    return {
        "minutes": args.minutes, "clients": args.clients, "queries": {n: QUERIES[n] for n in SOAK_QUERIES},
        "observer_interested_in": OBSERVED,
        "ran_s": round(ran_s, 1),
        "epochs": epoch_end - epoch_start,
        "transactions": tally.counts["transactions"],
        "abandoned_transactions": tally.counts["abandoned_transactions"],
        "connections": tally.counts["connections"],
        "reconnects": tally.counts["reconnects"],
        "interests": tally.counts["interests"],
        "uninterests": tally.counts["uninterests"],
        "clean_leaves": tally.counts["clean_leaves"],
        "abrupt_leaves": tally.counts["abrupt_leaves"],
        "errors": tally.counts["errors"],
        "error_messages": tally.errors,
        "epochs_with_client_transactions": len(sizes),
        "tx_per_epoch_mean": round(sum(sizes) / len(sizes), 2) if sizes else None,
        "tx_per_epoch_max": max(sizes) if sizes else None,
        "latency_by_op": latency,
        "checks": checks,
        "memory_start": memory_start,
        "memory_end": memory_end,
        "memory_largest_sample": {k: largest(k) for k in ("driver_python_rss_mib", "jvm_rss_mib", "jvm_heap_used_mib",
                                                          "tree_rss_mib")},
        "samples": samples,
    }


async def main_async(args) -> tuple[dict, dict]:
    figures, facts, server = await run_against_server(measure, args)
    code = figures["server_exit_code"]
    if code != 0:
        figures["errors"] = figures.get("errors", 0) + 1
        figures.setdefault("error_messages", []).append(f"server exit code {code}")
        print(server.stderr_tail())
    return figures, facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--sample", type=float, default=30, help="seconds between memory samples")
    parser.add_argument("--timeout", type=float, default=180,
                        help="seconds a reply may take before it counts as an error")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--name", default="server_soak", help="results file name")
    args = parser.parse_args()
    with Tee() as tee:
        figures, facts = asyncio.run(main_async(args))
        start, end = figures["memory_start"], figures["memory_end"]
        print(f"\n{figures['ran_s']:.0f} s, {args.clients} clients: {figures['epochs']} epochs, "
              f"{figures['transactions']} transactions committed (+{figures['abandoned_transactions']} abandoned by "
              f"departing clients), {figures['reconnects']} reconnects, {figures['errors']} errors")
        for key in ("driver_python_rss_mib", "jvm_rss_mib", "jvm_heap_used_mib", "jvm_heap_used_after_gc_mib",
                    "tree_rss_mib"):
            print(f"  {key}: start {start.get(key)}, end {end.get(key)}, largest sample "
                  f"{figures['memory_largest_sample'].get(key, '-')}")
        for op, lat in figures["latency_by_op"].items():
            print(f"  {op} send-to-reply: p50 {lat['p50_s']} s, max {lat['max_s']} s ({lat['count']} replies)")
        print(f"  transactions per epoch: mean {figures['tx_per_epoch_mean']}, max {figures['tx_per_epoch_max']}")
        print(f"  checks: {figures['checks']}")
        print(f"  server exit code on SIGTERM: {figures['server_exit_code']}")
        report(args.name, facts, figures)
    write_output(args.name, tee.text())


if __name__ == "__main__":
    main()
