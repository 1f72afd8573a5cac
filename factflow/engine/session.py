"""Creating the SparkSession an embedded engine runs on, after checking for Java 17+.

Engines created without a session share one (``getOrCreate``): :func:`acquire_session`
counts the engines on a session factflow started, and :func:`release_session` stops it
with the last of them. A session factflow did not start (the caller's, or one made with
:func:`create_session` directly) is used as it is and never stopped by factflow.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading

from pyspark import SparkContext
from pyspark.sql import SparkSession

from factflow.errors import FactflowError

__all__ = ["DEFAULT_SPARK_CONF", "REQUIRED_SQL_CONF", "acquire_session", "check_java", "create_session",
           "release_session"]

#: SQL settings every engine applies to its session, given or created. Constraint
#: propagation is off because Spark 4.1 fails on it ("key not found" while rewriting a
#: Union's constraints) for the statements factflow generates over checkpointed batches,
#: and because inferring constraints over plans of hundreds of operators costs planning time.
REQUIRED_SQL_CONF = {
    "spark.sql.constraintPropagation.enabled": "false",
}

#: Settings for an engine-owned session: small shuffles, Arrow transfers, UTC, no UI, and
#: a driver GC every minute: Spark frees the broadcasts and local relations of finished
#: statements only once the JVM has collected them, and a recursive epoch issues hundreds
#: of such statements on a large heap that rarely needs a GC (a long grid150 probe ran out
#: of driver memory with Spark's default of 30 minutes, and finished with 1 minute).
#: A collect may bring at most 512 MiB to the driver (a quarter of its heap): past that
#: Spark fails the job before the driver runs out of memory (an out-of-memory error in
#: the result getter used to leave the Python process waiting forever), and the engine
#: keeps the rows in Spark instead (see :mod:`factflow.engine.evaluation`).
DEFAULT_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.maxResultSize": "512m",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "false",
    "spark.log.structuredLogging.enabled": "false",
    "spark.driver.memory": "2g",
    "spark.cleaner.periodicGC.interval": "1min",
    "spark.sql.autoBroadcastJoinThreshold": str(32 * 1024 * 1024),
    **REQUIRED_SQL_CONF,
}

MIN_JAVA = 17


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
    """A SparkSession with factflow's defaults (``master`` defaults to ``local[*]``)."""
    check_java()
    # Index probes run Python inside Spark tasks: the workers must use this interpreter
    # (with pyarrow and numpy), not whatever 'python3' is first on the PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(master or "local[*]")
    for key, value in {**DEFAULT_SPARK_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    _quiet_query_context_loggers(session)
    return session


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
    """Give up an engine's hold on ``session``; the last hold on a session factflow started stops it."""
    with _OWNED_LOCK:
        held = _OWNED.get(id(session))
        if held is None:
            return
        if held[1] > 1:
            _OWNED[id(session)] = (session, held[1] - 1)
            return
        del _OWNED[id(session)]
        if SparkContext._active_spark_context is session.sparkContext:  # not stopped by someone else meanwhile
            session.stop()
