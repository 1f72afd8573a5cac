"""One SparkSession for the whole test run (local mode, small memory and shuffles)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def spark():
    from factflow import create_session

    session = create_session(
        "local[2]",
        app_name="factflow-tests",
        conf={"spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()


@pytest.fixture
def engine(spark):
    from factflow import Engine

    db = Engine(spark=spark)
    yield db
    db.close()


@pytest.fixture
def people(engine):
    """An engine with a small person schema."""
    engine.create_attribute(":person/name", type="string", semantics="one")
    engine.create_attribute(":person/age", type="long", semantics="one")
    engine.create_attribute(":person/knows", type="ref")
    engine.create_attribute(":person/tag", type="string", semantics="raw")
    return engine
