"""Shared helpers for the server benchmarks: a server process, protocol clients, memory, machine facts.

The server runs as a separate process started as a user starts it (``factflow serve
--port 0``: a default ``factflow.Engine()``); the benchmark's clients are asyncio
coroutines in the benchmark's own Python process (one event loop, so at most one core
for all of them: client-side JSON parsing and scheduling are part of every measured
latency). :func:`run_against_server` is the frame every benchmark runs in.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from typing import Any, Callable

from common import ROOT  # noqa: F401 - also puts the repository on sys.path

from websockets.asyncio.client import connect

#: A small social schema and queries over it (shared by the server benchmarks).
SCHEMA = [(":person/name", "string", "one"), (":person/knows", "ref", "set"), (":person/city", "string", "one")]
QUERIES = {
    "friends-names": "[:find ?a ?n :where [?a :person/knows ?b] [?b :person/name ?n]]",
    "people-per-city": "[:find ?c (count ?p) :where [?p :person/city ?c]]",
    "two-hop": "[:find ?a ?c :where [?a :person/knows ?b] [?b :person/knows ?c]]",
    "in-paris": "[:find ?p ?n :where [?p :person/city \"Paris\"] [?p :person/name ?n]]",
    "friend-count": "[:find ?a (count ?b) :where [?a :person/knows ?b]]",
}
CITIES = ["Paris", "Lyon", "Berlin", "Madrid", "Rome", "Oslo", "Lisbon", "Vienna", "Prague", "Dublin"]


def seed_transaction(rng, persons: int, knows_each: int = 3, first: int = 1) -> list:
    """``persons`` people (ids ``first``..) with a name and a city, each knowing ``knows_each`` others."""
    ids = list(range(first, first + persons))
    tx = []
    for p in ids:
        tx.append([":db/add", p, ":person/name", f"p{p}"])
        tx.append([":db/add", p, ":person/city", rng.choice(CITIES)])
        for q in rng.sample(ids, knows_each + 1):
            if q != p:
                tx.append([":db/add", p, ":person/knows", q])
    return tx


# ------------------------------------------------------------------ the server process

#: How the server is started: as a user starts it, with every default.
SERVER_COMMAND = [sys.executable, "-m", "factflow", "serve", "--port", "0"]


class ServerProcess:
    """The server as a child process: started, its URL read from its announcement, stopped with SIGTERM."""

    def __init__(self, stderr_path: str | None = None, timeout: float = 300, extra: list[str] | None = None):
        command = SERVER_COMMAND + list(extra or [])
        self.description = " ".join(["factflow serve --port 0", *(extra or [])])
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.stderr_path = stderr_path or os.path.join("/tmp", f"factflow-server-bench-{os.getpid()}.log")
        self._stderr = open(self.stderr_path, "w")
        started = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env,
                                        cwd=ROOT)
        self.pid = self.process.pid
        line = self.process.stdout.readline()  # blocks until the announcement (or exit)
        if not line.startswith("factflow serving "):
            self.process.kill()
            raise RuntimeError(f"the server did not start (printed {line!r}); see {self.stderr_path}")
        self.url = line.split()[-1]
        self.startup_s = time.perf_counter() - started

    def stop(self, timeout: float = 120) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
            code = f"did not stop within {timeout} s of SIGTERM (killed; exit {code})"
        self._stderr.close()
        return code

    def alive(self) -> bool:
        return self.process.poll() is None

    def stderr_tail(self, lines: int = 20) -> str:
        try:
            with open(self.stderr_path) as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError:
            return ""


async def run_against_server(measure, args) -> tuple[dict, dict, "ServerProcess"]:
    """Start the server, run ``await measure(server, args)``, stop it; returns the figures
    (with ``server_exit_code``), the machine facts (with ``load_average_end``) and the server."""
    server = ServerProcess()
    print(f"server: {server.description}, pid {server.pid}, ready in {server.startup_s:.1f} s at {server.url}",
          flush=True)
    facts = machine_facts(server)
    try:
        figures = await measure(server, args)
    finally:
        code = server.stop()
        print(f"server stopped (SIGTERM): exit {code}")
        facts["load_average_end"] = loadavg()
    figures["server_exit_code"] = code
    return figures, facts, server


# ------------------------------------------------------------------ memory

def _status_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_mib(pid: int) -> float | None:
    """Resident memory of one process (VmRSS), MiB."""
    kib = _status_kib(pid, "VmRSS")
    return None if kib is None else round(kib / 1024, 1)


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of the direct children of ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == pid:
            found.append((int(entry), name))
    return found


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child, _ in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def jvm_pid(server_pid: int) -> int | None:
    """The server's JVM: the java process among its descendants."""
    for child in descendants(server_pid):
        try:
            with open(f"/proc/{child}/comm") as handle:
                if handle.read().strip() == "java":
                    return child
        except OSError:
            continue
    return None


def jvm_heap(pid: int, collect: bool = False) -> dict | None:
    """G1 heap total/used in MiB from ``jcmd PID GC.heap_info`` (after ``GC.run`` if ``collect``);
    None without jcmd."""
    try:
        if collect:
            subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, text=True, timeout=120)
        text = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"total (\d+)K, used (\d+)K", text)
    if not match:
        return None
    return {"total_mib": round(int(match.group(1)) / 1024, 1), "used_mib": round(int(match.group(2)) / 1024, 1)}


def memory(server_pid: int, collect: bool = False) -> dict:
    """Server memory now: the driver Python process, its JVM (RSS and heap), and the whole process tree."""
    jvm = jvm_pid(server_pid)
    tree = [server_pid] + descendants(server_pid)
    sample = {"driver_python_rss_mib": rss_mib(server_pid),
              "jvm_rss_mib": rss_mib(jvm) if jvm else None,
              "tree_rss_mib": round(sum(rss_mib(p) or 0 for p in tree), 1),
              "processes": len(tree)}
    heap = jvm_heap(jvm) if jvm else None
    if heap:
        sample["jvm_heap_used_mib"] = heap["used_mib"]
        sample["jvm_heap_total_mib"] = heap["total_mib"]
    if collect and jvm:
        after = jvm_heap(jvm, collect=True)
        if after:
            sample["jvm_heap_used_after_gc_mib"] = after["used_mib"]
    return sample


# ------------------------------------------------------------------ machine facts

def loadavg() -> str:
    try:
        with open("/proc/loadavg") as handle:
            return " ".join(handle.read().split()[:3])
    except OSError:
        return "?"


def machine_facts(server: ServerProcess | None = None) -> dict:
    """What the figures were measured on (the server's Spark session is a default engine's)."""
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    try:
        with open("/proc/meminfo") as handle:
            mem_kb = int(handle.readline().split()[1])
    except OSError:
        mem_kb = 0
    import pyspark
    import websockets
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=ROOT).stdout.strip()
    facts = {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "java": java,
        "spark": pyspark.__version__,
        "websockets": websockets.__version__,
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "load_average": loadavg(),
        "clients": "asyncio coroutines sharing one Python process (the benchmark's), one event loop",
    }
    if server is not None:
        facts["server"] = f"separate process, {server.description}: default factflow.Engine() (local[*])"
    return facts


# ------------------------------------------------------------------ a protocol client

class RequestFailed(Exception):
    """A request answered with ok: false."""

    def __init__(self, op: str, reply: dict):
        super().__init__(f"{op}: {reply.get('error')}")
        self.op = op
        self.reply = reply


class Client:
    """One WebSocket connection speaking protocol 1, one request at a time.

    :meth:`call` sends a request and reads until its reply; pushed messages read meanwhile go
    to ``on_push(message, received_at)``. :meth:`listen` reads pushes only (for clients that
    never send), until the connection closes or :meth:`close`.
    """

    def __init__(self, ws, on_push: Callable[[dict, float], None] | None = None):
        self.ws = ws
        self.on_push = on_push
        self._ids = itertools.count(1)
        self.pushes = 0

    @classmethod
    async def open(cls, url: str, on_push: Callable[[dict, float], None] | None = None, hello: bool = True,
                   **kwargs) -> "Client":
        ws = await connect(url, max_size=None, open_timeout=120, **kwargs)
        client = cls(ws, on_push)
        if hello:
            await client.ok("hello", protocol=1)
        return client

    async def send(self, op: str, **fields) -> Any:
        request_id = next(self._ids)
        await self.ws.send(json.dumps({"op": op, "id": request_id, **fields}))
        return request_id

    async def reply(self, request_id: Any) -> dict:
        while True:
            message = json.loads(await self.ws.recv())
            if "type" in message:
                self.pushes += 1
                if self.on_push is not None:
                    self.on_push(message, time.perf_counter())
                continue
            if message.get("id") != request_id:
                raise RuntimeError(f"reply out of order: waited for {request_id}, got {message}")
            return message

    async def call(self, op: str, **fields) -> dict:
        return await self.reply(await self.send(op, **fields))

    async def ok(self, op: str, **fields) -> Any:
        reply = await self.call(op, **fields)
        if not reply.get("ok"):
            raise RequestFailed(op, reply)
        return reply["result"]

    async def listen(self) -> None:
        try:
            async for frame in self.ws:
                message = json.loads(frame)
                received = time.perf_counter()
                if "type" in message:
                    self.pushes += 1
                    if self.on_push is not None:
                        self.on_push(message, received)
        except Exception:  # noqa: BLE001 - closing ends listening
            pass

    async def close(self) -> None:
        await self.ws.close()


async def create_schema(client: Client) -> None:
    for name, value_type, semantics in SCHEMA:
        await client.ok("create-attribute", name=name, type=value_type, semantics=semantics)


def write_output(name: str, text: str) -> str:
    """Save the printed output of a run as benchmarks/results/NAME.txt (beside report()'s NAME.json)."""
    from common import RESULTS
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.txt")
    with open(path, "w") as handle:
        handle.write(text)
    return path


class Tee:
    """Copy of everything printed, to save as the run's output."""

    def __init__(self):
        self.parts: list[str] = []
        self._stdout = sys.stdout

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self._stdout.write(text)

    def flush(self) -> None:
        self._stdout.flush()

    def __enter__(self) -> "Tee":
        sys.stdout = self
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout = self._stdout

    def text(self) -> str:
        return "".join(self.parts)
