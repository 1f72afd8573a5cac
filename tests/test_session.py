"""Sessions factflow creates are quiet unless asked otherwise; the packaging is warning-free."""

import os
import subprocess
import sys
import textwrap
import time
import tomllib
import zipfile
import zipimport
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from factflow import Engine, FactflowError, workers
from factflow.cli import main as cli
from factflow.arrangement import bound
from factflow.engine import session

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("FACTFLOW_SPARK_LOG", "SPARK_LOCAL_IP", "SPARK_CONF_DIR"):
        monkeypatch.setenv(name, "")  # recorded, so that what a test sets is undone
        monkeypatch.delenv(name)
    return monkeypatch


def test_a_new_local_session_gets_factflows_log_config_and_a_loopback_driver(clean_env):
    quiet = session._quiet_conf("local[2]", {}, "ERROR")
    config = Path(session.__file__).with_name("log4j2.properties")
    assert config.exists()
    assert quiet["spark.driver.extraJavaOptions"] == (
        f"-Dlog4j2.configurationFile={config.resolve().as_uri()} -Dfactflow.spark.log=ERROR")
    assert quiet["spark.driver.host"] == quiet["spark.driver.bindAddress"] == "127.0.0.1"


def test_what_the_user_configured_is_left_alone(clean_env):
    own = {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=/etc/mine.properties",
           "spark.driver.host": "10.0.0.5"}
    assert session._quiet_conf("local[2]", own, "ERROR") == {}
    options = session._quiet_conf("local[2]", {"spark.driver.extraJavaOptions": "-Xss4m"}, "WARN")
    assert options["spark.driver.extraJavaOptions"].startswith("-Xss4m -Dlog4j2.configurationFile=")
    assert "spark.driver.host" not in session._quiet_conf("spark://cluster:7077", {}, "ERROR")
    clean_env.setenv("SPARK_LOCAL_IP", "10.0.0.5")
    assert "spark.driver.host" not in session._quiet_conf("local[2]", {}, "ERROR")


def test_a_driver_factflow_starts_exits_when_out_of_memory(spark):
    """Spark's result getter dies of an OutOfMemoryError and leaves its job waiting forever;
    a driver that exits instead fails the waiting call (see factflow.engine.session)."""
    assert session._exit_on_out_of_memory("") == "-XX:+ExitOnOutOfMemoryError"
    assert session._exit_on_out_of_memory("-Xss4m") == "-Xss4m -XX:+ExitOnOutOfMemoryError"
    assert session._exit_on_out_of_memory("-XX:OnOutOfMemoryError=kill") == "-XX:OnOutOfMemoryError=kill"
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
    assert "-XX:+ExitOnOutOfMemoryError" in options and "log4j2.configurationFile" in options


def test_jvms_that_run_tasks_get_large_heap_regions(spark):
    """Spark's 2 MiB memory pages must not be G1 humongous objects (see factflow.engine.session)."""
    assert session._large_heap_regions("") == "-XX:G1HeapRegionSize=8m"
    assert session._large_heap_regions("-Xss4m") == "-Xss4m -XX:G1HeapRegionSize=8m"
    assert session._large_heap_regions("-XX:G1HeapRegionSize=4m") == "-XX:G1HeapRegionSize=4m"
    assert session._large_heap_regions("-XX:+UseParallelGC") == "-XX:+UseParallelGC"
    assert session._large_heap_regions("-XX:+UseG1GC") == "-XX:+UseG1GC -XX:G1HeapRegionSize=8m"
    conf = spark.sparkContext.getConf()
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert "-XX:G1HeapRegionSize=8m" in conf.get(key), key
    region = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        spark.sparkContext._jvm.com.sun.management.HotSpotDiagnosticMXBean._java_lang_class
    ).getVMOption("G1HeapRegionSize").getValue()
    assert region == str(8 * 2**20)


def test_a_session_factflow_starts_sorts_in_small_pages_and_bounds_its_parser_cache(engine):
    """Spark keeps a finished sort's last page alive (in a thread-local of its task thread)
    and the SQL parser's cache grows with every new statement: a long test run held over
    1.1 GB of a 2 GiB driver heap in the two. See factflow.engine.session."""
    spark = engine.spark
    jvm = spark.sparkContext._jvm
    assert jvm.org.apache.spark.SparkEnv.get().memoryManager().pageSizeBytes() == 2 * 1024 * 1024
    sql_conf = spark._jsparkSession.sessionState().conf()
    assert sql_conf.manageParserCaches()
    assert sql_conf.parserDfaCacheFlushRatio() == 10


def test_the_spark_log_level_comes_from_the_environment(clean_env):
    assert session._log_level("ERROR") == "ERROR"
    clean_env.setenv("FACTFLOW_SPARK_LOG", "info")
    assert session._log_level("ERROR") == "INFO"
    clean_env.setenv("FACTFLOW_SPARK_LOG", "loud")
    with pytest.raises(FactflowError, match="FACTFLOW_SPARK_LOG='LOUD'"):
        session._log_level("ERROR")


@pytest.mark.parametrize("flags, level", [([], None), (["-v"], "WARN"), (["-vv"], "INFO")])
def test_verbose_cli_shows_sparks_log(clean_env, capsys, flags, level):
    """``factflow -v`` (and ``-vv``) sets FACTFLOW_SPARK_LOG for the sessions the command creates."""
    assert cli(["version", *flags]) == 0
    assert os.environ.get("FACTFLOW_SPARK_LOG") == level


def test_the_package_metadata_uses_an_spdx_license():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]
    assert "engine/log4j2.properties" in project["tool"]["setuptools"]["package-data"]["factflow"]


def _run_python(script: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a new Python process that imports this checkout's factflow, without
    the caller's ``FACTFLOW_SPARK_LOG`` and ``SPARK_LOCAL_IP`` and with ``env``; it must succeed."""
    base = {k: v for k, v in os.environ.items() if k not in ("FACTFLOW_SPARK_LOG", "SPARK_LOCAL_IP")}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={**base, **env},
                         timeout=300)
    assert run.returncode == 0, run.stderr
    return run


def test_a_created_session_starts_without_spark_chatter():
    script = ("from factflow import create_session\n"
              "s = create_session('local[1]')\n"
              "assert s.range(3).count() == 3\n"
              "s.stop()\n")
    run = _run_python(script)
    # the JVM itself announces the incubator module Spark's launcher adds; nothing else may print
    lines = [line for line in (run.stdout + run.stderr).splitlines()
             if line.strip() and line != "WARNING: Using incubator modules: jdk.incubator.vector"]
    assert lines == []


def test_python_workers_talk_to_their_executor_over_a_unix_socket(spark):
    """Over TCP every task running Python waited about 40 ms for its first rows."""
    assert spark.sparkContext.getConf().get("spark.python.unix.domain.socket.enabled") == "true"


def test_a_worker_whose_executor_hung_up_ends_without_a_traceback():
    """An executor closes an idle worker's socket after a minute; over a Unix socket the
    worker's last flush then fails at once, and Spark's daemon printed the traceback to the
    driver's console (see factflow.engine.worker_daemon). Run in a fresh interpreter: the
    worker sets signal handlers and reads the socket as a forked worker does."""
    script = textwrap.dedent("""
        import os, socket, sys
        os.environ["PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE"] = "1"  # what executors set
        from factflow.engine import worker_daemon
        ours, peer = socket.socketpair()
        peer.close()
        serve = worker_daemon._worker if sys.argv[1] == "factflow" else worker_daemon._serve
        print("exit code", serve(ours, True))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    spark_s, ours = (subprocess.run([sys.executable, "-c", script, which], cwd=ROOT, env=env, capture_output=True,
                                    text=True, timeout=120) for which in ("spark", "factflow"))
    assert "BrokenPipeError" in spark_s.stderr  # the hang-up as Spark's own worker meets it
    assert ours.returncode == 0 and ours.stdout.strip() == "exit code 1" and ours.stderr == "", ours.stderr


def test_python_workers_fork_from_a_daemon_that_loaded_the_probe_modules(spark):
    """A worker's parent is factflow's daemon, which imported numpy, pyarrow and the index
    module before forking (a fresh worker would otherwise spend about 1 s importing them)."""

    def parent(batches):
        import pyarrow as pa

        for _ in batches:
            pass
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode()
        yield pa.RecordBatch.from_pydict({"parent": [command]})

    parents = {r.parent for r in spark.range(2).mapInArrow(parent, "parent STRING").collect()}
    assert parents and all("factflow.engine.worker_daemon" in p for p in parents)


def test_python_workers_inherit_their_daemons_objects_frozen(spark):
    """The daemon freezes what it imported before forking: Spark's daemon collects garbage
    in a reused worker after every task, and a full collection over numpy, pyarrow, pandas
    and factflow took 11 ms, which the worker's next task waited for (a probe statement runs
    a task per probe, 40 in a TPC-H Q19 epoch). Frozen objects are left out of collections."""

    def frozen(batches):
        import gc

        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"frozen": [gc.get_freeze_count()], "tracked": [len(gc.get_objects())]})

    counts = spark.range(2).mapInArrow(frozen, "frozen BIGINT, tracked BIGINT").collect()
    assert counts and all(r.frozen > 50_000 and r.tracked < r.frozen // 10 for r in counts), counts


def test_a_workers_zip_importers_reread_an_archive_only_when_it_changed(tmp_path, monkeypatch):
    """A prepared worker's ``zipimporter.invalidate_caches`` (which Spark's worker calls before
    every task) re-reads an archive only after it changed; unchanged, the importer keeps what it read."""
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", zipimport.zipimporter.invalidate_caches)
    workers.prepare()
    assert zipimport.zipimporter.invalidate_caches is workers._reread_when_changed
    reads = []
    reread = workers._reread
    monkeypatch.setattr(workers, "_reread", lambda importer: reads.append(1) or reread(importer))
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("one.py", "X = 1\n")
    importer = zipimport.zipimporter(str(archive))
    importer.invalidate_caches()
    importer.invalidate_caches()
    assert len(reads) == 1  # unchanged: not read again
    with zipfile.ZipFile(archive, "a") as z:
        z.writestr("two.py", "Y = 2\n")
    os.utime(archive, ns=(0, 0))  # a new modification time even where the clock is coarse
    importer.invalidate_caches()
    assert len(reads) == 2 and importer.find_spec("two") is not None
    archive.unlink()
    importer.invalidate_caches()  # an archive gone: read again, as Python's own method does
    assert len(reads) == 3 and importer.find_spec("one") is None


def test_a_task_finds_the_zip_importers_of_its_worker_stamped(spark):
    """In a Spark task, every zip importer on the path was stamped by the daemon's method: the
    task's set-up did not re-read pyspark.zip (0.2-0.3 s per task before)."""

    def stamped(batches):
        import sys
        import zipimport

        import pyarrow as pa

        for _ in batches:
            pass
        importers = [f for f in sys.path_importer_cache.values() if isinstance(f, zipimport.zipimporter)]
        ok = bool(importers) and all(getattr(f, "_factflow_stamp", None) for f in importers)
        yield pa.RecordBatch.from_pydict({"ok": [ok], "importers": [len(importers)]})

    rows = spark.range(2).mapInArrow(stamped, "ok BOOLEAN, importers BIGINT").collect()
    assert rows and all(r.ok for r in rows), rows


def test_the_workers_of_a_session_factflow_did_not_create_are_prepared_by_its_tasks():
    """A session made without factflow's daemon: after a factflow task (the warm-up's) has run
    in a worker, its later tasks find their zip importers stamped (no re-reads)."""
    script = ("import pyarrow as pa\n"
              "from pyspark.sql import SparkSession\n"
              "from factflow.engine.warmup import _nothing\n"
              "s = SparkSession.builder.master('local[1]').getOrCreate()\n"
              "def stamped(batches):\n"
              "    import sys, zipimport\n"
              "    for _ in batches:\n"
              "        pass\n"
              "    found = [f for f in sys.path_importer_cache.values() if isinstance(f, zipimport.zipimporter)]\n"
              "    yield pa.RecordBatch.from_pydict({'ok': [bool(found) and all(\n"
              "        getattr(f, '_factflow_stamp', None) for f in found)]})\n"
              "one = s.range(0, 1, 1, 1)\n"
              "before = one.mapInArrow(stamped, 'ok BOOLEAN').collect()[0].ok\n"
              "one.mapInArrow(_nothing, 'id BIGINT').collect()\n"
              "after = one.mapInArrow(stamped, 'ok BOOLEAN').collect()[0].ok\n"
              "print('STAMPED', before, after)\n"
              "from factflow import Engine\n"
              "Engine(spark=s).close()\n"
              "import pandas as pd\n"
              "from factflow.io.tables import Table, load_table\n"
              "with Engine(spark=s) as db:\n"  # without factflow's jar, a small load runs as a job
              "    load_table(db, pd.DataFrame({'k': [1, 2], 'note': ['a', 'b']}), Table('t', key=('k',)))\n"
              "    print('LOADED', sorted(db.query('[:find ?n :where [?e :t/note ?n]]').results()))\n"
              "s.stop()\n")
    run = _run_python(script, PYSPARK_PYTHON=sys.executable)
    assert "STAMPED False True" in run.stdout, run.stdout
    assert "LOADED [('a',), ('b',)]" in run.stdout, run.stdout + run.stderr
    # an engine on it says once which start-up settings the session lacks
    assert run.stderr.count("this SparkSession was started without spark.buffer.pageSize=2m, "
                            "spark.python.daemon.module=factflow.engine.worker_daemon") == 1, run.stderr


def test_only_start_up_settings_a_session_lacks_are_reported(spark):
    assert session.missing_start_up_settings(spark) == {}  # the suite's session: factflow made it

    class Conf:
        def __init__(self, values):
            self.values = values

        def get(self, key, default=None):
            return self.values.get(key, default)

    class Session:
        def __init__(self, values):
            self.sparkContext = type("Context", (), {"getConf": lambda _, c=Conf(values): c})()

    assert session.missing_start_up_settings(Session({"spark.buffer.pageSize": "8m"})) == {
        "spark.python.daemon.module": "factflow.engine.worker_daemon", "spark.driver.extraClassPath": bound.JAR,
        "spark.python.unix.domain.socket.enabled": "true", "spark.python.sql.dataFrameDebugging.enabled": "false"}
    # a class path of the user's own counts only if it holds factflow's jar; a setting of the user's own counts
    given = {"spark.buffer.pageSize": "8m", "spark.python.daemon.module": "m",
             "spark.python.unix.domain.socket.enabled": "false", "spark.python.sql.dataFrameDebugging.enabled": "true"}
    assert session.missing_start_up_settings(Session({**given, "spark.driver.extraClassPath": "/x.jar"})) == {
        "spark.driver.extraClassPath": bound.JAR}
    assert session.missing_start_up_settings(Session({**given, "spark.driver.extraClassPath": f"/x.jar{os.pathsep}{bound.JAR}"})) == {}


def test_creating_a_session_when_one_runs_leaves_its_settings_alone(spark):
    """``create_session`` (and so ``Engine()``) in a process whose session its user set up
    returns that session without factflow's defaults over the user's settings; runtime SQL
    settings the caller names are applied, as Spark's ``getOrCreate`` does."""
    key = "spark.sql.shuffle.partitions"
    before = spark.conf.get(key)
    spark.conf.set(key, "3")
    try:
        assert session.create_session() is spark
        assert spark.conf.get(key) == "3"
        with Engine() as db:
            assert db.spark is spark
        assert spark.conf.get(key) == "3"
        assert session.create_session(conf={key: "5"}) is spark
        assert spark.conf.get(key) == "5"
    finally:
        spark.conf.set(key, before)


def _classes_compiled_in_a_thread(spark, classes_compiled, label: bool) -> int:
    """Classes Spark compiles to run a statement never run before, from a new thread that
    labels its job first (as engine threads do) or not."""

    def run() -> int:
        if label:
            session.label_jobs(spark.sparkContext, "test-codegen", "a statement never run before")
        before = classes_compiled()
        spark.range(10).selectExpr(f"id + {time.time_ns()} AS x").collect()
        return classes_compiled() - before

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(run).result()


def test_threads_that_label_jobs_compile_generated_code_once(spark, classes_compiled):
    """In local mode a new whole-stage class was compiled twice, by the driver thread planning
    the stage and by its task under the executor's class loader; a thread that labels its
    jobs shares the tasks' loader, so the task finds the class compiled."""
    assert session.share_task_class_loader(spark.sparkContext)
    shared = _classes_compiled_in_a_thread(spark, classes_compiled, label=True)
    unshared = _classes_compiled_in_a_thread(spark, classes_compiled, label=False)
    assert shared >= 1 and unshared == 2 * shared, (shared, unshared)


def test_the_tasks_class_loader_is_shared_only_where_tasks_run_in_the_driver_jvm():
    """On a cluster the tasks' loader lives in other JVMs: nothing is captured, no job runs."""
    touched = []

    class ClusterContext:
        master = "local-cluster[2,1,1024]"

        @property
        def _jvm(self):
            touched.append("_jvm")
            raise AssertionError("the JVM was asked to capture a loader")

    assert not session.share_task_class_loader(ClusterContext())
    assert touched == []
    assert bound.tasks_in_driver_jvm("local") and bound.tasks_in_driver_jvm("local[*]")
    assert not bound.tasks_in_driver_jvm("spark://cluster:7077")
