"""What an engine checks before it accepts work: that Spark's tasks can run factflow's code.

Index probes, index writes and the worker daemon run factflow's own functions inside Spark
tasks, in whatever Python interpreter Spark starts tasks with: ``spark.pyspark.python`` or
``PYSPARK_PYTHON`` when set, else the ``python3`` first on the executor's ``PATH``. A session
factflow creates points local tasks at the driver's interpreter; a session the user made
(``Engine(spark=...)``), or executors on other machines, may run another one, without
pyarrow, pandas or factflow. Without a check the first query fails deep inside a task with
a raw ``PythonException`` and background merges log tracebacks.

So an engine first runs :func:`check_task_python`: one small Spark job (the RDD API, which
needs nothing but the interpreter) whose tasks report the interpreter they run in, its
Python version, and the version of every module factflow's tasks import (pyarrow, numpy,
pandas, factflow itself, with a digest of factflow's source). The driver compares them
with its own: the same Python minor version, each module importable and inside the range
factflow's package metadata requires, factflow's source identical to the driver's. A
mismatch raises :class:`factflow.errors.ConfigurationError` naming the host, the
interpreter, what is wrong and what to set. The check runs once per Spark application,
and is skipped where it cannot fail: a local session whose tasks run the driver's own
interpreter.

The task function is pickled by value (``register_pickle_by_value``) and imports only the
standard library before it looks for the others, so it runs in any Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from importlib import metadata
from typing import Iterable, Iterator

from pyspark import cloudpickle
from pyspark.sql import SparkSession

from factflow.errors import ConfigurationError

__all__ = ["check_task_python", "task_python", "TASK_MODULES", "source_digest"]

#: The modules factflow's task functions import, besides the standard library and pyspark.
TASK_MODULES = ("pyarrow", "numpy", "pandas", "factflow")

_CHECKED: set[str] = set()
_CHECKED_LOCK = threading.Lock()


def source_digest() -> str:
    """SHA-256 of factflow's Python source files (paths and contents): two interpreters with
    the same digest run the same factflow code."""
    import factflow

    root = os.path.dirname(factflow.__file__)
    digest = hashlib.sha256()
    for directory, subdirectories, files in os.walk(root):
        subdirectories.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                digest.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as handle:
                    digest.update(hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()


def task_python(spark: SparkSession) -> str:
    """The interpreter the driver asks Spark to start tasks with (``spark.pyspark.python``,
    else ``PYSPARK_PYTHON``, else ``python3``, as PySpark decided when the session started;
    executors may override it)."""
    return spark.sparkContext.pythonExec or "python3"


def check_task_python(spark: SparkSession) -> None:
    """Refuse (:class:`ConfigurationError`) a session whose tasks cannot run factflow's code;
    once per Spark application, and not at all for a local session whose tasks run the
    driver's own interpreter (see the module docstring)."""
    sc = spark.sparkContext
    with _CHECKED_LOCK:
        if sc.applicationId in _CHECKED:
            return
    if sc.master.startswith("local") and _same_interpreter(task_python(spark), sys.executable):
        with _CHECKED_LOCK:
            _CHECKED.add(sc.applicationId)
        return
    tasks = max(1, sc.defaultParallelism)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        sc.setJobDescription("factflow: check the Python that tasks run with")
        reports = sc.parallelize(range(tasks), tasks).mapPartitions(_report).collect()
    except Exception as exc:  # noqa: BLE001 - any failure to run Python in a task is the finding
        raise ConfigurationError(
            f"Spark could not run a Python task with {task_python(spark)}: {_first_line(exc)}. "
            f"{_advice()}") from exc
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        sc.setJobDescription(None)
    problems = [p for p in dict.fromkeys(_problem(json.loads(r)) for r in reports) if p]
    if problems:
        raise ConfigurationError(f"{'; '.join(problems)}. {_advice()}")
    with _CHECKED_LOCK:
        _CHECKED.add(sc.applicationId)


def _report(_: Iterable[int]) -> Iterator[str]:
    """The task side: what this interpreter is and which of the task modules it imports."""
    import importlib
    import os
    import socket
    import sys

    found = {"python": sys.executable, "version": list(sys.version_info[:2]),
             "host": os.environ.get("SPARK_LOCAL_IP") or socket.gethostname(), "modules": {}, "digest": None}
    for name in TASK_MODULES:
        try:
            module = importlib.import_module(name)
            found["modules"][name] = getattr(module, "__version__", "")
        except Exception as exc:  # noqa: BLE001 - reported, whatever it is
            found["modules"][name] = {"error": f"{type(exc).__name__}: {exc}"}
    if isinstance(found["modules"].get("factflow"), str):
        try:
            from factflow.engine.preflight import source_digest as digest

            found["digest"] = digest()
        except Exception as exc:  # noqa: BLE001
            found["modules"]["factflow"] = {"error": f"{type(exc).__name__}: {exc}"}
    yield json.dumps(found)


def _problem(found: dict) -> str | None:
    """What is wrong with one task's report, in words (None if nothing)."""
    where = f"the Python that Spark runs tasks with on {found['host']} ({found['python']})"
    version = tuple(found["version"])
    if version != sys.version_info[:2]:
        return (f"{where} is Python {'.'.join(map(str, version))}, the driver Python "
                f"{'.'.join(map(str, sys.version_info[:2]))} (PySpark needs the same minor version)")
    wrong = []
    for name in TASK_MODULES:
        value = found["modules"].get(name)
        if not isinstance(value, str):
            wrong.append(f"cannot import {name} ({value['error']})")
            continue
        needed = _required(name)
        if needed is not None and value and not needed.contains(value, prereleases=True):
            wrong.append(f"has {name} {value}, factflow needs {name}{needed}")
    if not wrong and found["digest"] != source_digest():
        wrong.append("has another factflow than the driver (its source differs); install the driver's version")
    return f"{where} {', '.join(wrong)}" if wrong else None


def _required(name: str):
    """The version range factflow's package metadata requires of ``name`` (None if it
    names none, or factflow is not installed as a distribution)."""
    if name == "factflow":
        return None
    from packaging.requirements import Requirement

    try:
        requirements = metadata.requires("factflow") or []
    except metadata.PackageNotFoundError:
        return None
    for text in requirements:
        requirement = Requirement(text)
        if requirement.name == name and requirement.marker is None:
            return requirement.specifier
    return None


def _advice() -> str:
    return (f"Set spark.pyspark.python (or PYSPARK_PYTHON, on every executor) to an interpreter with factflow and "
            f"its dependencies installed, such as the driver's: {sys.executable}")


def _same_interpreter(a: str, b: str) -> bool:
    """Whether the interpreter paths ``a`` and ``b`` are the same path. Not the same file:
    every virtual environment's ``python`` is a link to one base interpreter, and what
    it imports depends on the environment the link is in."""
    return os.path.abspath(a) == os.path.abspath(b)


def _first_line(exc: BaseException) -> str:
    """The line of a failed job's message that says why: the Python error a worker printed
    (``ModuleNotFoundError: No module named 'pandas'``) when there is one."""
    text = str(exc).strip()
    python_error = re.search(r"^\s*([A-Za-z]+Error: .+)$", text, re.MULTILINE)
    if python_error:
        return python_error.group(1).strip()[:500]
    return text.splitlines()[0][:500] if text else type(exc).__name__
