"""Fault injection: kill a process streaming into a durable engine with SIGKILL, reopen, compare.

:func:`kill_loop` starts ``durable_child.py`` (its own Spark) on a state directory, lets it
stream random transactions (retractions, cardinality-one overwrites, raw multiplicities)
with offsets, and kills it with SIGKILL at a random moment after its first acknowledged
transaction (a fresh JVM's first epoch takes seconds): during a transaction, a background
checkpoint or the removal of the log behind one. After each
kill it opens the directory itself and checks that

* the transactions applied are exactly those acknowledged, plus possibly the one in flight
  (the offset recovered says which), and the epoch counter equals their number;
* the results of queries (joins, recursion, negation, aggregates) equal the oracle over
  those transactions;

and, from what the children printed, that epochs continue without gaps or repeats across
restarts (epoch = offset + 1 for every acknowledged transaction), and that replayed offsets
are skipped. The CI test runs a few kills; benchmarks/durability_kills.py runs many.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

from durable import QUERIES, check_queries, oracle_after, valid_stream

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durable_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Child:
    """A child process whose output lines are collected by a thread."""

    def __init__(self, args: list[str], stderr_path: str):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self._stderr = open(stderr_path, "ab")
        self.process = subprocess.Popen([sys.executable, CHILD, *args], stdout=subprocess.PIPE,
                                        stderr=self._stderr, env=env, text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.acked = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.strip())
            if line.startswith("ready"):
                self.ready.set()
            elif line.startswith("ack"):
                self.acked.set()
        self.ready.set()
        self.acked.set()

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join()
        self._stderr.close()


def kill_loop(spark, directory: str, kills: int, seed: int = 0, length: int = 300, interval: int = 3,
              delay: tuple[float, float] = (0.0, 5.0), queries=QUERIES, say=lambda text: None) -> dict:
    """Run ``kills`` rounds of start, stream, SIGKILL, reopen and check; returns figures."""
    from factflow import Engine

    rng = random.Random(seed)
    stream = valid_stream(seed, length)
    state_dir = os.path.join(directory, "state")
    stream_path = os.path.join(directory, "stream.json")
    with open(stream_path, "w") as handle:
        json.dump(stream, handle)
    figures = {"kills": 0, "acknowledged": 0, "in_flight_kept": 0, "in_flight_lost": 0, "recovery_s": [],
               "checkpoints_recovered": 0}
    expected_next = 0
    for round_ in range(kills):
        child = _Child([state_dir, stream_path, str(interval)], os.path.join(directory, "child.stderr"))
        if not child.acked.wait(600):
            child.kill()
            raise AssertionError("the child acknowledged nothing in 10 minutes")
        wait = rng.uniform(*delay)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and child.process.poll() is None:
            time.sleep(0.01)
        child.kill()
        lines = child.lines
        if not lines or not lines[0].startswith("ready"):
            raise AssertionError(f"the child failed: {lines}; see {directory}/child.stderr")
        _, epoch, start = lines[0].split()
        assert int(start) == expected_next and int(epoch) == expected_next, (lines[0], expected_next)
        acked, in_flight = int(start) - 1, None
        for line in lines[1:]:
            word, *rest = line.split()
            if word == "begin":
                in_flight = int(rest[0])
            elif word in ("ack", "replay"):
                position, epoch_ = map(int, rest)
                assert epoch_ == position + 1, f"{line}: epochs must continue without gaps or repeats"
                if word == "ack":
                    acked, in_flight = position, None
        figures["acknowledged"] += acked - (int(start) - 1)
        finished = "done" in lines
        db = Engine(spark=spark, state_dir=state_dir)
        try:
            applied = db.offsets().get("feed", -1)
            assert applied == acked or (in_flight is not None and applied == in_flight), \
                f"round {round_}: recovered offset {applied}, acknowledged {acked}, in flight {in_flight}"
            assert db.epoch == applied + 1
            if in_flight is not None:
                figures["in_flight_kept" if applied == in_flight else "in_flight_lost"] += 1
            figures["recovery_s"].append(round(db.recovery.seconds, 3))
            figures["checkpoints_recovered"] += db.recovery.checkpoint is not None
            check_queries(db, oracle_after(stream[:applied + 1]), queries)
        finally:
            db.close()
        figures["kills"] += 1
        say(f"kill {round_ + 1}: after {wait:.2f}s, {acked + 1} acknowledged, recovered epoch {applied + 1} "
            f"(checkpoint {db.recovery.checkpoint}, {db.recovery.log_epochs} logged epochs replayed, "
            f"torn {len(db.recovery.torn)}), queries equal the oracle")
        expected_next = applied + 1
        if finished:
            break
    return figures
