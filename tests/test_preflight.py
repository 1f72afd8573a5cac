"""An engine refuses, at start and by name, a session whose tasks run a Python without
factflow's dependencies (the case a new user hit: their own ``SparkSession`` started tasks
with the ``python3`` on ``PATH``, and the first query failed inside a task)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from factflow import ConfigurationError, Engine
from factflow.engine import preflight


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python of the driver's version with nothing installed (no pyarrow, pandas or factflow)."""
    directory = tmp_path_factory.mktemp("bare")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    return str(directory / "bin" / "python")


@pytest.fixture
def tasks_run(spark, monkeypatch):
    """A function making the shared session's new tasks start with another interpreter, as a
    session built with ``spark.pyspark.python`` (or a ``python3`` on ``PATH``) would; the
    check's memory of this application is forgotten meanwhile."""
    monkeypatch.setattr(preflight, "_CHECKED", set())

    def use(python: str) -> None:
        monkeypatch.setattr(spark.sparkContext, "pythonExec", python)

    return use


def test_a_session_whose_tasks_lack_the_dependencies_is_refused_by_name(spark, tasks_run, bare_python):
    tasks_run(bare_python)
    with pytest.raises(ConfigurationError) as refused:
        Engine(spark=spark)
    message = str(refused.value)
    assert bare_python in message and "spark.pyspark.python" in message and "PYSPARK_PYTHON" in message
    assert sys.executable in message  # the interpreter to use instead


def test_the_report_of_a_task_names_what_is_missing_or_different():
    """The comparison on the driver, without Spark: each module missing or out of range, another
    Python version, another factflow."""
    good = {"python": "/opt/py", "version": list(sys.version_info[:2]), "host": "worker-2", "digest":
            preflight.source_digest(), "modules": {"pyarrow": "22.0.0", "numpy": "2.4.6", "pandas": "2.3.3",
                                                   "factflow": "0.1.0"}}
    assert preflight._problem(good) is None
    missing = dict(good, modules=dict(good["modules"], pyarrow={"error": "ModuleNotFoundError: No module named 'pyarrow'"}))
    assert preflight._problem(missing) == ("the Python that Spark runs tasks with on worker-2 (/opt/py) cannot import "
                                           "pyarrow (ModuleNotFoundError: No module named 'pyarrow')")
    if preflight._required("pandas") is not None:  # factflow installed as a distribution
        old = dict(good, modules=dict(good["modules"], pandas="1.5.3"))
        assert "has pandas 1.5.3, factflow needs pandas" in preflight._problem(old)
    other = dict(good, version=[3, 9])
    assert "is Python 3.9" in preflight._problem(other)
    stale = dict(good, digest="0" * 64)
    assert "another factflow than the driver" in preflight._problem(stale)


def test_a_good_interpreter_passes_and_is_checked_once(spark, tasks_run, tmp_path):
    """Another path to a good interpreter (a wrapper script) runs the check, which passes; a
    local session whose tasks run the driver's own interpreter is not checked at all."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    tasks_run(str(wrapper))
    with Engine(spark=spark):
        assert (spark.sparkContext.applicationId, "python") in preflight._CHECKED
    preflight._CHECKED.clear()
    tasks_run(sys.executable)
    with Engine(spark=spark):
        assert preflight._CHECKED == set()  # nothing to check: no job ran


def test_a_state_location_in_an_object_store_is_checked_from_the_tasks(spark, tasks_run, s3):
    """Tasks must reach the store: with the server's options they do (the check passes and
    is remembered for that location); with an endpoint nobody listens on, the engine is
    refused naming the location."""
    tasks_run(sys.executable)
    uri = f"s3://{s3.bucket}/preflight"
    with Engine(spark=spark, state_dir=uri, storage_options=s3.storage_options()):
        assert (spark.sparkContext.applicationId, uri) in preflight._CHECKED
    unreachable = dict(s3.storage_options(), endpoint_url="http://127.0.0.1:9")
    with pytest.raises(ConfigurationError, match="cannot write to the engine's state location s3://factflow/elsewhere"):
        Engine(spark=spark, state_dir=f"s3://{s3.bucket}/elsewhere", storage_options=unreachable)


def test_a_task_that_cannot_see_the_drivers_file_is_named_with_its_host():
    """The driver's side of the location check, without Spark."""
    from factflow.storage.location import Location

    found = {"host": "127.0.0.2", "location": {"error": "cannot read /tmp/x/.factflow-check/1 (FileNotFoundError)"}}
    assert preflight._location_problem(found, Location("/tmp/x")) == (
        "the executor on 127.0.0.2 cannot use the engine's state location /tmp/x: cannot read "
        "/tmp/x/.factflow-check/1 (FileNotFoundError)")
    assert preflight._location_problem({"host": "h", "location": {}}, Location("/tmp/x")) is None
