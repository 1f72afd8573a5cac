"""TPC-H's tests run in a pytest invocation of their own (``pytest tests/tpch``, which
scripts/test.sh runs after the main suite), with a session of their own whose driver has
the default 2 GiB.

Their engine maintains the 22 TPC-H queries at once: every small epoch plans Spark
statements of thousands of operators, and Spark's planning of one such statement holds
hundreds of MB of the driver's heap while it runs; beside the heap held by the main
suite's earlier tests it ran a 2 GiB driver out of memory. On its own, a default 2 GiB
driver carries the stream (live heap after GC at most about 520 MiB; docs/benchmarks.md,
"TPC-H")."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from factflow import create_session

    session = create_session(
        "local[2]",
        app_name="factflow-tests-tpch",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()
