"""Per-epoch cost of a Parquet diffs sink, against the same epochs without a sink.

Two engines in one session (configured as a default ``factflow.Engine()``'s) each hold
the query ``[:find ?e ?v :where [?e :b/value ?v]]``; one writes it to a Parquet sink in
diffs mode. Both get the same transactions of 1, 100 and 10,000 new facts (so each epoch
changes that many result rows), alternating which engine goes first. Per size it reports
the medians (the first two epochs excluded) of:

- ``no sink``: ``transact`` on the engine without a sink;
- ``sink: transact``: ``transact`` on the engine with the sink (the epoch and its
  delivery; the write runs on the sink's thread, so this is what callers and subscribers
  wait for);
- ``sink: written``: ``transact`` plus ``Query.flush()``, until the epoch's directory is
  in place (what a reader of the sink directory waits for);
- ``write``: the sink's own write (``written - transact``), and its ratio to the epoch
  without a sink, with a trivial Spark job's time for scale.

    python benchmarks/sinks.py [--epochs 10] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

from common import describe_session, engine_session, machine_facts, median, report, timed, trivial_job_seconds

from factflow import Engine, Sink

QUERY = "[:find ?e ?v :where [?e :b/value ?v]]"
SIZES = (1, 100, 10_000)


def engine(spark, sink: str | None):
    db = Engine(spark=spark)
    db.create_attribute(":b/value", type="long")
    q = db.query(QUERY, name="values", sink=Sink(sink) if sink else ())
    return db, q


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None, help="epochs per size (default 10, quick 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 epochs per size")
    args = parser.parse_args()
    epochs = args.epochs or (3 if args.quick else 10)
    spark = engine_session()
    print("session:", describe_session(spark), flush=True)
    directory = tempfile.mkdtemp(prefix="factflow-sink-bench-")
    plain, _ = engine(spark, None)
    sinking, q = engine(spark, directory + "/values")
    figures: dict = {"epochs_per_size": epochs}
    next_entity = 1
    try:
        for size in SIZES:
            without, transact, written = [], [], []
            for i in range(epochs):
                tx = [[":db/add", next_entity + j, ":b/value", j] for j in range(size)]
                next_entity += size

                def with_sink() -> None:
                    seconds, _ = timed(lambda: sinking.transact(tx))
                    flushed, done = timed(q.flush)
                    assert done, "the sink failed to write (see the log)"
                    transact.append(seconds)
                    written.append(seconds + flushed)

                def without_sink() -> None:
                    without.append(timed(lambda: plain.transact(tx))[0])

                for run in ((with_sink, without_sink) if i % 2 else (without_sink, with_sink)):
                    run()
            warm = slice(2, None) if epochs > 2 else slice(None)
            row = {"no_sink_s": median(without[warm]), "sink_transact_s": median(transact[warm]),
                   "sink_written_s": median(written[warm])}
            row["write_s"] = median([w - t for w, t in zip(written[warm], transact[warm])])
            row["written_over_no_sink"] = row["sink_written_s"] / row["no_sink_s"]
            row["transact_over_no_sink"] = row["sink_transact_s"] / row["no_sink_s"]
            figures[str(size)] = {k: round(v, 3) for k, v in row.items()}
            print(f"  {size} changes: no sink {row['no_sink_s']:.3f} s, with sink {row['sink_transact_s']:.3f} s "
                  f"(x{row['transact_over_no_sink']:.2f}), written after {row['sink_written_s']:.3f} s "
                  f"(x{row['written_over_no_sink']:.2f}; write {row['write_s']:.3f} s)", flush=True)
        figures["trivial_spark_job_median_s"] = round(trivial_job_seconds(spark), 4)
        figures["session"] = describe_session(spark)
    finally:
        plain.close()
        sinking.close()
        shutil.rmtree(directory, ignore_errors=True)
    report("sinks" + ("-quick" if args.quick else ""), machine_facts(spark), figures)


if __name__ == "__main__":
    main()
