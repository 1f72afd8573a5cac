"""The process the kill tests kill: streams transactions into a durable engine and says what it did.

    python durable_child.py STATE_DIR STREAM_JSON CHECKPOINT_INTERVAL

Opens ``Engine(state_dir=STATE_DIR)`` (its own Spark), defines the schema and rules of the
differential tests (a no-op after the first run), installs two queries so epochs do query
work, says it is ready, and applies the transactions of ``STREAM_JSON`` (a JSON list) with source ``feed``
and offset = position, from the position after the recovered offset. Every line it prints
is flushed: ``ready <epoch> <next position>``, then per transaction ``begin <position>``
and, once ``transact`` returned, ``ack <position> <epoch>``. Now and then it replays the
previous transaction, which must be skipped (``replay <position> <epoch>``).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from factflow import Engine, EngineConfig  # noqa: E402
from durable import define  # noqa: E402


def main() -> None:
    state_dir, stream_path, interval = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(stream_path) as handle:
        stream = json.load(handle)
    db = Engine(master="local[2]", state_dir=state_dir, config=EngineConfig(checkpoint_interval=interval))
    define(db)
    start = db.offsets().get("feed", -1) + 1
    db.query("[:find ?a ?c :where [?a :d/friend ?b] [?b :d/friend ?c]]")
    db.query("[:find ?n (count ?e) :where [?e :d/name ?n]]")
    print(f"ready {db.epoch} {start}", flush=True)
    for position in range(start, len(stream)):
        print(f"begin {position}", flush=True)
        epoch = db.transact(stream[position], source="feed", offset=position)
        print(f"ack {position} {epoch}", flush=True)
        if position % 5 == 4:
            again = db.transact(stream[position], source="feed", offset=position)
            print(f"replay {position} {again}", flush=True)
    print("done", flush=True)
    db.close()


if __name__ == "__main__":
    main()
