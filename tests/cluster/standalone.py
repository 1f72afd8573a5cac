"""A real Spark standalone cluster on this machine whose workers stand in for separate
hosts, and an S3-compatible server, for tests and benchmarks.

No pytest here: a benchmark puts this directory on ``sys.path`` and imports the module::

    sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
    from standalone import S3Server, StandaloneCluster

    with S3Server() as s3, StandaloneCluster() as cluster:
        spark = factflow.create_session(cluster.master_url, conf={**cluster.session_conf(), **s3.executor_conf()})

:class:`StandaloneCluster` runs a master on 127.0.0.1 and N workers from the pip-installed
pyspark (``SPARK_HOME`` is the package directory). Each worker is what another host would
be, as far as Spark and factflow can tell:

- its own loopback address, 127.0.0.2, 127.0.0.3, ... (``--host`` and ``SPARK_LOCAL_IP``),
  which its executors bind to and announce. Spark then treats the executors as being on
  different hosts: with one shared host name an executor reads another's shuffle files
  straight from its disk, which no second machine could;
- its own ``/tmp``: it runs in a new mount namespace (``unshare --mount``) with a tmpfs
  over ``/tmp``, so it sees neither the driver's ``/tmp`` nor another worker's, and its
  executors keep their block manager and shuffle files there, as on a host of their own.

Everything else (``/work``, the venv, :attr:`StandaloneCluster.shared_dir`) is shared, as a
network file system mounted at the same path on every host would be. The cluster's files
(configuration, logs, the workers' work directories with the executors' logs, the shared
directory) are in its base directory, which must not be under ``/tmp``.

:class:`S3Server` runs moto's S3 server on a free port of 127.0.0.1 in a process of its own
and creates a bucket; :meth:`S3Server.env` is the environment a client needs and
:meth:`S3Server.executor_conf` passes it to executors (``spark.executorEnv.*``).

Processes are started with a parent-death signal (``setpriv --pdeathsig KILL``): if the
process that started them dies, even by SIGKILL, the master, the workers and moto die
too (executors follow their worker). Start them from a thread that lives as long as they
should (the main thread, as pytest's session fixtures do): the signal follows the thread.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable, TypeVar

__all__ = ["ClusterUnavailable", "S3Server", "StandaloneCluster", "check_namespaces", "executor_hosts",
           "wait_for_executors"]

#: The pip-installed pyspark package: Spark's jars and ``bin/spark-class`` are in it.
SPARK_HOME = Path(importlib.util.find_spec("pyspark").origin).parent
#: the project's checkout (its venv and the factflow package the executors import)
CHECKOUT = Path(__file__).resolve().parents[2]

T = TypeVar("T")

#: Where the driver runs, and the master.
DRIVER_HOST = "127.0.0.1"

#: Set in the environment of every process the cluster starts; their descendants inherit
#: it (executors and their Python workers too), so :meth:`StandaloneCluster.processes`
#: finds them even once their parent is gone.
MARKER = "FACTFLOW_TEST_CLUSTER"

#: Log levels of the master, the workers and the executors: Spark's warnings, and what the
#: master and workers say about registrations, executors and lost workers.
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
logger.deploy.name = org.apache.spark.deploy
logger.deploy.level = info
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""


class ClusterUnavailable(RuntimeError):
    """This machine cannot run the cluster (no ``unshare``, or mount namespaces are not permitted)."""


def check_namespaces() -> None:
    """Raise :class:`ClusterUnavailable`, saying why, unless this process can start a command
    in a new mount namespace with a tmpfs of its own over ``/tmp`` (root or CAP_SYS_ADMIN)."""
    for tool in ("unshare", "setpriv"):
        if shutil.which(tool) is None:
            raise ClusterUnavailable(f"the '{tool}' command (util-linux) is not installed; the cluster's workers "
                                     "need it to get a private /tmp (apt-get install util-linux)")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs factflow-probe /tmp"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        raise ClusterUnavailable("cannot give a worker a private /tmp: 'unshare --mount' with a tmpfs mounted over "
                                 f"/tmp failed ({probe.stderr.strip() or f'exit status {probe.returncode}'}); "
                                 "this needs root or CAP_SYS_ADMIN (mount namespaces)")


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on this machine, each worker as if
    on a host of its own (see the module's docstring).

    Worker ``i`` runs at :meth:`worker_host` ``(i)`` = 127.0.0.(2+i) with one core and
    ``worker_memory``; :meth:`session_conf` gives every worker one executor of
    ``executor_memory``. Executors' Python workers run ``python`` (this interpreter by
    default, the venv's). ``tmp_size`` bounds each worker's ``/tmp`` (a tmpfs, in memory).

    ``base_dir`` holds the cluster's files; by default a new directory under ``/var/tmp``,
    removed by :meth:`stop` (a given one is kept, with its logs).
    """

    def __init__(self, workers: int = 2, *, base_dir: str | os.PathLike | None = None, worker_memory: str = "3g",
                 executor_memory: str = "2g", daemon_memory: str = "512m", tmp_size: str = "2g",
                 python: str = sys.executable) -> None:
        if not 1 <= workers <= 250:
            raise ValueError(f"workers must be between 1 and 250, not {workers}")
        self.workers = workers
        self.worker_memory = worker_memory
        self.executor_memory = executor_memory
        self.daemon_memory = daemon_memory
        self.tmp_size = tmp_size
        self.python = python
        self._owns_base_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="factflow-cluster-", dir="/var/tmp")).resolve()
        if self.base_dir == Path("/tmp") or Path("/tmp") in self.base_dir.parents:
            raise ValueError(f"the cluster's base directory {self.base_dir} is under /tmp, which its workers do "
                             "not see; give one elsewhere")
        self.master_url: str | None = None
        self.master_ui_url: str | None = None
        #: Seconds :meth:`start` took, from the first process started until every worker had registered.
        self.start_seconds: float | None = None
        self._master: subprocess.Popen | None = None
        self._workers: dict[int, subprocess.Popen] = {}

    # -- paths -----------------------------------------------------------------------------

    @property
    def shared_dir(self) -> Path:
        """A directory the driver, every worker and every executor see at this same path."""
        return self.base_dir / "shared"

    @property
    def log_dir(self) -> Path:
        """The master's and the workers' logs (``master.log``, ``worker-<i>.log``)."""
        return self.base_dir / "logs"

    def work_dir(self, i: int) -> Path:
        """Worker ``i``'s work directory: its executors' logs, ``app-*/<executor id>/stderr``."""
        return self.base_dir / f"worker-{i}"

    @staticmethod
    def worker_host(i: int) -> str:
        """Worker ``i``'s address, which its executors bind to: 127.0.0.(2+i)."""
        return f"127.0.0.{2 + i}"

    # -- life cycle ------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> "StandaloneCluster":
        """Start the master, then every worker, and wait until all have registered.

        Raises :class:`ClusterUnavailable` if workers cannot get a private ``/tmp``, and
        :class:`TimeoutError` (with the end of the logs) if the cluster is not up in ``timeout`` s.
        """
        if self._master is not None:
            raise RuntimeError("the cluster is started already")
        began = time.monotonic()
        try:
            check_namespaces()
            for directory in (self.base_dir / "conf", self.log_dir, self.shared_dir):
                directory.mkdir(parents=True, exist_ok=True)
            (self.base_dir / "conf" / "log4j2.properties").write_text(_LOG4J2)
            self._start_master(began + timeout)
            for i in range(self.workers):
                self.start_worker(i)
            self.wait_for_workers(self.workers, timeout=max(1.0, began + timeout - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Kill the master, the workers, their executors and Python workers (SIGKILL), and
        check that none of them is left; remove the base directory if the cluster made it.

        Raises :class:`RuntimeError` naming the processes still alive after 30 s."""
        for i in list(self._workers):
            self.kill_worker(i)
        if self._master is not None:
            _kill_tree(self._master)
            self._master = None
        for pid in self.processes():  # orphans whose parent died before them
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            raise RuntimeError(f"processes of the cluster in {self.base_dir} still run after SIGKILL: {left}")
        self.master_url = self.master_ui_url = None
        if self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def processes(self, worker: int | None = None) -> list[int]:
        """The ids of the live processes this cluster started, directly or not: master,
        workers, executors, Python daemons and workers (zombies not counted); or only
        those of worker ``worker`` (the worker, its executors and their Python processes)."""
        wanted = {f"{MARKER}={self.base_dir}".encode()}
        if worker is not None:
            wanted.add(f"SPARK_LOCAL_IP={self.worker_host(worker)}".encode())
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if wanted <= set((entry / "environ").read_bytes().split(b"\0")):
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or a zombie
                continue
        return found

    # -- master and workers ----------------------------------------------------------------

    def _environment(self, host: str) -> dict[str, str]:
        """The environment of the master or a worker that binds to ``host``: this process's,
        without its Spark, PySpark and AWS settings (another host would not have them; a
        driver gives executors what they need with ``spark.executorEnv.*``)."""
        inherited = {key: value for key, value in os.environ.items()
                     if not key.startswith(("SPARK_", "PYSPARK_", "AWS_"))}
        return {**inherited, "SPARK_HOME": str(SPARK_HOME), "SPARK_CONF_DIR": str(self.base_dir / "conf"),
                "SPARK_LOCAL_IP": host, "SPARK_DAEMON_MEMORY": self.daemon_memory,
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false", MARKER: str(self.base_dir)}

    def _spawn(self, command: list[str], host: str, log_name: str) -> subprocess.Popen:
        """Start ``command`` in a session of its own, killed if this thread dies, logging to ``log_name``."""
        with open(self.log_dir / log_name, "ab") as log:
            return subprocess.Popen(["setpriv", "--pdeathsig", "KILL", *command], env=self._environment(host),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def _start_master(self, deadline: float) -> None:
        """Start the master on free ports of 127.0.0.1 (the master picks them: no race) and
        read its URLs from its log."""
        log = self.log_dir / "master.log"
        offset = log.stat().st_size if log.exists() else 0
        self._master = self._spawn([str(SPARK_HOME / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
                                    "--host", DRIVER_HOST, "--port", "0", "--webui-port", "0"], DRIVER_HOST,
                                   "master.log")
        patterns = (re.compile(r"Starting Spark master at (spark://\S+)"),
                    re.compile(r"Bound MasterWebUI to \S+, and started at (http://\S+)"))

        def announced() -> tuple[str, ...] | None:
            text = log.read_bytes()[offset:].decode(errors="replace")
            found = tuple(match.group(1) for pattern in patterns if (match := pattern.search(text)))
            return found if len(found) == len(patterns) else None

        found = _wait_for(announced, deadline - time.monotonic(), self._master, lambda: _tail(log))
        self.master_url, self.master_ui_url = found

    def start_worker(self, i: int) -> None:
        """Start worker ``i`` (again, after :meth:`kill_worker`) at :meth:`worker_host` ``(i)``,
        in a mount namespace of its own with a fresh, empty tmpfs over ``/tmp``. Returns at
        once; :meth:`wait_for_workers` waits for it to register."""
        if self.master_url is None:
            raise RuntimeError("start the cluster first")
        if not 0 <= i < self.workers:
            raise ValueError(f"there is no worker {i} in a cluster of {self.workers}")
        if i in self._workers:
            raise RuntimeError(f"worker {i} runs already")
        host = self.worker_host(i)
        self.work_dir(i).mkdir(exist_ok=True)
        # what the worker runs from and is under /tmp (a checkout there: its venv holds Spark,
        # the interpreter and factflow) is set aside before the tmpfs hides it, then bound back
        kept = _under_tmp(CHECKOUT, SPARK_HOME, Path(sys.prefix))
        holds = [self.base_dir / f"kept-{i}-{j}" for j in range(len(kept))]
        for hold in holds:
            hold.mkdir(exist_ok=True)
        aside = "".join(f"mount --bind {shlex.quote(str(p))} {shlex.quote(str(h))} && " for p, h in zip(kept, holds))
        back = "".join(f"mkdir -p {shlex.quote(str(p))} && mount --bind {shlex.quote(str(h))} {shlex.quote(str(p))} && "
                       for p, h in zip(kept, holds))
        private_tmp = (f"{aside}mount -t tmpfs -o size={shlex.quote(self.tmp_size)},mode=1777 factflow-worker-tmp /tmp "
                       f'&& {back}exec "$@"')
        worker = [str(SPARK_HOME / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
                  "--host", host, "--cores", "1", "--memory", self.worker_memory, "--work-dir", str(self.work_dir(i)),
                  "--webui-port", "0", self.master_url]
        self._workers[i] = self._spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", private_tmp,
                                        f"worker-{i}", *worker], host, f"worker-{i}.log")

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i``, its executors and their Python processes at once, as a
        machine failure would (nothing is told, nothing cleaned up); its private ``/tmp``,
        with the executors' shuffle files, goes with them."""
        process = self._workers.pop(i, None)
        if process is None:
            raise RuntimeError(f"worker {i} does not run")
        _kill_tree(process)
        for pid in self.processes(worker=i):  # executors of a worker that had died already
            _signal(pid, signal.SIGKILL)

    def wait_for_workers(self, n: int, timeout: float = 60) -> list[str]:
        """Wait until exactly ``n`` workers are alive according to the master; returns their hosts, sorted.

        A worker killed by :meth:`kill_worker` leaves the master's list as soon as the
        master notices its connection is gone (at once on this machine)."""
        deadline = time.monotonic() + timeout
        while True:
            hosts = sorted(w["host"] for w in self.master_state()["workers"] if w["state"] == "ALIVE")
            if len(hosts) == n:
                return hosts
            for i, process in self._workers.items():
                self._check_alive(process, f"worker {i}", f"worker-{i}.log")
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{_tail(p)}" for p in sorted(self.log_dir.glob("*.log")))
                raise TimeoutError(f"{len(hosts)} workers alive ({hosts}) after {timeout:.0f} s, not {n}; "
                                   f"the ends of the logs:\n{logs}")
            time.sleep(0.1)

    def master_state(self) -> dict:
        """The master's state as its web UI reports it in JSON (workers, applications)."""
        with urllib.request.urlopen(f"{self.master_ui_url}/json/", timeout=10) as response:
            return json.load(response)

    def _check_alive(self, process: subprocess.Popen, name: str, log_name: str) -> None:
        """Raise :class:`RuntimeError` with the end of its log if ``process`` has exited."""
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with status {process.returncode}; the end of its log:\n"
                               f"{_tail(self.log_dir / log_name)}")

    # -- the driver's side -----------------------------------------------------------------

    def session_conf(self) -> dict[str, str]:
        """The Spark settings a driver on this machine needs for this cluster: it binds to
        127.0.0.1, and every worker runs one executor of one core.

        Which Python executors run is not a setting of a session started from Python:
        PySpark's driver sends the interpreter its ``PYSPARK_PYTHON`` environment variable
        names with every Python function, and executors start that (checked: with
        ``PYSPARK_PYTHON=/usr/bin/python3`` and ``spark.pyspark.python`` naming the venv's,
        tasks ran ``/usr/bin/python3``). ``factflow.create_session`` sets the variable to its
        own ``sys.executable`` (the venv's) unless it is set. ``spark.pyspark.python``, set
        here to :attr:`python`, counts for drivers that ``spark-submit`` starts."""
        if self.master_url is None:
            raise RuntimeError("start the cluster first")
        return {"spark.driver.host": DRIVER_HOST, "spark.driver.bindAddress": DRIVER_HOST,
                "spark.executor.cores": "1", "spark.executor.memory": self.executor_memory,
                "spark.pyspark.python": self.python}


def executor_hosts(spark) -> list[str]:
    """The hosts of the executors ``spark``'s driver knows of (one entry per executor, sorted)."""
    driver = spark.sparkContext.getConf().get("spark.driver.host")
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return sorted(info.host() for info in infos if info.host() != driver)


def wait_for_executors(spark, n: int, timeout: float = 60) -> list[str]:
    """Wait until ``spark``'s driver has exactly ``n`` executors; returns their hosts, sorted."""
    deadline = time.monotonic() + timeout
    while len(hosts := executor_hosts(spark)) != n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the driver has {len(hosts)} executors ({hosts}) after {timeout:.0f} s, not {n}")
        time.sleep(0.1)
    return hosts


class S3Server:
    """moto's S3 server (``python -m moto.server``) on a free port of 127.0.0.1, in a
    process of its own, with one bucket, ``bucket``.

    Any process on this machine reaches it over TCP: the driver, and executors in their
    own mount namespaces. Its objects live in its memory and go with it. Credentials are
    not checked; any key works.
    """

    REGION = "us-east-1"

    def __init__(self, bucket: str = "factflow", python: str = sys.executable) -> None:
        self.bucket = bucket
        self.python = python
        self.endpoint_url: str | None = None
        self._process: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    def start(self, timeout: float = 60) -> "S3Server":
        """Start the server, wait until it answers, and create the bucket."""
        if self._process is not None:
            raise RuntimeError("the S3 server is started already")
        # werkzeug binds the free port the kernel picks for port 0, then names it in its log.
        self._process = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", self.python, "-m", "moto.server", "-H", DRIVER_HOST, "-p", "0"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.endpoint_url = _wait_for(self._announced_url, timeout, self._process, self._log_text)
            import boto3  # moto's own dependency
            boto3.client("s3", **self.client_kwargs()).create_bucket(Bucket=self.bucket)
        except BaseException:
            self.stop()
            raise
        return self

    def _announced_url(self) -> str | None:
        """The server's URL, once its log names it."""
        match = re.search(r"Running on (http://[\d.]+:\d+)", self._log_text())
        return match.group(1) if match else None

    def _log_text(self) -> str:
        """What the server has logged so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def stop(self) -> None:
        """Kill the server (its objects are gone with it)."""
        if self._process is not None:
            _kill_tree(self._process)
            self._process = None
        self.endpoint_url = None

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """The environment variables an S3 client needs to use this server: credentials,
        ``AWS_ENDPOINT_URL`` (honoured by boto3 and by ``pyarrow.fs.FileSystem.from_uri``;
        ``pyarrow.fs.S3FileSystem()`` ignores it and needs ``endpoint_override``) and ``AWS_REGION``."""
        if self.endpoint_url is None:
            raise RuntimeError("start the S3 server first")
        return {"AWS_ACCESS_KEY_ID": "factflow-test", "AWS_SECRET_ACCESS_KEY": "factflow-test",
                "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_REGION": self.REGION}

    def executor_conf(self) -> dict[str, str]:
        """Spark settings that give every executor :meth:`env` (``spark.executorEnv.*``)."""
        return {f"spark.executorEnv.{key}": value for key, value in self.env().items()}

    def storage_options(self) -> dict[str, str]:
        """:meth:`env` as factflow's ``storage_options`` (for processes whose environment
        cannot be set, such as the Python workers of a local session already started)."""
        env = self.env()
        return {"endpoint_url": env["AWS_ENDPOINT_URL"], "access_key": env["AWS_ACCESS_KEY_ID"],
                "secret_key": env["AWS_SECRET_ACCESS_KEY"], "region": env["AWS_REGION"]}

    def client_kwargs(self) -> dict[str, str]:
        """:meth:`env` as keyword arguments of ``boto3.client("s3", ...)``."""
        env = self.env()
        return {"endpoint_url": env["AWS_ENDPOINT_URL"], "region_name": env["AWS_REGION"],
                "aws_access_key_id": env["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"]}


# -- processes -------------------------------------------------------------------------------

def _children() -> dict[int, list[int]]:
    """Every process's children, by parent id (from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2:].split()[1])  # after "pid (comm) state"
            children.setdefault(parent, []).append(int(entry.name))
    return children


def _signal(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` unless it is gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL ``process`` and all its descendants at once, and reap it.

    The tree is frozen first (SIGSTOP, repeated until no new child appears), so that no
    process forks or is re-parented while it is being killed. A ``process`` that has exited
    and been reaped already is left alone: its id may be another process's by now."""
    stopped: set[int] = set()
    while process.poll() is None:
        children = _children()
        tree, todo = set(), [process.pid]
        while todo:
            pid = todo.pop()
            tree.add(pid)
            todo.extend(children.get(pid, []))
        if not tree - stopped:
            break
        for pid in tree - stopped:
            _signal(pid, signal.SIGSTOP)
        stopped |= tree
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    process.wait()


def _wait_for(probe: Callable[[], T | None], timeout: float, process: subprocess.Popen,
              log: Callable[[], str]) -> T:
    """Poll ``probe`` until it returns a value; fail if ``process`` exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while (value := probe()) is None:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with status {process.returncode}:\n{log()[-4000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{process.args} did not come up in {timeout:.0f} s:\n{log()[-4000:]}")
        time.sleep(0.05)
    return value


def _tail(path: Path, size: int = 4000) -> str:
    """The last ``size`` characters of the file at ``path``."""
    try:
        return path.read_bytes()[-size:].decode(errors="replace")
    except OSError as exc:
        return f"({exc})"


def _under_tmp(*paths: Path) -> list[Path]:
    """The outermost of ``paths`` that lie under ``/tmp`` (a worker's private ``/tmp`` hides them)."""
    found = sorted({p.resolve() for p in paths if Path("/tmp") in p.resolve().parents})
    return [p for p in found if not any(q in p.parents for q in found)]
