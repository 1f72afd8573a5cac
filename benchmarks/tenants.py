"""Many clients on one server: the 3DF thesis's sharing experiment (section 10.4, figure 9).

500 devices report their speed; one transaction of 500 readings a second (one epoch a
second) is sent by an ingest client. Every second ten new clients connect, each watching
one random device, for ``--arrive`` seconds (120 by default: 1,200 clients), from several
client processes. Four ways to serve them, each on a fresh ``factflow serve`` (a default
engine; tenants from a generated ``--tenants`` file where needed):

- ``shared-nothing``: each client installs a query of its own, named for it
  (``[:find ?s :where [D :device/speed ?s]]``): a dataflow per client;
- ``shared-trunk``: a registered rule over the speeds, which every client's own named query
  reads with its filter (``[:find ?s :where (speed ?d ?s) [(= ?d D)]]``): the rule's state is
  shared, each client still installs a small dataflow;
- ``tenant-routed``: an admin publishes ``watch``, routed by tenant; each client is a
  tenant that joins it and writes one parameter fact (the device it watches);
- ``automatic``: each client sends shared-nothing's text unnamed; the server lifts the
  constant (one dataflow for all).

The ingest runs alone for ``--warmup`` seconds first (15: the first epochs of a fresh
server plan their statements and warm the JIT), then the clients arrive; after the first
second's ten, arrivals pause for ``--hold`` seconds (20), so that the value at 10 clients,
which the goal compares against, is a percentile of that many epochs rather than one. Measured, per
second of the run: the epoch close latency (from the second the ingest
transaction was due to its reply: a server that falls behind shows as growing latency),
delivery to the last client (from that moment to the last client's receipt of the
epoch's diff), admission (a client's interest sent to its device's first row received),
installed dataflows, and the server's driver (Python) and JVM resident memory. Reported
per strategy at 10, 100, 300, 600 and 1,200 connected clients (p50/p99 of the seconds
around each), with the goal: tenant-routed and automatic keep p99 epoch close within 10%
of their value at 10 clients up to 1,200 clients with no backlog, admission p99 within two
epochs; and where shared-nothing and shared-trunk collapse (the first second whose epoch
close passes 2 s). A plot like the thesis's figure 9 goes to docs/tenants.png.

    python benchmarks/tenants.py [--arrive 120] [--strategies all]
    python benchmarks/tenants.py --quick      # 20 s of arrivals, 3 client processes
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time

from server_common import ServerProcess, loadavg, machine_facts, memory

from common import ROOT, report

DEVICES = 500
STRATEGIES = ("shared-nothing", "shared-trunk", "tenant-routed", "automatic")
MARKS = (10, 100, 300, 600, 1200)
LINGER = 3  # seconds the clients stay after the ingest's last epoch: 1,200 leaving at once is not part of an epoch
ADMIN = "admin-token"
WATCH = "[:find ?t ?d ?s :where [?t :param.watch/device ?d] [?d :device/speed ?s]]"


def token(i: int) -> str:
    return f"tenant-token-{i}"


def tenants_file(clients: int) -> str:
    entries = [{"name": "ops", "token_sha256": hashlib.sha256(ADMIN.encode()).hexdigest(), "role": "admin"}]
    entries += [{"name": f"t{i}", "token_sha256": hashlib.sha256(token(i).encode()).hexdigest(), "role": "tenant"}
                for i in range(clients)]
    handle, path = tempfile.mkstemp(prefix="factflow-tenants-", suffix=".json")
    with os.fdopen(handle, "w") as out:
        json.dump({"tenants": entries}, out)
    return path


# ------------------------------------------------------------------ the clients (processes of their own)

async def _client(url: str, strategy: str, index: int, device: int, record: dict, stop: asyncio.Event) -> None:
    from factflow.client import AsyncClient

    tenant = strategy == "tenant-routed"
    client = await AsyncClient.connect(url, token=token(index) if tenant else None)
    try:
        began = time.time()
        seen = asyncio.Event()

        def arrived(epoch: int, changes: list) -> None:
            now = time.time()
            record["epochs"].setdefault(epoch, now)
            if any(changes):
                seen.set()

        if strategy == "shared-nothing":
            query = await client.query(f"[:find ?s :where [{device} :device/speed ?s]]", name=f"c{index}")
        elif strategy == "shared-trunk":
            query = await client.query(f"[:find ?s :where (speed ?d ?s) [(= ?d {device})]]", name=f"c{index}")
        elif strategy == "automatic":
            query = await client.query(f"[:find ?s :where [{device} :device/speed ?s]]")
        else:
            query = await client.query(name="watch")
            query.subscribe(arrived)
            await client.transact([[":db/add", client.entity, ":param.watch/device", device]])
        if strategy != "tenant-routed":
            query.subscribe(arrived)
            if query.results():
                seen.set()
        await seen.wait()
        record["admission_s"] = time.time() - began
        record["admitted_at"] = time.time()
        await stop.wait()
    finally:
        await client.close()


async def _clients(url: str, strategy: str, schedule: list[tuple[float, int, int]], stop_at: float,
                   results: multiprocessing.Queue) -> None:
    stop = asyncio.Event()
    records, tasks = [], []
    for at, index, device in schedule:
        await asyncio.sleep(max(0.0, at - time.time()))
        record = {"index": index, "device": device, "connected_at": time.time(), "epochs": {}}
        records.append(record)
        tasks.append(asyncio.create_task(_client(url, strategy, index, device, record, stop)))
    await asyncio.sleep(max(0.0, stop_at - time.time()))
    stop.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    results.put({"records": records, "failures": failures[:5], "failed": len(failures)})


def client_process(url: str, strategy: str, schedule: list, stop_at: float, results: multiprocessing.Queue) -> None:
    """One client process: its share of the arriving clients, on one event loop."""
    sys.path.insert(0, ROOT)
    asyncio.run(_clients(url, strategy, schedule, stop_at, results))


# ------------------------------------------------------------------ one strategy

def run_strategy(strategy: str, arrive: int, tail: int, processes: int, per_second: int, warmup: int,
                 hold: int) -> dict:
    from factflow.client import Client
    from factflow.errors import RequestTimeoutError

    clients = arrive * per_second
    extra = ["--tenants", tenants_file(clients)] if strategy == "tenant-routed" else []
    server = ServerProcess(extra=extra)
    print(f"{strategy}: server {server.url} ready in {server.startup_s:.1f} s", flush=True)
    try:
        with Client(server.url, token=ADMIN if extra else None, timeout=600) as admin:
            admin.create_attribute(":device/speed", type="long", semantics="one")
            rng = random.Random(11)
            admin.transact([[":db/add", d, ":device/speed", rng.randint(0, 120)] for d in range(1, DEVICES + 1)])
            if strategy == "shared-trunk":
                admin.register("[[(speed ?d ?s) [?d :device/speed ?s]]]")
            if strategy == "tenant-routed":
                admin.create_attribute(":param.watch/device", type="ref", parameter=True)
                admin.publish("watch", WATCH, tenant="?t")
            began = time.time() + 1  # the ingest runs alone for ``warmup`` seconds first (plans, JIT)
            start = began + warmup
            stop_at = start + hold + arrive + tail
            schedule = [(start + second + (hold if second else 0) + j / per_second, second * per_second + j,
                         rng.randint(1, DEVICES)) for second in range(arrive) for j in range(per_second)]
            results: multiprocessing.Queue = multiprocessing.Queue()
            workers = [multiprocessing.Process(target=client_process, args=(
                server.url, strategy, schedule[p::processes], stop_at + LINGER, results)) for p in range(processes)]
            for worker in workers:
                worker.start()
            epochs, samples = [], []
            sampler = threading.Thread(target=_sample, args=(server, admin, stop_at, samples), daemon=True)
            sampler.start()
            second = 0
            with Client(server.url, token=ADMIN if extra else None, timeout=600) as ingest:
                while time.time() < stop_at:
                    due = began + second
                    time.sleep(max(0.0, due - time.time()))
                    tx = [[":db/add", d, ":device/speed", rng.randint(0, 120)] for d in range(1, DEVICES + 1)]
                    try:
                        epoch = ingest.transact(tx)
                    except RequestTimeoutError:  # so far behind that no reply came: the strategy stalled
                        epochs.append({"second": second, "due": due, "epoch": None, "close_s": time.time() - due})
                        print(f"{strategy}: the ingest's transaction had no reply within its timeout; "
                              "recorded as stalled", flush=True)
                        break
                    epochs.append({"second": second, "due": due, "epoch": epoch, "close_s": time.time() - due})
                    second += 1
            gathered = [results.get(timeout=600) for _ in workers]
            for worker in workers:
                worker.join(60)
            sampler.join(10)
    finally:
        code = server.stop()
    return summarize(strategy, epochs, gathered, samples, start, code)


def _sample(server: ServerProcess, admin, stop_at: float, samples: list) -> None:
    from factflow.client import Client

    with Client(admin.url, token=ADMIN if admin.tenant else None, timeout=600) as watcher:
        while time.time() < stop_at:
            began = time.time()
            try:
                dataflows = watcher.status()["dataflows"]
            except Exception:  # noqa: BLE001 - a busy server: the sample is skipped
                dataflows = None
            samples.append({"at": began, "dataflows": dataflows, **memory(server.pid)})
            time.sleep(max(0.0, 1.0 - (time.time() - began)))


def summarize(strategy: str, epochs: list, gathered: list, samples: list, start: float, code) -> dict:
    records = [r for g in gathered for r in g["records"]]
    failed = sum(g["failed"] for g in gathered)
    epochs = [e for e in epochs if e["due"] >= start]  # the warm-up's epochs are not measured
    for e in epochs:  # delivery: the latest receipt of the epoch among connected clients
        arrivals = [r["epochs"][e["epoch"]] for r in records if e["epoch"] in r["epochs"]]
        e["delivery_s"] = (max(arrivals) - e["due"]) if arrivals else None
        e["clients"] = sum(1 for r in records if r["connected_at"] <= e["due"])
    per_mark = {}
    for mark in MARKS:
        near = [e for e in epochs if abs(e["clients"] - mark) <= max(5, mark // 10)]
        admitted = [r["admission_s"] for r in records if "admission_s" in r
                    and abs(r["index"] + 1 - mark) <= max(5, mark // 10)]
        if not near:
            continue
        closes = sorted(e["close_s"] for e in near)
        deliveries = sorted(e["delivery_s"] for e in near if e["delivery_s"] is not None)
        per_mark[mark] = {"epoch_close_p50_s": round(statistics.median(closes), 3),
                          "epoch_close_p99_s": round(_p99(closes), 3),
                          "delivery_p99_s": round(_p99(deliveries), 3) if deliveries else None,
                          "admission_p99_s": round(_p99(sorted(admitted)), 3) if admitted else None,
                          "epoch_closes_s": [round(c, 3) for c in closes]}
    collapse = next((e["clients"] for e in epochs if e["close_s"] > 2.0), None)
    dataflows = [s["dataflows"] for s in samples if s["dataflows"] is not None]
    figures = {"strategy": strategy, "clients_connected": len(records), "client_failures": failed,
               "per_clients": per_mark, "collapse_at_clients": collapse,
               "dataflows_max": max(dataflows) if dataflows else None,
               "driver_rss_mib_max": max((s["driver_python_rss_mib"] or 0) for s in samples) if samples else None,
               "jvm_rss_mib_max": max((s["jvm_rss_mib"] or 0) for s in samples) if samples else None,
               "epochs": epochs, "server_exit_code": code}
    base = per_mark.get(MARKS[0], {}).get("epoch_close_p99_s")
    top = per_mark.get(max(per_mark), {}) if per_mark else {}
    if base and top:
        figures["p99_close_growth"] = round(top["epoch_close_p99_s"] / base, 2)
    print(f"  {strategy}: {len(records)} clients ({failed} failed); " + "; ".join(
        f"{m}: close p50 {v['epoch_close_p50_s']} s p99 {v['epoch_close_p99_s']} s, admission p99 "
        f"{v['admission_p99_s']} s" for m, v in per_mark.items()) + f"; collapse at {collapse}", flush=True)
    return figures


def _p99(values: list[float]) -> float:
    return values[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))] if values else float("nan")


def plot(results: dict, path: str) -> None:
    """Epoch close latency against connected clients, one line per strategy (figure 9)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for strategy, figures in results.items():
        epochs = figures["epochs"]
        axis.plot([e["clients"] for e in epochs], [e["close_s"] for e in epochs], label=strategy, linewidth=1)
    axis.set_xlabel("connected clients (ten arrive every second, after a pause at ten)")
    axis.set_ylabel("epoch close latency (s)")
    axis.set_yscale("log")
    axis.set_title("500 readings per second, one epoch per second")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrive", type=int, default=None, help="seconds of arrivals (default 120, quick 20)")
    parser.add_argument("--tail", type=int, default=10, help="seconds after the last arrival")
    parser.add_argument("--warmup", type=int, default=15, help="seconds of ingest alone before clients arrive")
    parser.add_argument("--per-second", type=int, default=10, help="clients arriving each second")
    parser.add_argument("--hold", type=int, default=20, help="seconds arrivals pause after the first second's")
    parser.add_argument("--processes", type=int, default=None, help="client processes (default 4, quick 3)")
    parser.add_argument("--strategies", default="all", help="comma-separated, or all")
    parser.add_argument("--quick", action="store_true", help="20 s of arrivals")
    args = parser.parse_args()
    arrive = args.arrive or (20 if args.quick else 120)
    processes = args.processes or (3 if args.quick else 4)
    chosen = STRATEGIES if args.strategies == "all" else tuple(args.strategies.split(","))
    results = {}
    for strategy in chosen:
        results[strategy] = run_strategy(strategy, arrive, args.tail, processes, args.per_second, args.warmup,
                                         args.hold)
    picture = os.path.join(ROOT, "docs", "tenants.png")
    plot(results, picture)
    figures = {"arrive_s": arrive, "hold_s": args.hold, "per_second": args.per_second, "devices": DEVICES,
               "client_processes": processes,
               "strategies": {s: {k: v for k, v in f.items() if k != "epochs"} for s, f in results.items()},
               "plot": os.path.relpath(picture, ROOT), "load_average_end": loadavg()}
    report("tenants" + ("-quick" if args.quick else ""), machine_facts(None), figures)


if __name__ == "__main__":
    main()
