"""The cost of durability (issue 13): epoch latency with and without a state directory;
checkpoint, restart and load times for the Facebook x4 state.

Latency: two engines on one session, one ``Engine(spark=s)`` and one
``Engine(spark=s, state_dir=...)`` (default config), each loaded with the LDBC SNB tiny
persons, knows and places and the five queries of benchmarks/epoch_latency.py; then the
same transactions of 1, 100 and 10,000 changes (epoch_latency's generator, same seed)
go to both, alternating engine by engine per epoch so that both see the same machine
load. Per size and engine: the median of ``transact``'s wall time and of the time to
results (``EpochReport.seconds``, which for the durable engine includes writing and
fsyncing the log record, ``phases["log"]``), first two epochs of each size excluded.

Facebook x4 (four disjoint copies of facebook_combined.txt, as in
benchmarks/state_independence.py: 705,872 ``:edge`` facts):

- *load from the file*: a new engine without state directory reads the file with Spark
  and transacts the four copies as one DataFrame (what a restart costs without durability;
  one untimed load first warms the JVM up);
- the same load into a durable engine (its epoch logs the changes as Parquet files);
- *restart from the log*: the durable engine closed and a new one opened on its directory
  before any checkpoint (the load epoch's files are read back);
- *checkpoint*: ``Engine.checkpoint()`` (seconds, bytes, files);
- *restart from the checkpoint*: closed and reopened after the checkpoint.

Loads and restarts run ``--repeats`` times each (medians reported, samples too).

Every engine is ``Engine(spark=s)`` on a session configured as ``factflow.Engine()``
configures its own (the JVM is up: a restart of a process also pays Spark's start, about
8 s here); each restart's fact count is checked against the load's, and a selective query
is installed after each to show the recovered state is indexed.

    python benchmarks/durability.py [--epochs 12] [--copies 4] [--repeats 3] [--skip-latency] [--skip-load]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile

from common import GRAPHS, describe_session, engine_session, machine_facts, median, report, timed
from epoch_latency import FIVE, RULES, SIZES, persons_of, transaction
from state_independence import as_facts, copies_of, stride_of

from factflow import Engine
from factflow.io.graphs import read_edges
from factflow.storage.files import bytes_under
from factflow.io.ldbc import load_ldbc

WARM = 2
SELECTIVE = "[:find ?b ?c :where [0 :edge ?a] [?a :edge ?b] [?b :edge ?c]]"


def latency(spark, epochs: int, directory: str) -> dict:
    engines = {"memory": Engine(spark=spark), "durable": Engine(spark=spark, state_dir=os.path.join(directory, "ldbc"))}
    try:
        for db in engines.values():
            load_ldbc(db)
            db.register(RULES)
            for i, (text, inputs) in enumerate(FIVE):
                db.query(text, name=f"q{i + 1}", inputs=inputs)
        persons = persons_of(engines["memory"])
        assert persons == persons_of(engines["durable"])
        rng = random.Random(7)
        next_id = [10**15]
        figures: dict = {}
        for size in SIZES:
            samples = {name: {"wall": [], "results": [], "log": []} for name in engines}
            for i in range(epochs):
                tx = transaction(rng, size, persons, next_id)
                order = list(engines.items()) if i % 2 == 0 else list(reversed(engines.items()))
                for name, db in order:
                    seconds, _ = timed(lambda: db.transact(tx))
                    r = db.epoch_log[-1]
                    samples[name]["wall"].append(seconds)
                    samples[name]["results"].append(r.seconds)
                    samples[name]["log"].append(r.phases.get("log", 0.0))
            row = {}
            for name, s in samples.items():
                row[name] = {"transact_median_s": round(median(s["wall"][WARM:]), 3),
                             "to_results_median_s": round(median(s["results"][WARM:]), 3),
                             "log_phase_median_s": round(median(s["log"][WARM:]), 4)}
            row["durable_over_memory"] = round(row["durable"]["transact_median_s"] / row["memory"]["transact_median_s"],
                                               2)
            figures[str(size)] = row
            print(f"  {size} changes: without state_dir {row['memory']['transact_median_s']} s, with "
                  f"{row['durable']['transact_median_s']} s (log record {row['durable']['log_phase_median_s']} s), "
                  f"ratio {row['durable_over_memory']}", flush=True)
        figures["log_bytes_after"] = engines["durable"].storage_report()["bytes"]["log"]
        return figures
    finally:
        for db in engines.values():
            db.close()


def facebook(spark, copies: int, directory: str, repeats: int) -> dict:
    path = os.path.join(GRAPHS, "facebook_combined.txt")
    stride = stride_of(read_edges(spark, path))

    def load(state_dir=None) -> Engine:
        db = Engine(spark=spark, state_dir=state_dir)
        db.create_attribute(":edge", type="ref")
        db.transact(as_facts(copies_of(read_edges(spark, path), copies, stride)))
        return db

    def install(db) -> float:
        seconds, q = timed(lambda: db.query(SELECTIVE))
        q.close()
        return round(seconds, 3)

    def repeated(label: str, make, check=None) -> tuple[list[float], Engine]:
        """``make()`` ``repeats`` times (every engine but the last closed); seconds and the last engine."""
        times = []
        for i in range(repeats):
            seconds, db = timed(make)
            times.append(round(seconds, 3))
            if check is not None:
                check(db)
            print(f"  {label} {i + 1}/{repeats}: {seconds:.2f} s"
                  + (f" {db.recovery.phases}" if db.recovery else ""), flush=True)
            if i < repeats - 1:
                db.close()
        return times, db

    figures: dict = {"copies": copies, "repeats": repeats}
    load().close()  # untimed warm-up: the first load of a JVM pays its JIT
    times, db = repeated("load from the file (no state_dir)", load)
    facts = db.arrangement(":edge").forward.tuples
    figures.update(facts=facts, load_from_file_s=median(times), load_from_file_samples_s=times,
                   install_after_load_s=install(db))
    db.close()

    state_dir = os.path.join(directory, "facebook")

    def durable_load() -> Engine:
        shutil.rmtree(state_dir, ignore_errors=True)
        return load(state_dir)

    times, db = repeated("load into a durable engine", durable_load)
    figures.update(durable_load_s=median(times), durable_load_samples_s=times,
                   durable_load_log_phase_s=round(db.epoch_log[-1].phases.get("log", 0.0), 3),
                   log_bytes_after_load=bytes_under(os.path.join(state_dir, "wal")))
    db.close()

    def same_facts(db) -> None:
        assert db.arrangement(":edge").forward.tuples == facts

    times, db = repeated("restart from the log", lambda: Engine(spark=spark, state_dir=state_dir), same_facts)
    figures.update(restart_from_log_s=median(times), restart_from_log_samples_s=times,
                   restart_from_log_phases_s=db.recovery.phases, install_after_restart_from_log_s=install(db))

    seconds, epoch = timed(db.checkpoint)
    checkpoint = db.storage_report()["last_checkpoint"]
    figures.update(checkpoint_s=round(seconds, 3), checkpoint_pause_s=round(checkpoint.pause, 4),
                   checkpoint_bytes=checkpoint.bytes, checkpoint_files=checkpoint.files,
                   checkpoint_bytes_per_fact=round(checkpoint.bytes / facts, 2))
    db.close()
    print(f"  checkpoint: {seconds:.2f} s, {checkpoint.bytes:,} bytes in {checkpoint.files} files", flush=True)

    def from_checkpoint(db) -> None:
        same_facts(db)
        assert db.recovery.checkpoint == epoch and db.recovery.log_records == 0

    times, db = repeated("restart from the checkpoint", lambda: Engine(spark=spark, state_dir=state_dir),
                         from_checkpoint)
    figures.update(restart_from_checkpoint_s=median(times), restart_from_checkpoint_samples_s=times,
                   restart_from_checkpoint_phases_s=db.recovery.phases, install_after_restart_s=install(db))
    db.close()
    figures["load_over_restart"] = round(figures["load_from_file_s"] / figures["restart_from_checkpoint_s"], 2)
    figures["state_dir_bytes"] = bytes_under(state_dir)
    print(f"  loading from the file takes {figures['load_over_restart']}x a restart from the checkpoint", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12, help="epochs per transaction size and engine")
    parser.add_argument("--copies", type=int, default=4, help="copies of the Facebook graph")
    parser.add_argument("--repeats", type=int, default=3, help="loads and restarts of each kind (medians reported)")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    args = parser.parse_args()
    spark = engine_session()
    print("session:", describe_session(spark), flush=True)
    directory = tempfile.mkdtemp(prefix="factflow-durability-")
    figures: dict = {"session": describe_session(spark), "epochs_per_size": args.epochs}
    try:
        if not args.skip_latency:
            figures["latency"] = latency(spark, args.epochs, directory)
        if not args.skip_load:
            figures["facebook"] = facebook(spark, args.copies, directory, args.repeats)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    report("durability", machine_facts(spark), figures)


if __name__ == "__main__":
    main()
