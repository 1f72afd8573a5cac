"""Server fan-out: how long after an epoch closes its diffs reach the last of 100 interested clients.

A server process (``serve(port=0)``, a default engine) gets the small social schema and
a seed of 300 people; 100 listener clients each express interest in the same 5 queries
(friends' names, people per city, two-hop, names of people in Paris, friends per person:
the server installs each once and fans its changes out to every interested client).
Then one writer, also interested in the 5 queries, sends N small transactions one after
another (each: a new person with a name and a city who knows an existing person, and an
existing person who knows the new one: every query changes in every epoch).

Epoch close is taken as the moment the writer receives the reply to its transaction (the
server queues an epoch's diffs before the reply to the transaction that produced it, so
the writer has its own diffs by then). For each listener, its delivery of an epoch is
the time it has received a diff of every query that changed in that epoch (the queries
the writer got diffs of); a diff message stamped with a later epoch counts too, since a
lagging client's waiting changes are folded into one message stamped with the latest
epoch. Reported over epochs: the time from epoch close to the last listener's delivery
(p50, p99, max), to the median listener's delivery, and the writer's send-to-reply time.
Negative values mean a listener had the epoch before the writer had its reply.

All 101 clients are coroutines in this one Python process (one event loop): the
receive times include this process parsing 100 clients' JSON one message at a time,
so they bound the server's own fan-out time from above.

    python benchmarks/server_fanout.py [--clients 100] [--transactions 30]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import defaultdict

from common import median, percentile, report
from server_common import (QUERIES, Client, ServerProcess, Tee, create_schema, memory, run_against_server,
                           seed_transaction, write_output)

SEED_PERSONS = 300


class Receipts:
    """One client's receive times: per query, (epoch, time) of each diff message in arrival order."""

    def __init__(self):
        self.by_query: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.messages = 0

    def __call__(self, message: dict, received: float) -> None:
        if message.get("type") == "diff":
            self.by_query[message["query"]].append((message["epoch"], received))
            self.messages += 1

    def delivered(self, epoch: int, queries: list[str]) -> float | None:
        """When this client had ``epoch`` of every query in ``queries``: the first diff of each
        stamped ``epoch`` or later (folded), the latest of those; None if one never came."""
        times = []
        for query in queries:
            at = next((t for e, t in self.by_query.get(query, ()) if e >= epoch), None)
            if at is None:
                return None
            times.append(at)
        return max(times) if times else None


async def measure(server: ServerProcess, args) -> dict:
    rng = random.Random(args.seed)
    names = list(QUERIES)
    setup = await Client.open(server.url)
    await create_schema(setup)
    await setup.ok("transact", tx=seed_transaction(rng, SEED_PERSONS))
    await setup.close()

    receipts = [Receipts() for _ in range(args.clients)]
    started = time.perf_counter()
    listeners = []
    for r in receipts:
        client = await Client.open(server.url, on_push=r)
        for name in names:
            await client.ok("interest", name=name, query=QUERIES[name])
        listeners.append(client)
    interest_s = time.perf_counter() - started
    listening = [asyncio.create_task(c.listen()) for c in listeners]
    print(f"{args.clients} listeners connected and interested in {len(names)} queries in {interest_s:.1f} s",
          flush=True)

    mine = Receipts()
    writer = await Client.open(server.url, on_push=mine)
    for name in names:
        await writer.ok("interest", name=name, query=QUERIES[name])
    memory_before = memory(server.pid)

    epochs = []  # (epoch, sent, closed, queries changed)
    errors = []
    next_person = 10**6
    for i in range(args.transactions + args.warmup):
        person, existing = next_person, rng.randint(1, SEED_PERSONS)
        next_person += 1
        tx = [[":db/add", person, ":person/name", f"n{person}"],
              [":db/add", person, ":person/city", "Paris" if i % 2 == 0 else rng.choice(["Lyon", "Oslo"])],
              [":db/add", person, ":person/knows", existing],
              [":db/add", existing, ":person/knows", person]]
        sent = time.perf_counter()
        reply = await writer.call("transact", tx=tx)
        closed = time.perf_counter()
        if not reply.get("ok"):
            errors.append(str(reply.get("error")))
            continue
        epoch = reply["result"]["epoch"]
        changed = sorted(q for q, got in mine.by_query.items() if any(e == epoch for e, _ in got))
        if i >= args.warmup:
            epochs.append((epoch, sent, closed, changed))
        await asyncio.sleep(args.pause)

    # wait until every listener has the last epoch (or give up after --settle seconds)
    last_epoch, _, _, last_changed = epochs[-1]
    deadline = time.perf_counter() + args.settle
    while time.perf_counter() < deadline and any(r.delivered(last_epoch, last_changed) is None for r in receipts):
        await asyncio.sleep(0.1)
    memory_after = memory(server.pid)

    close_to_last, close_to_median, writer_latency, spread, missing = [], [], [], [], 0
    per_epoch = []
    for epoch, sent, closed, changed in epochs:
        deliveries = [r.delivered(epoch, changed) for r in receipts]
        got = [d - closed for d in deliveries if d is not None]
        missing += len(deliveries) - len(got)
        writer_latency.append(closed - sent)
        first_own = min((t for q in changed for e, t in mine.by_query[q] if e == epoch), default=None)
        if got:
            close_to_last.append(max(got))
            close_to_median.append(median(got))
            if first_own is not None:
                spread.append(max(got) + closed - first_own)
        per_epoch.append({"epoch": epoch, "writer_s": round(closed - sent, 3), "queries_changed": len(changed),
                          "close_to_last_s": round(max(got), 3) if got else None,
                          "close_to_median_s": round(median(got), 3) if got else None,
                          "writer_first_diff_to_last_s": round(max(got) + closed - first_own, 3)
                          if got and first_own is not None else None,
                          "listeners_missing": len(deliveries) - len(got)})

    probe = await Client.open(server.url)
    status = await probe.ok("status")
    await probe.close()
    for client in listeners + [writer]:
        await client.close()
    await asyncio.gather(*listening)

    def stats(values):
        return {"p50_s": round(percentile(values, 50), 3), "p99_s": round(percentile(values, 99), 3),
                "max_s": round(max(values), 3)} if values else None

    return {
        "clients": args.clients, "queries": QUERIES, "transactions": args.transactions,
        "warmup_transactions": args.warmup, "pause_between_transactions_s": args.pause,
        "listeners_connect_and_interest_s": round(interest_s, 1),
        "epochs_measured": len(epochs),
        "queries_changed_per_epoch_median": median([len(c) for _, _, _, c in epochs]),
        "epoch_close_to_last_delivery": stats(close_to_last),
        "epoch_close_to_median_delivery": stats(close_to_median),
        "writer_send_to_reply": stats(writer_latency),
        "writer_first_diff_to_last_delivery": stats(spread),
        "diff_messages_per_listener_median": median([r.messages for r in receipts]),
        "listener_epochs_never_delivered": missing,
        "errors": errors,
        "status_at_end": {"epoch": status["epoch"], "clients": status["clients"], "queries": status["queries"]},
        "memory_before_writes": memory_before,
        "memory_after_writes": memory_after,
        "per_epoch": per_epoch,
    }


async def main_async(args) -> tuple[dict, dict]:
    figures, facts, _ = await run_against_server(measure, args)
    return figures, facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100, help="listener clients (besides the writer)")
    parser.add_argument("--transactions", type=int, default=30, help="measured transactions (one epoch each)")
    parser.add_argument("--warmup", type=int, default=3, help="transactions before the measured ones")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between a reply and the next transaction")
    parser.add_argument("--settle", type=float, default=60, help="seconds to wait for the last epoch's deliveries")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--name", default="server_fanout", help="results file name")
    args = parser.parse_args()
    with Tee() as tee:
        figures, facts = asyncio.run(main_async(args))
        last, med, writer = (figures["epoch_close_to_last_delivery"], figures["epoch_close_to_median_delivery"],
                             figures["writer_send_to_reply"])
        print(f"\nover {figures['epochs_measured']} epochs ({figures['queries_changed_per_epoch_median']} of 5 queries "
              f"changed per epoch, median), {args.clients} listeners:")
        print(f"  epoch close -> last listener has the epoch:   p50 {last['p50_s']} s, p99 {last['p99_s']} s, "
              f"max {last['max_s']} s")
        print(f"  epoch close -> median listener has the epoch: p50 {med['p50_s']} s, p99 {med['p99_s']} s")
        spread = figures["writer_first_diff_to_last_delivery"]
        print(f"  writer's first diff -> last listener has it:  p50 {spread['p50_s']} s, p99 {spread['p99_s']} s, "
              f"max {spread['max_s']} s")
        print(f"  writer send -> reply (the epoch):             p50 {writer['p50_s']} s, p99 {writer['p99_s']} s")
        print(f"  listener-epochs never delivered: {figures['listener_epochs_never_delivered']}, "
              f"errors: {len(figures['errors'])}")
        report(args.name, facts, figures)
    write_output(args.name, tee.text())


if __name__ == "__main__":
    main()
