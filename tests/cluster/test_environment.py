"""The test cluster is what it claims to be, shown with real jobs: executors on two workers
that Spark and the tasks take for separate hosts (their own addresses, their own /tmp, a
shared directory, shuffles over the network), the S3 server reachable from the driver and
from tasks with nothing but the environment, and a killed worker survived and restarted.

Functions that run in tasks are defined here; this module is pickled by value (executors
cannot import it). Tasks that must run on every executor run in a barrier stage of one
task per executor: Spark starts them together, so each single-core executor runs one.
"""

from __future__ import annotations

import operator
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from pyspark import cloudpickle
from standalone import executor_hosts, wait_for_executors

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOSTS = ["127.0.0.2", "127.0.0.3"]


def executor_host() -> str:
    """In a task: the host its executor announces (the ``--hostname`` of the executor JVM
    this Python worker descends from)."""
    pid = os.getpid()
    while pid > 1:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in args:
            return args[args.index("--hostname") + 1]
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    raise RuntimeError("this process does not descend from an executor")


def tmp_file_system() -> str | None:
    """The type of the file system on ``/tmp`` in this process's mount namespace (of the
    last mount there), or None if ``/tmp`` is no mount point."""
    found = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        if fields.split()[4] == "/tmp":
            found = rest.split()[0]
    return found


def where_am_i(_rows):
    """In a task: what its host looks like from inside."""
    yield {"host": executor_host(), "mount_namespace": os.readlink("/proc/self/ns/mnt"),
           "tmp": tmp_file_system(), "python": sys.executable}


def on_every_executor(spark, task) -> list:
    """Run ``task`` (a function of a partition's rows) once on each of the driver's
    executors, all at once (a barrier stage), and collect what it yields."""
    n = len(executor_hosts(spark))
    return spark.sparkContext.parallelize(range(n), n).barrier().mapPartitions(task).collect()


def alive(pids: list[int]) -> list[str]:
    """``ps`` lines of those of ``pids`` that still run (zombies not counted)."""
    listed = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-p", ",".join(map(str, pids))],
                            capture_output=True, text=True).stdout.splitlines()
    return [line for line in listed if line.split()[1][0] != "Z"]


def test_tasks_run_on_two_executors_as_separate_hosts(cluster, cluster_spark):
    seen = on_every_executor(cluster_spark, where_am_i)
    assert sorted(s["host"] for s in seen) == HOSTS
    assert executor_hosts(cluster_spark) == HOSTS  # the addresses the driver and other executors use
    namespaces = {s["mount_namespace"] for s in seen}
    assert len(namespaces) == 2 and os.readlink("/proc/self/ns/mnt") not in namespaces
    assert [s["tmp"] for s in seen] == ["tmpfs", "tmpfs"]
    assert {s["python"] for s in seen} == {cluster.python} == {sys.executable}


def test_a_shuffle_between_the_workers_fetches_over_the_network(cluster_spark):
    """One map task on each executor, each reduce task reads both outputs. The shuffle
    files are in each worker's private /tmp: were the executors on one host to Spark, it
    would read the other's files from disk, fail, and retry the stage."""
    sc = cluster_spark.sparkContext
    group = f"shuffle-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "a shuffle between the two workers")
    try:
        pairs = sc.parallelize(range(10_000), 2).barrier().mapPartitions(lambda rows: ((x % 7, 1) for x in rows))
        counts = dict(pairs.reduceByKey(operator.add, 2).collect())
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert counts == {k: len(range(k, 10_000, 7)) for k in range(7)}
    tracker = sc.statusTracker()
    stages = [tracker.getStageInfo(s) for job in tracker.getJobIdsForGroup(group)
              for s in tracker.getJobInfo(job).stageIds]
    assert len(stages) == 2
    assert [(s.numFailedTasks, s.currentAttemptId) for s in stages] == [(0, 0), (0, 0)]


def test_tasks_see_the_shared_directory_but_no_other_tmp(cluster, cluster_spark):
    token = uuid.uuid4().hex
    shared = cluster.shared_dir
    (shared / f"driver-{token}").write_text(token)
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="factflow-driver-") as driver_tmp:
        driver_file = driver_tmp.name

        def look_and_write(_rows):
            host = executor_host()
            Path(f"/tmp/{token}-{host}").write_text(host)
            (shared / f"{token}-{host}").write_text(host)
            yield {"host": host, "sees_driver_tmp": os.path.exists(driver_file),
                   "reads_shared": (shared / f"driver-{token}").read_text()}

        seen = on_every_executor(cluster_spark, look_and_write)
        assert os.path.exists(driver_file)
    assert sorted(s["host"] for s in seen) == HOSTS
    assert not any(s["sees_driver_tmp"] for s in seen)
    assert [s["reads_shared"] for s in seen] == [token, token]
    for host in HOSTS:  # and the other way: the driver sees what tasks put in the shared directory only
        assert not Path(f"/tmp/{token}-{host}").exists()
        assert (shared / f"{token}-{host}").read_text() == host

    def tmp_files(_rows):
        yield executor_host(), sorted(p.name for p in Path("/tmp").glob(f"{token}-*"))

    # each worker keeps its /tmp between jobs, and sees no other's
    assert sorted(on_every_executor(cluster_spark, tmp_files)) == [(h, [f"{token}-{h}"]) for h in HOSTS]


def test_s3_objects_pass_between_driver_and_tasks_with_the_environment_only(s3, cluster_spark):
    from pyarrow.fs import FileSystem

    token = uuid.uuid4().hex
    bucket = s3.bucket
    fs, path = FileSystem.from_uri(f"s3://{bucket}/from-driver-{token}")  # reads AWS_* from the environment
    with fs.open_output_stream(path) as out:
        out.write(token.encode())

    def read_and_write(_rows):
        from pyarrow.fs import FileSystem

        host = executor_host()
        fs, path = FileSystem.from_uri(f"s3://{bucket}/from-driver-{token}")
        with fs.open_input_stream(path) as stream:
            read = stream.read().decode()
        fs, path = FileSystem.from_uri(f"s3://{bucket}/from-{host}-{token}")
        with fs.open_output_stream(path) as out:
            out.write(host.encode())
        yield host, read, os.environ["AWS_ENDPOINT_URL"]

    seen = on_every_executor(cluster_spark, read_and_write)
    assert sorted(seen) == [(host, token, s3.endpoint_url) for host in HOSTS]
    for host in HOSTS:
        with fs.open_input_stream(f"{bucket}/from-{host}-{token}") as stream:
            assert stream.read() == host.encode()


def test_the_s3_server_refuses_a_second_create_only_put(s3):
    """PutObject with ``If-None-Match: *`` (create only, as a write-ahead log on S3 needs)."""
    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client("s3")  # from the environment
    key = f"create-only-{uuid.uuid4().hex}"
    client.put_object(Bucket=s3.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"first"


def test_a_killed_worker_is_survived_and_restarted(cluster, cluster_spark):
    """Runs last: it kills worker 0 (127.0.0.2) and brings it back. Python processes run
    on it then (a task ran there), so the kill takes them too."""
    marker = f"/tmp/before-the-kill-{uuid.uuid4().hex}"

    def mark(_rows):
        Path(marker).touch()
        yield executor_host()

    def find_mark(_rows):
        yield executor_host(), os.path.exists(marker)

    assert sorted(on_every_executor(cluster_spark, mark)) == HOSTS
    victims = cluster.processes(worker=0)
    assert len(victims) >= 3  # the worker, its executor, the executor's Python daemon (and workers)
    cluster.kill_worker(0)
    deadline = time.monotonic() + 10
    while (left := alive(victims)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left

    sc = cluster_spark.sparkContext
    counts = dict(sc.parallelize(range(1000), 4).map(lambda x: (x % 3, 1)).reduceByKey(operator.add, 2).collect())
    assert counts == {0: 334, 1: 333, 2: 333}
    assert wait_for_executors(cluster_spark, 1, timeout=30) == ["127.0.0.3"]

    cluster.start_worker(0)
    assert cluster.wait_for_workers(2, timeout=60) == HOSTS
    assert wait_for_executors(cluster_spark, 2, timeout=60) == HOSTS
    # the restarted worker has a fresh /tmp; the other kept its own
    assert sorted(on_every_executor(cluster_spark, find_mark)) == [("127.0.0.2", False), ("127.0.0.3", True)]
