"""TPC-H's tests run in a pytest invocation of their own (``pytest tests/tpch``, which
scripts/test.sh runs after the main suite), with a session whose driver has 4 GiB.

Their engine maintains the 22 TPC-H queries at once: every small epoch plans one Spark
statement of about a thousand subqueries, and Spark's planning of one such statement
holds several hundred MB of the driver's heap while it runs. With the main suite's 2 GiB
driver, the heap held by Spark's plans of earlier tests and these peaks ran it out of
memory (docs/benchmarks.md, "TPC-H")."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from factflow import create_session

    session = create_session(
        "local[2]",
        app_name="factflow-tests-tpch",
        conf={"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()
