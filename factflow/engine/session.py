"""Creating the SparkSession an embedded engine runs on, after checking for Java 17+.

Engines created without a session share one (``getOrCreate``): :func:`acquire_session`
counts the engines on a session factflow started, and :func:`release_session` stops it
with the last of them. A session factflow did not start (the caller's, or one made with
:func:`create_session` directly) is used as it is and never stopped by factflow.

A driver factflow starts exits when its JVM runs out of heap (``-XX:+ExitOnOutOfMemoryError``,
unless the user's driver options say what to do then): Spark's task-result-getter thread
dies of an OutOfMemoryError, and the job whose result it was reading then never ends, nor
the Python call waiting for it. Once the JVM is gone that call fails instead, and an
engine whose driver is gone (:func:`driver_alive`) closes itself.

In local mode, threads that run an engine's jobs compile Spark's generated code once, not
twice: they share the class loader of Spark's tasks (:func:`share_task_class_loader`).

A session factflow creates is quiet: Spark logs errors only (``FACTFLOW_SPARK_LOG=WARN``,
``INFO``, ... shows more) through the log4j2 configuration shipped next to this module,
and a local driver binds to 127.0.0.1 instead of warning that the hostname resolves to a
loopback address. Settings the user gives (``conf``, ``SPARK_LOCAL_IP``) take precedence.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Iterator

from pyspark import SparkContext
from pyspark.sql import SparkSession

from factflow.arrangement import bound
from factflow.errors import FactflowError

log = logging.getLogger("factflow.engine")

__all__ = ["DEFAULT_SPARK_CONF", "REQUIRED_SQL_CONF", "START_UP_SETTINGS", "LOG_LEVEL_VARIABLE", "acquire_session",
           "check_java", "create_session", "driver_alive", "label_jobs", "missing_start_up_settings",
           "release_session", "share_task_class_loader", "warn_of_missing_start_up_settings"]

#: SQL settings every engine applies to its session, given or created. Constraint
#: propagation is off because Spark 4.1 fails on it ("key not found" while rewriting a
#: Union's constraints) for the statements factflow generates over checkpointed batches,
#: and because inferring constraints over plans of hundreds of operators costs planning time.
#: Spark's SQL parser (ANTLR) caches what it learns from every statement and never forgets
#: by default; an engine's statements differ from epoch to epoch (inline rows, new batches),
#: and over a long run the cache grew to about 450 MB of a 2 GiB driver heap. Spark then
#: manages it instead and empties it once its estimate passes 10% of the driver's memory.
REQUIRED_SQL_CONF = {
    "spark.sql.constraintPropagation.enabled": "false",
    "spark.sql.parser.manageParserCaches": "true",
    "spark.sql.parser.parserDfaCacheFlushRatio": "10",
}

_POOLS = Path(__file__).resolve().with_name("fairscheduler.xml")

_CLASS_PATH = "spark.driver.extraClassPath"

#: Python workers talk to their executor over a Unix domain socket where the platform has
#: them. Over Spark's default (TCP on the loopback) every task that runs Python waited about
#: 40 ms for its first rows (an identity ``mapInArrow`` over one row: 39-44 ms between the
#: function's call and its first batch, against 0.2-4 ms over a Unix socket; such a job took
#: 85-150 ms against 65-100 ms), and every probe and index write is such a task.
_UNIX_SOCKETS = {"spark.python.unix.domain.socket.enabled": "true"} if hasattr(socket, "AF_UNIX") else {}

#: Settings for an engine-owned session: small shuffles, Arrow transfers, UTC, no UI, and
#: a driver GC every minute: Spark frees the broadcasts and local relations of finished
#: statements only once the JVM has collected them, and a recursive epoch issues hundreds
#: of such statements on a large heap that rarely needs a GC (a long grid150 probe ran out
#: of driver memory with Spark's default of 30 minutes, and finished with 1 minute).
#: A collect may bring at most 512 MiB to the driver (a quarter of its heap): past that
#: Spark fails the job, and the engine keeps the rows in Spark instead. Spark checks this
#: once a task's result has arrived, so it cannot stop one task result larger than the
#: heap; the engine bounds its fetches in rows for that (``EngineConfig.fetch_limit``, see
#: :mod:`factflow.engine.evaluation`). Jobs are scheduled FAIR between two pools, so that
#: an epoch's tasks take free task slots before those of background merges
#: (``fairscheduler.xml``, :mod:`factflow.engine.maintenance`). Python workers fork from a
#: daemon that has loaded what probes import (:mod:`factflow.engine.worker_daemon`).
#: Sorts allocate memory pages of 2 MiB instead of Spark's default for this heap (32 MiB):
#: Spark 4.1 keeps the sorter of each finished sort in a thread-local of the task thread
#: that ran it, and a sorter keeps its last page, so a long run held hundreds of MiB of
#: pages of sorts long finished (and every small sort allocated and zeroed 32 MiB).
#: Spark's SQL listener keeps the plan graph of its latest executions even without a UI
#: (1,000 by default); factflow reads none of it, and the graphs of a TPC-H stream's
#: statements (thousands of operators each) held hundreds of MiB of a 2 GiB heap: it keeps 50.
#: PySpark's DataFrame debugging (each DataFrame and Column call records its Python call
#: site in the JVM: about five py4j round trips and a failed ``import IPython`` per call)
#: is off: factflow names the offending item in its own errors, and on a small TPC-H load
#: those calls were a third of the driver's time outside Spark jobs.
DEFAULT_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.maxResultSize": "512m",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.ui.retainedExecutions": "50",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "false",
    "spark.log.structuredLogging.enabled": "false",
    "spark.driver.memory": "2g",
    "spark.buffer.pageSize": "2m",
    "spark.cleaner.periodicGC.interval": "1min",
    "spark.sql.autoBroadcastJoinThreshold": str(32 * 1024 * 1024),
    "spark.scheduler.mode": "FAIR",
    "spark.scheduler.allocation.file": str(_POOLS),
    "spark.python.daemon.module": "factflow.engine.worker_daemon",
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    **_UNIX_SOCKETS,
    # factflow's jar: small epochs' statements read driver-held rows bound when they run,
    # so their plans are kept across epochs (factflow.arrangement.bound)
    _CLASS_PATH: bound.JAR,
    **REQUIRED_SQL_CONF,
}

#: Settings of :data:`DEFAULT_SPARK_CONF` that Spark reads only when a session starts, so
#: an engine cannot set them on a session it is given: without the first, finished sorts
#: keep pages of Spark's default size alive (see above); without the second, Python
#: workers start without factflow's modules loaded; without factflow's jar on the driver's
#: class path, small epochs plan every statement anew (and in local mode Spark compiles a
#: new plan's code twice, see :func:`share_task_class_loader`); without Unix domain sockets, every
#: task running Python waits about 40 ms for its first rows; with PySpark's DataFrame
#: debugging, every DataFrame call the driver makes costs several py4j round trips more.
START_UP_SETTINGS = ("spark.buffer.pageSize", "spark.python.daemon.module", _CLASS_PATH, *_UNIX_SOCKETS,
                     "spark.python.sql.dataFrameDebugging.enabled")

MIN_JAVA = 17

#: The environment variable that sets Spark's log level in sessions factflow creates.
LOG_LEVEL_VARIABLE = "FACTFLOW_SPARK_LOG"
_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")
_LOG_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")
_LOOPBACK = "127.0.0.1"
_DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
_EXECUTOR_OPTIONS = "spark.executor.extraJavaOptions"


def check_java() -> int:
    """Return the major version of the Java runtime Spark will use, or raise a clear error."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    advice = ("factflow runs Spark, which needs a Java 17 (or newer) runtime. Install one "
              "(for example 'apt-get install openjdk-17-jre-headless' or from adoptium.net) "
              "and put 'java' on your PATH or set JAVA_HOME.")
    if not java or not os.path.exists(java):
        raise FactflowError(f"no Java runtime found. {advice}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FactflowError(f"could not run {java} -version ({exc}). {advice}") from None
    text = out.stderr + out.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not match:
        raise FactflowError(f"could not read the Java version from {java!r}: {text.strip()[:200]}. {advice}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise FactflowError(f"Java {major} found at {java}, but Java {MIN_JAVA}+ is required. {advice}")
    return major


def create_session(master: str | None = None, app_name: str = "factflow",
                   conf: dict[str, str] | None = None, log_level: str = "ERROR") -> SparkSession:
    """A SparkSession with factflow's defaults (``master`` defaults to ``local[*]``).

    Spark logs at ``log_level``, or at the level ``FACTFLOW_SPARK_LOG`` names when set.

    When a session already runs in this process it is returned with its settings as they
    are, except the runtime SQL settings ``conf`` names (as Spark's ``getOrCreate`` does):
    factflow's defaults, its log level and its master are not forced on a session its user
    configured (an engine sets what it needs per statement).
    """
    if SparkContext._active_spark_context is not None:
        builder = SparkSession.builder
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    check_java()
    # Index probes run Python inside Spark tasks: the workers must use this interpreter
    # (with pyarrow and numpy), not whatever 'python3' is first on the PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    master = master or "local[*]"
    level = _log_level(log_level)
    quiet = _quiet_conf(master, conf or {}, level)
    settings = {**DEFAULT_SPARK_CONF, **(conf or {}), **quiet}
    settings[_DRIVER_OPTIONS] = _large_heap_regions(_exit_on_out_of_memory(settings.get(_DRIVER_OPTIONS, "")))
    settings[_EXECUTOR_OPTIONS] = _large_heap_regions(settings.get(_EXECUTOR_OPTIONS, ""))
    settings[_CLASS_PATH] = _with_jar(settings.get(_CLASS_PATH, ""))
    if not bound.tasks_in_driver_jvm(master):  # executors read bound rows with the jar's classes
        settings["spark.jars"] = ",".join(dict.fromkeys(filter(None, [*settings.get("spark.jars", "").split(","),
                                                                      bound.JAR])))
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _local_ip(quiet.get("spark.driver.bindAddress")):
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel(level)
    _quiet_query_context_loggers(session)
    return session


def _log_level(default: str) -> str:
    """Spark's log level: ``FACTFLOW_SPARK_LOG`` if set, else ``default``."""
    level = (os.environ.get(LOG_LEVEL_VARIABLE) or default).strip().upper()
    if level not in _LOG_LEVELS:
        raise FactflowError(f"{LOG_LEVEL_VARIABLE}={level!r} is not a log level; use one of {', '.join(_LOG_LEVELS)}")
    return level


#: G1's heap region size for the JVMs that run tasks (see :func:`_large_heap_regions`).
HEAP_REGION = "8m"


def _large_heap_regions(options: str) -> str:
    """JVM ``options`` with G1 heap regions of :data:`HEAP_REGION`, unless they choose a
    region size or another collector.

    G1 sizes regions from the heap: 1 MiB for 2 GiB. An array of more than half a region
    is *humongous*: it takes contiguous regions of its own, rounded up, and G1's full
    collections do not move it. Spark's execution memory is such arrays (factflow's 2 MiB
    pages, a hash map's slot arrays), so a 2 MiB page took three regions, and a heap full
    of them and of their holes could not place the next large one: reachability from
    1,000 sources over gnp10K ran a 2 GiB driver out of heap in its first or second epoch
    of edge retractions with 930 MiB of such arrays live; with 8 MiB regions the pages are
    ordinary objects and the same epochs pass."""
    if "G1HeapRegionSize" in options or re.search(r"-XX:\+Use(?!G1GC)\w+GC", options):
        return options
    return f"{options} -XX:G1HeapRegionSize={HEAP_REGION}".strip()


def _exit_on_out_of_memory(options: str) -> str:
    """The driver's JVM ``options`` with ``-XX:+ExitOnOutOfMemoryError``, unless they already
    say what to do on an OutOfMemoryError."""
    return options if "OutOfMemoryError" in options else f"{options} -XX:+ExitOnOutOfMemoryError".strip()


def driver_alive(spark: SparkSession) -> bool:
    """Whether the session's Spark driver still runs: its JVM answers and its context is not stopped."""
    try:
        return not spark.sparkContext._jsc.sc().isStopped()
    except Exception:  # noqa: BLE001 - py4j cannot reach the JVM, or the context was stopped (_jsc is None)
        return False


def label_jobs(sc: SparkContext, group: str, description: str) -> None:
    """Run this thread's next Spark jobs in the job group ``group`` with ``description``.

    The description is also the jobs' call site, both its forms. Without one, Spark walks and
    formats the JVM stack for every RDD it builds, and executing a statement builds one or
    more per operator: for a small epoch's statement over five LDBC queries that walk was
    0.25-0.35 s of a 1.0-1.4 s run. PySpark's own actions clear the short form as they
    return (``SCCallSiteSync``), so a statement run on the driver sets both again while it
    builds its RDDs (``DriverRun``: a fifth of a TPC-H Q19 epoch; setting them here alone
    gained nothing measurable)."""
    _adopt_task_class_loader(sc)
    sc.setJobGroup(group, description, interruptOnCancel=False)
    for form in ("callSite.short", "callSite.long"):
        sc.setLocalProperty(form, description)


#: Spark contexts whose tasks' class loader was captured (:func:`share_task_class_loader`),
#: and, per thread, the context whose loader the thread adopted.
_SHARED_LOADERS: "weakref.WeakSet[SparkContext]" = weakref.WeakSet()
_ADOPTED = threading.local()


def share_task_class_loader(sc: SparkContext) -> bool:
    """Let the threads that label jobs on ``sc`` (:func:`label_jobs`) compile Spark's
    generated code once instead of twice; returns whether that is possible (local mode).

    Spark caches a compiled class by its source and the compiling thread's class loader.
    The driver compiles every whole-stage class as it plans the stage, then the stage's
    first task compiles it again under its executor's loader: in local mode, the same
    class twice in one JVM, for every new statement (an install's first statement, about
    ten classes). One task records the tasks' loader (factflow's jar, ``TaskClassLoader``);
    each thread then adopts it as its context class loader before its first labelled job.
    A failure (a session without factflow's jar) is logged at debug level and changes nothing.
    """
    if not bound.tasks_in_driver_jvm(sc.master):
        return False
    try:
        captured = bool(sc._jvm.factflow.jvm.TaskClassLoader.capture(sc._jsc))
    except Exception:  # noqa: BLE001 - py4j wraps a missing class or a stopped context
        log.debug("capturing the tasks' class loader failed", exc_info=True)
        return False
    if captured:
        _SHARED_LOADERS.add(sc)
    return captured


def _adopt_task_class_loader(sc: SparkContext) -> None:
    """Adopt ``sc``'s tasks' class loader on this thread, once, if it was captured."""
    adopted = getattr(_ADOPTED, "context", None)
    if sc in _SHARED_LOADERS and (adopted is None or adopted() is not sc):
        sc._jvm.factflow.jvm.TaskClassLoader.adopt()
        _ADOPTED.context = weakref.ref(sc)


def _quiet_conf(master: str, conf: dict[str, str], level: str) -> dict[str, str]:
    """Settings that keep a new session quiet, where the user configured nothing of the kind:
    factflow's log4j2 configuration for the driver JVM (at ``level``), and for a local
    master a driver bound to 127.0.0.1 (a hostname resolving to a loopback address makes
    Spark warn and pick another interface)."""
    quiet = {}
    options = conf.get(_DRIVER_OPTIONS, "")
    own_logging = "log4j" in options or (
        "SPARK_CONF_DIR" in os.environ and Path(os.environ["SPARK_CONF_DIR"], "log4j2.properties").exists())
    if not own_logging:
        ours = f"-Dlog4j2.configurationFile={_LOG_CONFIG.as_uri()} -Dfactflow.spark.log={level}"
        quiet[_DRIVER_OPTIONS] = f"{options} {ours}".strip()
    addressed = "SPARK_LOCAL_IP" in os.environ or {"spark.driver.host", "spark.driver.bindAddress"} & set(conf)
    if master.startswith("local") and not addressed:
        quiet["spark.driver.host"] = quiet["spark.driver.bindAddress"] = _LOOPBACK
    return quiet


@contextlib.contextmanager
def _local_ip(address: str | None) -> Iterator[None]:
    """``SPARK_LOCAL_IP`` set to ``address`` (if any) while the driver JVM starts: Spark looks
    up the local address from it before it reads ``spark.driver.host``."""
    if address is None:
        yield
        return
    os.environ["SPARK_LOCAL_IP"] = address
    try:
        yield
    finally:
        del os.environ["SPARK_LOCAL_IP"]


def _quiet_query_context_loggers(session: SparkSession) -> None:
    """Silence Spark's loggers that print every analysis error factflow catches and reports itself."""
    jvm = session.sparkContext._jvm
    level = jvm.org.apache.logging.log4j.Level.OFF
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)


#: Sessions factflow started for engines, by id: the session (kept, so the id stays its
#: own) and how many engines hold it.
_OWNED: dict[int, tuple[SparkSession, int]] = {}
_OWNED_LOCK = threading.Lock()


def _with_jar(class_path: str) -> str:
    """``class_path`` with factflow's jar first."""
    return os.pathsep.join(dict.fromkeys([bound.JAR, *filter(None, class_path.split(os.pathsep))]))


def missing_start_up_settings(spark: SparkSession) -> dict[str, str]:
    """The :data:`START_UP_SETTINGS` ``spark`` was started without, with factflow's values
    (a session started with its own value of one is not missing it; its class path must
    hold factflow's jar)."""
    conf = spark.sparkContext.getConf()

    def missing(key: str) -> bool:
        if key == _CLASS_PATH:
            return bound.JAR not in conf.get(key, "").split(os.pathsep)
        return conf.get(key, None) is None

    return {key: DEFAULT_SPARK_CONF[key] for key in START_UP_SETTINGS if missing(key)}


_CHECKED_CONTEXTS: set[int] = set()


def warn_of_missing_start_up_settings(spark: SparkSession) -> None:
    """Log which :data:`START_UP_SETTINGS` ``spark`` lacks; once per Spark context (checked once)."""
    if id(spark.sparkContext) in _CHECKED_CONTEXTS:
        return
    _CHECKED_CONTEXTS.add(id(spark.sparkContext))
    missing = missing_start_up_settings(spark)
    if missing:
        log.warning("this SparkSession was started without %s: Spark reads these only at start-up, so the engine "
                    "cannot set them (without a small page size, finished sorts keep their memory pages on the "
                    "driver; without factflow's jar, small epochs plan every statement anew and Spark compiles "
                    "new plans' code twice; without Unix domain "
                    "sockets, every task running Python waits about 40 ms for its first rows; with DataFrame "
                    "debugging, every DataFrame call of the driver costs several more py4j round trips; see "
                    "factflow.engine.session). Start the session with them, or let factflow create it.",
                    ", ".join(f"{k}={v}" for k, v in missing.items()))


def acquire_session(master: str | None = None) -> SparkSession:
    """The session for an engine created without one (see :func:`create_session`); pair with :func:`release_session`.

    It is the running session if there is one, else a new one. Holds are counted only on
    sessions factflow started itself.
    """
    with _OWNED_LOCK:
        running = SparkContext._active_spark_context is not None
        session = create_session(master=master)
        held = _OWNED.get(id(session))
        if held is not None:
            _OWNED[id(session)] = (session, held[1] + 1)
        elif not running:
            _OWNED[id(session)] = (session, 1)
        return session


def release_session(session: SparkSession) -> None:
    """Give up an engine's hold on ``session``; the last hold on a session factflow started
    stops it (unless its driver is gone already)."""
    with _OWNED_LOCK:
        held = _OWNED.get(id(session))
        if held is None:
            return
        if held[1] > 1:
            _OWNED[id(session)] = (session, held[1] - 1)
            return
        del _OWNED[id(session)]
        if SparkContext._active_spark_context is session.sparkContext and driver_alive(session):
            session.stop()  # not stopped by someone else meanwhile, nor lost
