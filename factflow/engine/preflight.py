"""What an engine checks before it accepts work: that every executor can run factflow's
code and reach the engine's state location.

Index probes, index writes and the worker daemon run factflow's own functions inside Spark
tasks, in whatever Python interpreter Spark starts tasks with: ``spark.pyspark.python`` or
``PYSPARK_PYTHON`` when set, else the ``python3`` first on the executor's ``PATH``. A session
factflow creates points local tasks at the driver's interpreter; a session the user made
(``Engine(spark=...)``), or executors on other machines, may run another one, without
pyarrow, pandas or factflow. And tasks write and read the engine's files (index files,
checkpoint files) in its state location, which on a cluster every executor must see: the
driver's temporary directory, for one, exists on no other host. Without a check the first
query fails deep inside a task with a raw ``PythonException`` or ``FileNotFoundError``.

So an engine first runs :func:`check_executors`: one small Spark job (the RDD API, which
needs nothing but the interpreter) whose tasks reach every executor the driver knows of
(two per executor, each pausing a moment; more rounds while one has none). Each task reports
its host, the interpreter it runs in, its Python version and the version of every module
factflow's tasks import (pyarrow, numpy, pandas, factflow itself, with a digest of
factflow's source), and whether it can use the state location: read a file the driver
wrote there just before (a directory of the same name on another disk does not count),
and write, read and remove one of its own. The driver compares: the same Python minor
version, each module importable and inside the range factflow's package metadata
requires, factflow's source identical to the driver's, the location readable and
writable. A mismatch raises :class:`factflow.errors.ConfigurationError` naming the host,
what is wrong and what to set. Each finding holds for the application (the interpreter)
or for the application and location (the files), so it runs once for each; it is skipped
where it cannot fail: in local mode with the driver's own interpreter and a local path.

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
import uuid
from importlib import metadata
from typing import Iterable, Iterator

from pyspark import cloudpickle
from pyspark.sql import SparkSession

from factflow.arrangement.bound import tasks_in_driver_jvm
from factflow.errors import ConfigurationError
from factflow.storage.location import Location

__all__ = ["check_executors", "task_python", "TASK_MODULES", "source_digest"]

#: The modules factflow's task functions import, besides the standard library and pyspark.
TASK_MODULES = ("pyarrow", "numpy", "pandas", "factflow")
_CHECK_DIRECTORY = ".factflow-check"

_CHECKED: set[tuple[str, str]] = set()  # (application, "python" or a location's URI) found good
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


def check_executors(spark: SparkSession, location: Location) -> None:
    """Refuse (:class:`ConfigurationError`) a session whose executors cannot run factflow's
    code or use ``location`` (see the module docstring); each finding once per application."""
    sc = spark.sparkContext
    local = tasks_in_driver_jvm(sc.master)
    with _CHECKED_LOCK:
        python_known = (sc.applicationId, "python") in _CHECKED or (
            local and _same_interpreter(task_python(spark), sys.executable))
        location_known = (sc.applicationId, location.uri) in _CHECKED or (local and location.is_local)
    if python_known and location_known:
        return
    probe = None
    if not location_known:
        probe = (f"{_CHECK_DIRECTORY}/{uuid.uuid4().hex}", uuid.uuid4().hex)
        try:
            location.makedirs(_CHECK_DIRECTORY)
            location.write(probe[0], probe[1].encode())
        except Exception as exc:  # noqa: BLE001 - the store's client errors, whatever they are
            raise ConfigurationError(f"the driver cannot write to the engine's state location {location}: "
                                     f"{type(exc).__name__}: {exc}") from exc
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        sc.setJobDescription("factflow: check that every executor runs factflow and sees its state location")
        reports = _on_every_executor(sc, _Reporter(location if probe else None, probe), local)
    except Exception as exc:  # noqa: BLE001 - any failure to run Python in a task is the finding
        raise ConfigurationError(
            f"Spark could not run a Python task with {task_python(spark)}: {_first_line(exc)}. "
            f"{_advice()}") from exc
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        sc.setJobDescription(None)
        if probe:
            location.remove(probe[0])
    found = [json.loads(r) for r in reports]
    problems = [p for p in dict.fromkeys(_problem(f) for f in found) if p]
    if problems:
        raise ConfigurationError(f"{'; '.join(problems)}. {_advice()}")
    places = [p for p in dict.fromkeys(_location_problem(f, location) for f in found) if p]
    if places:
        raise ConfigurationError(f"{'; '.join(places)}. Every executor must see the engine's state location: give "
                                 "the engine a state_dir on a path every machine shares (such as an NFS mount) or an "
                                 "object store URI (s3://BUCKET/PATH), with credentials every executor has "
                                 "(storage_options=, or the store's environment on every executor, e.g. "
                                 "spark.executorEnv.AWS_ACCESS_KEY_ID)")
    with _CHECKED_LOCK:
        _CHECKED.add((sc.applicationId, "python"))
        if probe:
            _CHECKED.add((sc.applicationId, location.uri))


def _on_every_executor(sc, reporter: "_Reporter", local: bool) -> list[str]:
    """Run ``reporter`` in tasks until every executor the driver knows has run one: at least
    two tasks per executor (each lingering a moment, so that one executor does not take
    them all), up to three rounds with twice as many tasks each (in local mode one round
    of the application's parallelism)."""
    if local:
        tasks = max(1, sc.defaultParallelism)
        return sc.parallelize(range(tasks), tasks).mapPartitions(reporter).collect()
    driver = sc.getConf().get("spark.driver.host", None)
    expected = {info.host() for info in sc._jsc.sc().statusTracker().getExecutorInfos() if info.host() != driver}
    tasks = max(sc.defaultParallelism, 2 * len(expected), 1)
    reports: list[str] = []
    for _ in range(3):
        reports += sc.parallelize(range(tasks), tasks).mapPartitions(reporter.lingering).collect()
        if expected <= {json.loads(r)["host"] for r in reports}:
            break
        tasks *= 2
    return reports


class _Reporter:
    """The task side: what this interpreter is, which of the task modules it imports, and
    (``location`` given) whether it sees the driver's ``probe`` file there and can write."""

    def __init__(self, location: Location | None, probe: tuple[str, str] | None):
        self.uri = None if location is None else location.uri
        self.options = None if location is None else location.options
        self.probe = probe

    def lingering(self, rows: Iterable[int]) -> Iterator[str]:
        """:meth:`__call__`, after a moment's pause that leaves other executors time to take
        the other tasks."""
        import time

        time.sleep(0.2)
        return self(rows)

    def __call__(self, _: Iterable[int]) -> Iterator[str]:
        import importlib
        import socket
        import sys

        found = {"python": sys.executable, "version": list(sys.version_info[:2]), "host": _task_host(socket),
                 "modules": {}, "digest": None, "location": None}
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
                if self.uri is not None:
                    found["location"] = self._use_location()
            except Exception as exc:  # noqa: BLE001
                found["modules"]["factflow"] = {"error": f"{type(exc).__name__}: {exc}"}
        yield json.dumps(found)

    def _use_location(self) -> dict:
        """Read the driver's probe file, then write, read and remove one of this task's."""
        import uuid as ids

        from factflow.storage.location import Location as Place

        place, (name, content) = Place(self.uri, self.options), self.probe
        try:
            seen = place.read(name).decode()
        except Exception as exc:  # noqa: BLE001 - reported
            return {"error": f"cannot read {place.file(name)}, which the driver wrote just before "
                             f"({type(exc).__name__}: {exc})"}
        if seen != content:
            return {"error": f"{place.file(name)} holds something else than the driver wrote"}
        own = f"{name}-{ids.uuid4().hex}"
        try:
            place.write(own, b"factflow")
            ok = place.read(own) == b"factflow"
            place.remove(own)
        except Exception as exc:  # noqa: BLE001 - reported
            return {"error": f"cannot write there ({type(exc).__name__}: {exc})"}
        return {} if ok else {"error": "a file written there reads back otherwise"}


def _task_host(socket) -> str:
    """In a task: the host its executor announces to the cluster (the ``--hostname`` of the
    executor JVM this worker process descends from, read from ``/proc`` on Linux), else
    ``SPARK_LOCAL_IP``, else the machine's name."""
    pid = os.getpid()
    try:
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                args = handle.read().decode(errors="replace").split("\0")
            if "--hostname" in args and any(a.endswith("CoarseGrainedExecutorBackend") for a in args):
                return args[args.index("--hostname") + 1]
            with open(f"/proc/{pid}/stat") as handle:
                stat = handle.read()
            pid = int(stat[stat.rindex(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return os.environ.get("SPARK_LOCAL_IP") or socket.gethostname()


def _location_problem(found: dict, location: Location) -> str | None:
    """What keeps one task from using the state location, in words (None if nothing)."""
    problem = (found.get("location") or {}).get("error")
    return f"the executor on {found['host']} cannot use the engine's state location {location}: {problem}" \
        if problem else None


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
    """What a failed job's message says went wrong: the Python error a worker printed
    (``ModuleNotFoundError: No module named 'pandas'``) when there is one, and the host
    of the executor whose task failed."""
    text = str(exc).strip()
    python_error = re.search(r"([A-Za-z]+Error: [^)\n]+)", text)
    found = python_error.group(1).strip()[:500] if python_error else (text.splitlines() or [type(exc).__name__])[0][:500]
    host = re.search(r"\((\S+) executor [^)]+\)", text)
    return f"{found} (on {host.group(1)})" if host and host.group(1) != "localhost" else found
