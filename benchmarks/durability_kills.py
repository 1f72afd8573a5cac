"""The long fault-injection loop (issue 13): many SIGKILLs of a process streaming into a durable engine.

The same loop as the CI test tests/storage/test_kill.py (three kills), run ``--kills``
times: a child process (its own Spark) streams random transactions with retractions,
cardinality-one overwrites and raw multiplicities, with offsets, into
``Engine(state_dir=...)`` with a checkpoint every ``--interval`` epochs, and is killed
with SIGKILL at a random moment between ``--min-delay`` and ``--max-delay`` seconds
after its first acknowledged transaction; after every kill this process reopens the
directory and checks that the transactions applied are exactly the acknowledged ones
(plus possibly the one in flight), that the epoch counter follows, and that queries
(joins, recursion, negation, aggregates) equal the oracle. See tests/storage/kill_loop.py.

    python benchmarks/durability_kills.py [--kills 20] [--interval 3] [--seed 1] [--length 2000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from common import ROOT, engine_session, machine_facts, report

sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "storage"))

from kill_loop import kill_loop  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--interval", type=int, default=3, help="checkpoint interval in epochs")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--length", type=int, default=2000, help="transactions in the stream")
    parser.add_argument("--min-delay", type=float, default=0.0)
    parser.add_argument("--max-delay", type=float, default=8.0)
    args = parser.parse_args()
    spark = engine_session()
    directory = tempfile.mkdtemp(prefix="factflow-kills-")
    started = time.perf_counter()
    try:
        figures = kill_loop(spark, directory, args.kills, seed=args.seed, length=args.length,
                            interval=args.interval, delay=(args.min_delay, args.max_delay),
                            say=lambda text: print(text, flush=True))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    figures.update(seconds=round(time.perf_counter() - started, 1), checkpoint_interval=args.interval,
                   seed=args.seed, delay_s=[args.min_delay, args.max_delay])
    report("durability_kills", machine_facts(spark), figures)


if __name__ == "__main__":
    main()
