"""What the engine did and what it holds: epoch reports with their Spark jobs, and ``Engine.stats()``.

Every job of an epoch runs in the epoch's Spark job group (see :mod:`factflow.engine.epoch`);
:func:`spark_jobs` reads that group back from Spark's status store, so a report names each
job with its description (phase and query), tasks, duration and the rows it read and shuffled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from factflow.arrangement.bound import DriverRun
from factflow.text import plural

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.state import EngineState

__all__ = ["EpochReport", "SparkJob", "engine_stats", "spark_jobs"]


@dataclass
class SparkJob:
    """One Spark job an epoch ran: its id, description (phase and query), duration, and the
    rows its stages read from stored batches (``rows_read``) and from shuffles."""

    id: int
    description: str | None
    tasks: int
    seconds: float | None
    rows_read: int = 0
    rows_shuffled: int = 0


@dataclass
class EpochReport:
    """What one epoch did: sizes, the Spark jobs it ran, and where the time went.

    ``seconds`` and ``jobs`` cover the epoch up to its commit (what delays its results);
    the maintenance that runs after its delivery is reported apart, in
    ``phases["maintenance"]``, ``merges`` and ``maintenance_jobs``. A durable engine's
    ``phases["log"]`` is the log record's time on the epoch's own thread: building it, and
    waiting for it after the queries (a small epoch's record is written beside them).
    ``kept_in_spark`` names the private traces whose changes a small epoch checkpointed in
    Spark instead of fetching them, because they exceeded their share of
    ``EngineConfig.fetch_limit`` rows or ``spark.driver.maxResultSize`` (each costs a Spark
    job of its own). ``plans_reused``
    counts the epoch's statements that ran from a plan kept since an earlier epoch
    (``EngineConfig.reuse_plans``), of ``statements`` it ran in small-epoch form, and
    ``analyses_reused`` those planned anew from an analysed plan kept since an earlier epoch
    (statements whose plans cannot run again, :mod:`factflow.arrangement.bound`), and
    ``on_driver`` lists those computed in the driver's JVM without a Spark job.
    ``time`` is when it committed (seconds since the Unix epoch); ``changed`` names the
    queries whose result it changed, among those whose changes are computed (queries with
    subscribers or sinks).
    """

    epoch: int
    operations: int | None
    changes: int
    queries: list[str]
    jobs: list[SparkJob]
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)
    merges: int = 0
    maintenance_jobs: list[SparkJob] = field(default_factory=list)
    kept_in_spark: list[str] = field(default_factory=list)
    statements: int = 0
    plans_reused: int = 0
    analyses_reused: int = 0
    on_driver: list[DriverRun] = field(default_factory=list)
    time: float = 0.0
    changed: list[str] = field(default_factory=list)

    @property
    def rows_read(self) -> int:
        """The rows its Spark jobs and its statements run on the driver read."""
        return sum(j.rows_read for j in self.jobs) + sum(r.rows_read for r in self.on_driver)

    @property
    def steps(self) -> list[str | None]:
        """The descriptions of its Spark jobs and of its statements run on the driver."""
        return [j.description for j in self.jobs] + [r.description for r in self.on_driver]

    def describe(self) -> str:
        """Multi-line text: the epoch's figures, one line per Spark job and one per statement
        run on the driver."""
        operations = plural(self.operations, "operation") if self.operations is not None else "? operations"
        lines = [f"epoch {self.epoch}: {operations} -> {plural(self.changes, 'change')}, "
                 f"{plural(len(self.queries), 'query', 'queries')} updated, {plural(len(self.jobs), 'Spark job')} "
                 f"({self.plans_reused} of {plural(self.statements, 'statement')} from kept plans, "
                 f"{self.analyses_reused} from kept analyses, {len(self.on_driver)} run on the driver), "
                 f"{self.seconds:.3f}s "
                 + " ".join(f"{k}={v:.3f}s" for k, v in self.phases.items())]
        if self.kept_in_spark:
            lines.append(f"  kept in Spark (over the driver fetch limit): {', '.join(self.kept_in_spark)}")
        for job in self.jobs:
            took = f"{job.seconds:.3f}s" if job.seconds is not None else "?"
            lines.append(f"  job {job.id} ({plural(job.tasks, 'task')}, {took}, read {plural(job.rows_read, 'row')}, "
                         f"shuffled {job.rows_shuffled}): {job.description}")
        lines.extend(f"  on the driver ({run.seconds:.3f}s, read {plural(run.rows_read, 'row')}): {run.description}"
                     for run in self.on_driver)
        if self.maintenance_jobs:
            lines.append(f"  after delivery: {plural(self.merges, 'merge')}, {plural(len(self.maintenance_jobs), 'Spark job')}")
        return "\n".join(lines)


def spark_jobs(spark: SparkSession, group: str) -> list[SparkJob]:
    """The jobs Spark ran in a job group, from its status store."""
    sc = spark.sparkContext
    ids = sorted(sc.statusTracker().getJobIdsForGroup(group))
    store = sc._jsc.sc().statusStore()
    jobs = []
    for job_id in ids:
        try:
            data = store.job(job_id)
        except Exception:  # evicted from the store (spark.ui.retainedJobs)
            jobs.append(SparkJob(job_id, None, 0, None))
            continue
        description = data.description().get() if data.description().isDefined() else None
        seconds = None
        if data.completionTime().isDefined() and data.submissionTime().isDefined():
            seconds = (data.completionTime().get().getTime() - data.submissionTime().get().getTime()) / 1000.0
        read = shuffled = 0
        stages = data.stageIds().iterator()
        while stages.hasNext():
            try:
                stage = store.lastStageAttempt(stages.next())
            except Exception:  # a skipped stage has no attempt
                continue
            read += stage.inputRecords()
            shuffled += stage.shuffleReadRecords()
        jobs.append(SparkJob(job_id, description, data.numTasks(), seconds, read, shuffled))
    return jobs


def engine_stats(state: "EngineState") -> dict[str, Any]:
    """The figures of :meth:`factflow.engine.engine.Engine.stats` (documented there)."""
    arrangements = {}
    for arrangement in state.arrangements.values():
        for trace in arrangement.traces.values():
            arrangements[trace.name] = trace.tuples
    queries = state.queries
    return {
        "epoch": state.epoch,
        "shared_tuples": sum(arrangements.values()),
        "query_tuples": {n: q.dataflow.tuples("intermediate") for n, q in queries.items()},
        "result_tuples": {n: q.dataflow.tuples("result") for n, q in queries.items()},
        "arrangements": arrangements,
        "query_arrangements": {n: {t.name: (role, t.tuples) for t, role in q.dataflow.private_traces()}
                               for n, q in queries.items()},
        "shared_rules": {e.name: {"rules": list(e.rules), "users": sorted(e.users), "tuples": e.tuples(),
                                  "arrangements": {t.name: (role, t.tuples) for t, role in e.traces}}
                         for e in state.shared.entries()},
    }
