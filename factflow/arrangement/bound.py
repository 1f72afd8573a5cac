"""Small epochs' statements planned once and run again with new rows.

Spark plans a statement anew for every new text: parsing, analysis, optimization, physical
planning and building its RDDs cost a small epoch several times what running it does
(docs/benchmarks.md, "Small epochs that reuse their plans"). The text of a small epoch's
statement changes from epoch to epoch mostly because the rows held on the driver (the
transaction, the traces' local batches, fetched intermediate results) are part of it,
written inline or registered as new views.

While a :class:`Binder` is active (:func:`binding`, around each statement group of a
small epoch), :func:`factflow.arrangement.batch.local_relation` does not write rows into
the statement: it *binds* them to a numbered slot in the driver's JVM (factflow's
``BoundRows`` data source, ``factflow/jvm``) and the statement reads the slot through a
view named for its number and schema. Slots are numbered in the order a statement asks
for them, so two epochs whose statements have the same shape produce the same text, and
:meth:`Binder.run` runs the DataFrame planned for that text again: its scans read the
slots' new rows when its tasks run. Empty relations are still written inline, so that
Spark's optimizer drops what they make empty (most of a 1-change epoch's pipelines); a
shape is thus the set of non-empty inputs, which is what the plan depends on.

A plan is kept only if it reads no view but the binder's own and views that outlive epochs
(stored batches, constant relations: :func:`factflow.arrangement.views.lasting_views`),
and running it again is sound; a kept plan is dropped once one of those views is. Running
it again is sound when it runs on the driver (below), which computes the parts it computes
once (exchanges, persisted probes) anew at each run; a plan that runs as a job must also
be without exchanges (a second job reuses their shuffle output) or subqueries (their
results are computed once), and read no probe persisted for it (see
``EpochContext.persist_shared``: a later job would read that run's cache, or none).
A statement whose plan cannot be run again keeps its *analysed* plan
under the same conditions on views, apart from the kept plans (so that it never pushes
out a plan that runs again: kept together, they made the suite's random streams of
``auto`` and ``binary`` plans a fifth slower, 225 s against 183 s),
within a quarter of their memory: the next epoch of its shape plans it from there
(Spark's optimizer, the persisted probes of that epoch and physical planning, all anew)
without parsing and analysing its text again, nor reading which probes it shares from the
analysed plan's text. That was a third of the planning of a small TPC-H epoch's query
statement (0.2-0.35 s of about 1.1 s for Q14, whose shared probes are persisted and whose
statement computes entries once through an exchange). A probe of an index
(:mod:`factflow.arrangement.index`) is a Python function in the plan; while a binder is
active it is *parameterized*: what changes from epoch to epoch (the files and local
batches it reads, the epoch) is bound to a slot like any rows, and its view is the
binder's, named for what it means (:meth:`Binder.probe_view`), so statements that probe
can be kept too. At most ``capacity`` plans are kept, the least recently used dropped
first, and no more than an eighth of the driver's heap by their estimated size: a kept
plan holds its statement's analyzed, optimized and physical plans, about a kilobyte per
character of the statement (a small epoch of 22 TPC-H queries plans statements of 180,000
characters, whose kept plans held about 150 MB each: 64 of them were more than a 2 GiB
driver has, and planning the next such statement needs several hundred MB while it runs).

A kept or planned statement whose plan reads nothing but slots and literal rows (directly
or through probes persisted for it), with no subquery and no exchange but into one partition (a small epoch's statement over state the
driver holds, or probing index files by keys the driver holds), runs in the driver's JVM as
its one task would, without a Spark job (:func:`collected`, ``DriverRun``). An exchange into
one partition that Spark reuses (a ``WITH`` entry computed once) and a probe persisted for
the statement are computed there at each run (the probe's cache is never filled), so such
plans are kept too (docs/benchmarks.md, "Entries computed once, on the driver" and
"Persisted probes on the driver": all 22 TPC-H queries' small epochs run no job). A kept
plan run on the driver keeps what it was prepared into there (``DriverRun.Prepared``: its
RDDs, built once; Spark cleans and test-serializes each join's closure as it builds them),
so running it again computes its rows and nothing else. On a
cluster, a job of one task
costs an executor deserializing a plan of a few hundred operators that it runs a few times
a minute, and Spark's scheduling in any mode (LDBC's one-change epochs with five queries in
local mode: 0.101 s with jobs, 0.050 s without, same hour). Its probes (``mapInArrow``) run
in a Python worker of the driver's, reading the index files through the storage layer as
an executor's would (its 100-change epochs: 0.195 s as jobs, 0.122 s so; on the two-worker
cluster 0.255 s and 0.126 s).

Slots live in the driver's JVM; a task takes its slots' rows with it, written into the
task when Spark serializes it to launch it (``BoundRows``' partitions), so executors on
other hosts read them as tasks in the driver's JVM do. Binding needs factflow's jar on
the driver's class path and, on a cluster, shipped to the executors, as factflow's own
sessions have it (:func:`supported`); elsewhere statements are planned every time.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import re
import tempfile
import time
from collections import Counter, OrderedDict
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NamedTuple

import pyarrow as pa
from py4j.java_gateway import JavaClass
from pyspark.sql.pandas.types import to_arrow_schema

from factflow.arrangement.views import PARAMETERIZED_PROBE_PREFIX, drop_view, lasting_views, one_partition
from factflow.model.frames import arrow_table, values_sql

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T

__all__ = ["JAR", "Binder", "Collected", "DriverRun", "Prepare", "analysed_views", "binding", "collected", "current",
           "run", "source_digest", "supported", "tasks_in_driver_jvm"]

_JVM = Path(__file__).resolve().parent.parent / "jvm"
#: factflow's jar (built from ``factflow/jvm/src`` by ``scripts/build_jvm.sh``)
JAR = str(_JVM / "factflow-jvm.jar")
_SOURCE = "factflow.jvm.BoundRows"
_VIEWS = re.compile(r"\bff_[a-z]+\d+\b")
_ANALYSED_VIEW = re.compile(r"View \(`([^`]+)`")
_NOT_REUSABLE = ("Exchange", "Subquery")
_BINDERS = itertools.count(1)
_current: ContextVar["Binder | None"] = ContextVar("factflow_binder", default=None)


def source_digest() -> str:
    """SHA-256 of the jar's Java source (paths and contents), as the jar records it."""
    digest = hashlib.sha256()
    for path in sorted((_JVM / "src").rglob("*.java")):
        digest.update(str(path.relative_to(_JVM)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def tasks_in_driver_jvm(master: str) -> bool:
    """Whether Spark's tasks run in the driver's JVM under ``master``: local mode
    (``local-cluster`` runs executor JVMs of its own)."""
    return master == "local" or master.startswith("local[")


def supported(spark: "SparkSession") -> bool:
    """Whether statements on ``spark`` can read bound rows: factflow's jar on the driver's
    class path, and, where tasks run in executors of their own, shipped to them
    (``spark.jars``, as factflow's sessions on a cluster have it, or their class path)."""
    try:
        spark._jvm.java.lang.Class.forName(_SOURCE)
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        return False
    if tasks_in_driver_jvm(spark.sparkContext.master):
        return True
    conf = spark.sparkContext.getConf()
    shipped = conf.get("spark.jars", "").split(",") + conf.get("spark.executor.extraClassPath", "").split(":")
    return any(entry.endswith(Path(JAR).name) for entry in shipped if entry)


#: heap a kept plan is taken to hold per character of its statement (see the module docstring)
PLAN_BYTES_PER_CHARACTER = 1024
#: the same for a kept analysed plan alone: taken, unmeasured, as a quarter of a whole plan's
ANALYSED_BYTES_PER_CHARACTER = PLAN_BYTES_PER_CHARACTER // 4
#: the part of the driver's heap a statement run on the driver may hold in the parts it
#: computes once (past it, the statement runs as a job, whose parts Spark may spill)
DRIVER_HELD_FRACTION = 1 / 8
#: how much more per character a kept plan that reads probes persisted for it holds: their
#: cached relations' plans too (TPC-H Q21's at SF 0.1 held 47 MiB for 32,917 characters)
PERSISTED_PLAN_WEIGHT = 1.5


class Binder:
    """One engine's slots and the plans it keeps; see the module docstring. ``memory``:
    the bytes kept plans may hold (default: an eighth of the driver's heap)."""

    def __init__(self, spark: "SparkSession", capacity: int = 64, memory: int | None = None):
        self.spark = spark
        self.capacity = capacity
        self.memory = memory if memory is not None else _driver_heap(spark) // 8
        self.planned = 0  # statements planned while active
        self.reused = 0   # statements run from a kept plan
        self.reanalysed = 0  # of those planned, how many started from a kept analysed plan
        self._on_driver: list[DriverRun] = []  # statements run on the driver since taken
        self._id = next(_BINDERS)
        self._rows = spark._jvm.factflow.jvm.BoundRows
        self._next = 0
        self._slots = 0  # slots bound so far (the highest number)
        self._views: set[str] = set()
        self._bound: dict[int, tuple[object, str]] = {}
        #: per statement text, its kept plan; and apart, so that they never push out a plan
        #: that runs again, the analysed plans of statements whose plans cannot
        self._plans = _Kept(capacity, self.memory, PLAN_BYTES_PER_CHARACTER)
        self._analysed = _Kept(capacity, self.memory // 4, ANALYSED_BYTES_PER_CHARACTER)
        #: parameterized probes' views by name (see :meth:`probe_view`), least recently used
        #: first, with the other views their definitions read
        self._probes: OrderedDict[str, _Probe] = OrderedDict()
        self._probe_characters = 0
        #: the queries (opaque tokens) whose evaluation the statements run now belong to, set
        #: by :func:`binding`; none: the engine's own (applying changes), kept for every epoch
        self.owners: frozenset[object] = frozenset()

    def restart(self) -> None:
        """Number slots from the first again: a new statement group begins (and the
        statements of the one before are done: probe views over the binder's bounds go)."""
        self._next = 0
        self._bound.clear()
        while self._probes and (len(self._probes) > 4 * self.capacity
                                or self._probe_characters * ANALYSED_BYTES_PER_CHARACTER > self.memory // 2):
            self._drop_probe(next(iter(self._probes)))

    def relation(self, frame: "pd.DataFrame", schema: "T.StructType", owner: object | None = None) -> str:
        """SQL reading ``frame``'s rows (typed as ``schema``) as one partition: the next slot
        bound to them, or inline when there are none. The rows of one ``owner`` (a local
        batch) are bound once per statement group."""
        if len(frame) == 0:
            return one_partition(values_sql(frame, schema))
        if owner is not None and id(owner) in self._bound:
            return self._bound[id(owner)][1]
        self._next += 1
        self._slots = max(self._slots, self._next)
        slot = self._slot(self._next)
        table = arrow_table(frame, schema)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        self._rows.bind(slot, bytearray(sink.getvalue().to_pybytes()))
        ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema.fields)
        view = f"{slot}_{hashlib.sha1(ddl.encode()).hexdigest()[:10]}"
        if view not in self._views:
            (self.spark.read.format(_SOURCE).option("slot", slot).option("schema", ddl).load()
             .createOrReplaceTempView(view))
            self._views.add(view)
        relation = one_partition(view)
        if owner is not None:
            self._bound[id(owner)] = (owner, relation)  # holding the owner keeps its id unique
        return relation

    def probe_view(self, definition: str, build: "Callable[[], DataFrame]") -> tuple[str, "DataFrame"]:
        """The view of a parameterized probe (:class:`factflow.arrangement.index.ParameterizedProbes`)
        whose ``definition`` (its function's probes and the SQL of its input, parameters' slot
        included) is given, and its DataFrame: registered from ``build()`` the first time.

        The view is named for its definition, so a statement that reads it has the same text
        whenever it means the same, and the view outlives its epoch: an epoch whose
        statements have the shape of an earlier one's neither builds its probes' DataFrames
        again nor plans them. Between statement groups (:meth:`restart`) the least recently
        used go while there are more than ``4 * capacity`` or their DataFrames take more
        than half the kept plans' memory, estimated by characters as analysed plans are: a
        probe's DataFrame is analysed, never optimized or planned itself. (Estimated as whole
        plans, the 41 probe views of each of the two shapes of a TPC-H Q19 epoch, 264,000
        characters, were more than that, and every epoch built them all again: 2-3 s of its
        7 s. Dropping them all freed no heap measurable after a full collection.)"""
        name = f"{PARAMETERIZED_PROBE_PREFIX}{int(hashlib.sha1(definition.encode()).hexdigest()[:15], 16)}"
        found = self._probes.get(name)
        if found is not None:
            self._probes.move_to_end(name)
            if not self.owners:  # now read by the engine's own statements too
                self._probes[name] = found._replace(owners=None)
            elif found.owners is not None:
                found.owners.update(self.owners)
            return name, found.frame
        frame = build()
        frame.createOrReplaceTempView(name)
        self._probes[name] = _Probe(frame, self._views_read(definition), len(definition),
                                    set(self.owners) if self.owners else None)
        self._probe_characters += len(definition)
        return name, frame

    def _views_read(self, sql: str) -> frozenset[str]:
        """The views ``sql`` reads, a parameterized probe's view standing for those its
        definition reads (its own name says what it means)."""
        views = set()
        for view in _VIEWS.findall(sql):
            if not view.startswith(PARAMETERIZED_PROBE_PREFIX):
                views.add(view)
            elif view in self._probes:
                views |= self._probes[view].views
            else:  # a probe view dropped meanwhile: what it read is not known, so nothing may keep it
                views.add(view)
        return frozenset(views)

    def run(self, sql: str, prepare: "Prepare | None" = None) -> pa.Table:
        """The rows of ``sql`` as Arrow, from the plan kept for this text when there is one
        (or planned from its kept analysed plan); ``prepare`` is called before a statement
        planned anew runs, with what gives the views its analysed plan reads, and returns
        whether it changed what the plan reads (persisted part of it): such a plan is kept
        whole only if it runs on the driver, otherwise analysed."""
        lasting = lasting_views()
        self._plans.keep_reading(lasting)
        self._analysed.keep_reading(lasting)
        kept = self._plans.get(sql)
        if kept is not None:
            self.reused += 1
            # run as a job, a kept plan would read its first job's shuffle output and caches:
            # where the driver gives up, it is planned anew from its analysed plan
            return self._collected(kept.frame, lambda: _replanned(self.spark, kept.frame), kept.prepared).table
        analysed = self._analysed.get(sql)
        if analysed is not None:
            self.reanalysed += 1
            frame = _replanned(self.spark, analysed.frame)
            reads = analysed.reads
        else:
            frame = self.spark.sql(sql)
            reads = _counted_once(frame)
        prepared = prepare(reads) if prepare is not None else False
        found = self._collected(frame)
        self.planned += 1
        if analysed is None and (views := self._views_read(sql)) <= lasting:
            if found.read_on_driver is not None or (not prepared and self._reusable(frame)):
                self._plans.add(sql, _Statement(frame, views, reads, self.owners, found.prepared),
                                PERSISTED_PLAN_WEIGHT if prepared else 1.0)
            else:  # hold the analysed plan alone, not the optimized and physical ones
                self._analysed.add(sql, _Statement(_replanned(self.spark, frame), views, reads, self.owners))
        return found.table

    def _collected(self, frame: "DataFrame", job: "Callable[[], DataFrame] | None" = None,
                   prepared: object | None = None) -> "Collected":
        """:func:`collected`, noting a statement run on the driver."""
        began = time.perf_counter()
        found = collected(frame, job, prepared)
        if found.read_on_driver is not None:
            description = self.spark.sparkContext.getLocalProperty("spark.job.description")
            self._on_driver.append(DriverRun(description, time.perf_counter() - began, found.read_on_driver))
        return found

    def take_on_driver(self) -> list[DriverRun]:
        """The statements run on the driver since the last call (each of which would have
        been a Spark job), oldest first."""
        taken, self._on_driver = self._on_driver, []
        return taken

    def _slot(self, number: int) -> str:
        """The name of this binder's slot ``number``."""
        return f"ffbound{self._id}_{number}"

    @staticmethod
    def _reusable(frame: "DataFrame") -> bool:
        plan = frame._jdf.queryExecution().executedPlan().toString()
        return not any(word in plan for word in _NOT_REUSABLE)

    def forget(self, owner: object) -> None:
        """``owner``'s query is gone: drop the statements of evaluations it took part in (their
        text is never asked for again) and the probe views no query left reads. Left to the
        least-recently-used order, a TPC-H query's kept plans and probes outlived it by
        30-100 MiB of heap each."""
        self._plans.forget(owner)
        self._analysed.forget(owner)
        for name, probe in list(self._probes.items()):
            if probe.owners is not None:
                probe.owners.discard(owner)
                if not probe.owners:
                    self._drop_probe(name)

    def _drop_probe(self, name: str) -> None:
        self._probe_characters -= self._probes.pop(name).characters
        drop_view(self.spark, name)

    def close(self) -> None:
        """Forget the kept plans, release the slots' rows and drop their views."""
        self._plans.clear()
        self._analysed.clear()
        self._bound.clear()
        for number in range(1, self._slots + 1):
            self._rows.release(self._slot(number))
        for view in [*self._views, *self._probes]:
            drop_view(self.spark, view)
        self._views.clear()
        self._probes.clear()
        self._probe_characters = 0


#: what :func:`run` calls before a statement planned anew runs, with what gives the views its
#: analysed plan reads (:func:`analysed_views`); see :meth:`Binder.run`
Prepare = Callable[[Callable[[], Counter[str]]], bool]


class _Statement(NamedTuple):
    """What a :class:`Binder` keeps of a statement: its DataFrame (a kept plan, or one of its
    analysed plan alone), the views it reads (``Binder._views_read``), what gives the
    views its analysed plan reads (:func:`analysed_views`), the queries whose evaluation
    it is part of (``Binder.owners``) and, for a plan run on the driver, what it was
    prepared into there (:attr:`Collected.prepared`)."""

    frame: "DataFrame"
    views: frozenset[str]
    reads: Callable[[], Counter[str]]
    owners: frozenset[object]
    prepared: object | None = None


class _Probe(NamedTuple):
    """A parameterized probe's view kept by a :class:`Binder`: its DataFrame, the views its
    definition reads, the definition's length, and the queries whose statements read it
    (None: the engine's own statements do, so no query's end drops it)."""

    frame: "DataFrame"
    views: frozenset[str]
    characters: int
    owners: set[object] | None


class _Kept:
    """Statements kept by their text, the least recently used dropped first while there are
    more than ``capacity`` or their estimated size (``per_character`` bytes per character of
    their text, times the weight each is added with) exceeds ``memory``; a statement larger
    than ``memory`` alone is not kept."""

    def __init__(self, capacity: int, memory: int, per_character: int):
        self.capacity = capacity
        self.memory = memory
        self.per_character = per_character
        self._statements: OrderedDict[str, _Statement] = OrderedDict()
        self._weighted: dict[str, int] = {}  # per statement, its characters times its weight

    def __contains__(self, sql: str) -> bool:
        return sql in self._statements

    @property
    def _characters(self) -> int:
        """The kept statements' characters, each times its weight."""
        return sum(self._weighted.values())

    def __iter__(self) -> Iterator[str]:
        return iter(self._statements)

    def values(self) -> list[_Statement]:
        """The kept statements, least recently used first."""
        return list(self._statements.values())

    def get(self, sql: str) -> _Statement | None:
        """The statement kept for ``sql`` (now the most recently used), or None."""
        found = self._statements.get(sql)
        if found is not None:
            self._statements.move_to_end(sql)
        return found

    def add(self, sql: str, statement: _Statement, weight: float = 1.0) -> None:
        """Keep ``statement`` for ``sql``, counted as ``weight`` times its characters, dropping
        the least recently used to make room."""
        weighted = int(len(sql) * weight)
        if weighted * self.per_character > self.memory or sql in self._statements:
            return
        self._statements[sql] = statement
        self._weighted[sql] = weighted
        while len(self._statements) > self.capacity or self._characters * self.per_character > self.memory:
            self._drop(next(iter(self._statements)))

    def keep_reading(self, views: frozenset[str]) -> None:
        """Drop the statements that read a view not among ``views`` (one dropped since)."""
        for sql in [sql for sql, kept in self._statements.items() if not kept.views <= views]:
            self._drop(sql)

    def forget(self, owner: object) -> None:
        """Drop the statements ``owner`` took part in."""
        for sql in [sql for sql, kept in self._statements.items() if owner in kept.owners]:
            self._drop(sql)

    def clear(self) -> None:
        """Drop every statement."""
        self._statements.clear()
        self._weighted.clear()

    def _drop(self, sql: str) -> None:
        del self._statements[sql]
        del self._weighted[sql]


def current() -> Binder | None:
    """The binder active in this thread (None: rows are written into statements)."""
    return _current.get()


@contextmanager
def binding(binder: Binder | None, restart: bool = True, owners: Iterable[object] = ()) -> Iterator[None]:
    """Make ``binder`` (None: none) the active one for the statements built and run inside,
    numbering its slots from the first (``restart=False``: going on from the slots bound
    before, for a statement that also reads relations built in an earlier block), their
    kept plans and probes belonging to the queries ``owners`` (see :meth:`Binder.forget`)."""
    if binder is not None and restart:
        binder.restart()
    token = _current.set(binder)
    if binder is not None:
        before, binder.owners = binder.owners, frozenset(owners)
    try:
        yield
    finally:
        _current.reset(token)
        if binder is not None:
            binder.owners = before


def run(spark: "SparkSession", sql: str, prepare: "Prepare | None" = None) -> pa.Table:
    """The rows of ``sql`` as Arrow: through the active binder's kept plans, if one is active.
    ``prepare`` is called with what gives the views the statement's analysed plan reads
    (:func:`analysed_views`) before it runs, unless a kept plan runs."""
    binder = current()
    if binder is not None:
        return binder.run(sql, prepare)
    frame = spark.sql(sql)
    if prepare is not None:
        prepare(_counted_once(frame))
    return frame.toArrow()


@dataclass
class DriverRun:
    """One statement computed in the driver's JVM instead of a Spark job (it read only rows
    the driver holds; :func:`collected`): its description (what its job's would have been),
    duration, and the rows it read."""

    description: str | None
    seconds: float
    rows_read: int = 0


class Collected(NamedTuple):
    """A statement's rows (:func:`collected`) and, when the driver's JVM computed them
    without a Spark job, the rows its scans read there (None when a job ran) and the plan
    as prepared to run there (a ``DriverRun.Prepared`` in the JVM; None when a job ran),
    which runs it again for less (its RDDs built once)."""

    table: pa.Table
    read_on_driver: int | None
    prepared: object | None = None


def collected(frame: "DataFrame", job: "Callable[[], DataFrame] | None" = None,
              prepared: object | None = None) -> Collected:
    """The rows of ``frame`` as Arrow, as ``frame.toArrow()`` gives them. A plan that reads
    only bound and literal rows, with no subquery, no exchange but into one partition, and no
    Python other than ``mapInArrow`` (run in a Python worker of the driver's), runs in the
    driver's JVM as its one task would, without a Spark job (``DriverRun`` in
    ``factflow/jvm``; its exchanges and persisted parts computed there, anew, unless they
    come to more than :data:`DRIVER_HELD_FRACTION` of the driver's heap); any other runs as a
    job (``job()``'s DataFrame, if given, instead of ``frame``), as every plan does on a session
    without factflow's jar on the driver. ``prepared``, what an earlier run of ``frame``
    returned as :attr:`Collected.prepared`, runs it again without preparing it anew."""
    spark = frame.sparkSession
    held = int(_driver_heap(spark) * DRIVER_HELD_FRACTION)
    if prepared is not None:
        found = prepared.collect(tempfile.gettempdir(), held)
    else:
        driver_run = spark._jvm.factflow.jvm.DriverRun  # a JavaPackage, not a class, without the jar
        found = driver_run.collect(frame._jdf, tempfile.gettempdir(), held) if isinstance(driver_run, JavaClass) else None
    if found is None:
        return Collected((frame if job is None else job()).toArrow(), None)
    schema = to_arrow_schema(frame.schema, error_on_duplicated_field_names_in_struct=True,
                             prefers_large_types=spark._jconf.arrowUseLargeVarTypes())
    path = found.file()  # a file: Py4J hands over bytes slowly (43 ms for 7.5 KB)
    try:
        with pa.OSFile(path) as file:
            table = pa.ipc.open_stream(file).read_all()
    finally:
        os.remove(path)
    return Collected(table.cast(schema), found.rowsRead(), found.prepared())


def analysed_views(frame: "DataFrame") -> Counter[str]:
    """The views ``frame``'s analysed plan reads, each as often as it appears there (a view
    read by a view read twice counts twice)."""
    return _views_in(frame._jdf.queryExecution().analyzed())


def _views_in(plan: object) -> Counter[str]:
    """:func:`analysed_views` of an analysed logical plan (a JVM object)."""
    return Counter(_ANALYSED_VIEW.findall(plan.toString()))


def _counted_once(frame: "DataFrame") -> "Callable[[], Counter[str]]":
    """:func:`analysed_views` of ``frame``, computed when first asked for and then
    remembered (the plan's text costs up to 0.1 s, and most statements read no probe)."""
    return functools.cache(functools.partial(_views_in, frame._jdf.queryExecution().analyzed()))


@functools.lru_cache(maxsize=8)
def _driver_heap(spark: "SparkSession") -> int:
    """The most heap ``spark``'s driver may use, in bytes."""
    return spark._jvm.java.lang.Runtime.getRuntime().maxMemory()


def _replanned(spark: "SparkSession", frame: "DataFrame") -> "DataFrame":
    """A new DataFrame of ``frame``'s analysed plan: Spark skips its analysis and optimizes
    and plans it anew when it runs (holding it holds none of ``frame``'s other plans)."""
    from pyspark.sql import DataFrame

    plan = frame._jdf.queryExecution().analyzed()
    return DataFrame(spark._jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, plan), spark)
