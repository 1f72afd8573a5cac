"""Evaluating the stateful operators of many dataflows for one epoch (or one install).

Every stateful operator has pending rows to append to its trace; the result operators'
pending rows are also what subscribers receive. They are computed in *rounds*: all that
can be computed together goes into one Spark statement per round, and only a
:class:`Distinct` of a bulk epoch is split over two rounds, so that its
consolidated input change ``d`` is materialized once instead of being computed twice
(once to find the keys whose old counts it needs, once to combine with them); in a small
epoch the old counts are probed by ``d``'s keys in the same pass (see
:mod:`factflow.dataflow.lookup`).

Small epochs, and installs over small state, fetch each round with one job into driver
memory (local batches); bulk epochs and other installs checkpoint every result in Spark
instead. What a fetch may bring to the driver is bounded in rows, inside the statement
(``EngineConfig.fetch_limit``, shared by the round's relations, see
:mod:`factflow.engine.collect`): an operator whose pending rows exceed their share (a
tiny change with an enormous intermediate result, such as a join-at-a-time triangle
query's two-step paths) is checkpointed in Spark instead, after the round's other
operators are committed from the fetch. Spark's own
``spark.driver.maxResultSize`` (factflow's sessions: 512 MiB) is the second bound: a round
Spark stops at it is checkpointed in Spark as a whole. That one alone did not suffice: it
is checked on the driver once a task's result has arrived, and a small statement runs in
one partition, so its one task result could be larger than the driver's heap (oregon1's
triangles in batches of 1,000 nodes ran a 2 GiB driver out of memory that way).

The default of a million rows is measured against that failure, with rows of the
collector's wide shape (five long and three string slots) computed in one task: a fresh
2 GiB driver fetched 4 million and ran out of heap at 6 million, a 1 GiB driver fetched 2
million, a 512 MiB one ran out at 1 million. A million such rows (73 MiB as Arrow) thus
take at most about a quarter of a 2 GiB heap, as ``spark.driver.maxResultSize`` intends,
which leaves room for what the engine keeps there besides. Rows are not bytes: much
wider rows narrow that margin.

A fixpoint's iterations (:meth:`Evaluation.collect`) are fetched the same way, each
iteration's sets sharing the limit, and a set over its share is kept in Spark instead, as
index files (:mod:`factflow.arrangement.filed`; one job computes and writes it), from
which later iterations read it: a recursive component whose sets outgrow the driver
iterates in Spark, a small one stays on the driver. A set that went over its share is
written to Spark directly in the next iteration (no fetch is tried first) until it
shrinks back within its share; once any set of an evaluation is in Spark, or a component
holds more tuples than a fetch may bring, fetches run with the session's own settings
rather than a small statement's (one partition, nothing compiled), since they read large
sets. What the iterations accumulate is concatenated where it lives: driver-held rows by
pandas while they fit in one fetch (then they are written to Spark), Spark-held files by
listing them together (no job). A component's change kept in Spark is appended to its
traces as a stored batch. The evaluation's files are removed when it ends.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from factflow.arrangement.batch import DIFF, checkpoint, local_relation, release_checkpoint
from factflow.arrangement.filed import FiledRows, HeldRows
from factflow.arrangement.index import remove_index
from factflow.arrangement.trace import Trace
from factflow.arrangement.views import drop_view, one_partition, register_view
from factflow.dataflow import zset
from factflow.dataflow.context import EpochContext
from factflow.dataflow.nodes import OUT, Columns, Distinct, Node, Stateful
from factflow.dataflow.recursion import Fixpoint
from factflow.engine.collect import Collector
from factflow.engine.speculation import Misspeculated
from factflow.model.frames import spark_frame
from factflow.model.types import Kind, spark_type
from factflow.storage.location import Location

if TYPE_CHECKING:  # pragma: no cover
    from contextlib import AbstractContextManager
    from typing import Callable

__all__ = ["Evaluation"]

log = logging.getLogger(__name__)

STATE, PENDING = "state", "pending"


def _stateful_inputs(node: Node) -> list[Node]:
    """Evaluated operators (stateful ones and fixpoints) whose output ``node`` reads directly."""
    def evaluated(n: Node) -> bool:
        return isinstance(n, (Stateful, Fixpoint))

    return [n for n in node.reachable(stop=evaluated) if evaluated(n)]


class Evaluation:
    """One evaluation of a set of stateful operators; :meth:`run` commits and returns outputs."""

    def __init__(self, spark: SparkSession, cx: EpochContext, small_statements: "Callable[[], AbstractContextManager]",
                 fetch_limit: int, directory: Location, recompute_fraction: float = 0.5,
                 small_rows: int = 20_000, check: str | None = None):
        self.spark = spark
        #: the relation checking the epoch's guessed changes, until it is checked: with the
        #: first round's fetch, else alone at the end (see :mod:`factflow.engine.speculation`)
        self.check = check
        self.cx = cx
        self.small_statements = small_statements
        self.fetch_limit = fetch_limit
        self.recompute_fraction = recompute_fraction
        self.small_rows = small_rows
        #: traces whose pending rows this small evaluation kept in Spark instead of fetching them
        self.kept: list[str] = []
        self._views: list[str] = []
        self._stored: list[DataFrame] = []
        #: rows of the materialized relations of fixpoints: on the driver, in files, or both
        self._local: dict[str, pd.DataFrame] = {}
        self._files: dict[str, FiledRows] = {}
        #: where this evaluation writes the sets it keeps in Spark (created on the first
        #: write, removed at the end), and where large outputs go (removed by their readers)
        self._root = directory
        self._directory = directory.child(f"evaluation-{uuid.uuid4().hex}")
        self._writes = 0
        self._counts: dict[str, tuple[int, int]] = {}  # per key of collect: its rows in the two latest calls
        #: rows of the driver-held relations made so far: each lives in the driver's JVM (a
        #: local relation, and a broadcast copy where a join reads it) until the evaluation ends
        self._held = 0
        self._large_state = False  # whether the fixpoint running holds more tuples than a fetch may bring

    def schedule(self, nodes: list[Stateful]) -> list[list[tuple[Stateful, str]]]:
        """Rounds of (operator, step) pairs; a split Distinct computes STATE a round before PENDING."""
        rounds: dict[int, int] = {}

        def pending_round(n: Node) -> int:
            if id(n) not in rounds:
                base = max((pending_round(u) + (1 if isinstance(u, Fixpoint) else 0) for u in _stateful_inputs(n)),
                           default=0)
                rounds[id(n)] = base + (1 if self._split(n) or isinstance(n, Fixpoint) else 0)
            return rounds[id(n)]

        schedule: list[list[tuple[Stateful, str]]] = []
        for n in nodes:
            r = pending_round(n)
            while len(schedule) <= r:
                schedule.append([])
            if self._split(n):
                schedule[r - 1].append((n, STATE))
            schedule[r].append((n, PENDING))
        return [steps for steps in schedule if steps]

    def _split(self, node: Stateful) -> bool:
        """Whether ``node`` is a Distinct of a bulk epoch (an install's old state is empty,
        so its input change is read once without a split)."""
        cx = self.cx
        return isinstance(node, Distinct) and not cx.small and not cx.install

    def run(self, nodes: list[Node], subscribed: dict[Stateful, list[str] | None],
            description: str) -> dict[Stateful, pd.DataFrame | HeldRows]:
        """Compute, commit and return the pending rows of ``nodes`` (outputs of result operators).

        ``subscribed`` maps the result operators whose rows a bulk evaluation must return
        to the columns their subscribers receive changes on (None: the whole rows, on the
        driver, as pull stages need them). A small evaluation returns every result
        operator's rows it fetched. Rows of a subscribed operator beyond ``fetch_limit``
        are returned as its changes, consolidated onto those columns, kept in Spark as
        files of at most ``fetch_limit`` rows each (:class:`HeldRows`, the caller's to
        release)."""
        outputs: dict[Stateful, pd.DataFrame | HeldRows] = {}
        try:
            for number, steps in enumerate(self.schedule(nodes)):
                label = f"{description} (round {number + 1})" if number else description
                for node, _ in steps:
                    if isinstance(node, Fixpoint):
                        self._fixpoint(node, label)
                steps = [(node, step) for node, step in steps if not isinstance(node, Fixpoint)]
                if not steps:
                    continue
                if self.cx.small:
                    try:
                        steps = self._fetch(steps, outputs, label)
                    except Exception as exc:  # noqa: BLE001 - only the result-size limit is handled
                        if not _over_result_limit(exc):
                            raise
                        log.info("%s: the round's rows exceed spark.driver.maxResultSize; kept in Spark", label)
                    if not steps:
                        continue
                    self.kept += [node.writer.name for node, _ in steps]
                self._store(steps, outputs, subscribed, label)
            if self.check is not None:
                self._verify(Collector(), description)
        finally:
            for view in self._views:
                drop_view(self.spark, view)
            self.cx.release()
            for stored in self._stored:
                release_checkpoint(stored)
            if self._writes:
                remove_index(self._directory)
        for node in nodes:
            for trace in (node.writers.values() if isinstance(node, Fixpoint) else [node.writer]):
                trace.advance_upper(self.cx.epoch + 1)
        return outputs

    # ------------------------------------------------------------ recursive components
    def _fixpoint(self, node: Fixpoint, label: str) -> None:
        """Run a fixpoint's iterations (each materialized) and commit its rules' changes:
        fetched and appended from the driver when they fit, else checkpointed and appended
        as stored batches (a change computed from sets in Spark is not tried as a fetch)."""
        cx = self.cx
        self._large_state = sum(handle.tuples for handle in node.handles.values()) > self.fetch_limit
        writes = self._writes
        # a large component's iterations read its sets in full: by SQL joins over the
        # session's partitions, even in a small epoch (not by probes, in one partition)
        run_cx = cx.child(probes=False, single_partition=False) if self._large_state else cx
        changes = node.run(run_cx, self, label, self.recompute_fraction)
        in_spark = self._writes > writes
        fetched = {} if in_spark else self._fetch_rows(
            cx, {r: (c, node.rules[r]) for r, c in changes.items()}, f"{label}: changes", small=True)
        for rule, output in node.outputs.items():
            frame = fetched.get(rule)
            if rule not in changes:
                change = None
            elif frame is not None:
                change = self._local_relation(frame, node.rules[rule]) if len(frame) else None
                if change is not None:
                    node.writers[rule].append_pandas(frame, cx.epoch)
            else:
                change = self._append_stored(node.writers[rule], changes[rule], f"{label}: changes of {rule}")
                if cx.small and not cx.install:
                    self.kept.append(node.writers[rule].name)
            output.publish(cx, change)
        self._large_state = False

    def collect(self, cx: EpochContext, relations: dict[str, tuple[str, Columns]],
                label: str) -> dict[str, tuple[str, int]]:
        """Evaluate ``relations``, each into driver memory if its rows are within its share
        of ``fetch_limit`` (one job for all), else into files in Spark (a job for each); per
        key, the materialized relation and its row count.

        A key whose rows are expected over their share is written to Spark at once rather
        than fetched first (a failed fetch computes the relation in vain): the rows of its
        latest call, grown at the rate of the two latest calls. Fetches run as small
        statements (one partition, nothing compiled) only while the keys expect at most
        ``small_rows`` rows and no set of the evaluation is in Spark. Local checkpoints
        would not do for the rows kept in Spark: unions of several of them over the same
        views trip Spark 4.1's optimizer (attribute lookups fail in PruneFilters); files
        read back by :class:`FiledRows` share no plan.
        """
        if not relations:
            return {}
        share = self._budget() // len(relations)
        expected = {key: self._expected(key) for key in relations}
        fetched = self._fetch_rows(cx, {k: v for k, v in relations.items() if share and expected[k] <= share},
                                   label, small=max(expected.values()) <= self.small_rows)
        out = {}
        for key, (relation, columns) in relations.items():
            frame = fetched.get(key)
            if frame is not None:
                out[key] = (self._local_relation(frame, columns), len(frame))
            else:
                self.spark.sparkContext.setJobDescription(f"{label}: {key} in Spark")
                files = self._write(self.spark.sql(cx.statement(f"SELECT * FROM {relation}")),
                                    spread=expected[key] > self.small_rows)
                out[key] = (self._relation(files, None, columns), files.rows)
            self._counts[key] = (self._counts.get(key, (0, 0))[1], out[key][1])
        return out

    def _expected(self, key: str) -> int:
        """The rows the next call of ``key`` is expected to have (see :meth:`collect`)."""
        before, latest = self._counts.get(key, (0, 0))
        return latest * latest // before if before else latest

    def concat(self, relations: list[str], columns: Columns) -> str:
        """One relation holding the rows of materialized ``relations``: the driver-held rows
        concatenated (written to Spark once they exceed ``fetch_limit``), the files listed
        together."""
        files = [self._files[r] for r in relations if r in self._files]
        local = [self._local[r] for r in relations if r in self._local]
        together = FiledRows.concat(files) if files else None
        rows = pd.concat(local, ignore_index=True) if local else None
        if rows is not None and len(rows) > self._budget():
            self.spark.sparkContext.setJobDescription("recursive rows over the driver's budget, to Spark")
            written = self._write(spark_frame(self.spark, rows, _schema(columns)), spread=True)
            together, rows = (FiledRows.concat([together, written]) if together else written), None
        return self._relation(together, rows, columns)

    def _budget(self) -> int:
        """The rows fetches may still bring to the driver in this evaluation: ``fetch_limit``
        less the rows of the driver-held relations made so far. Bounding them together, not
        each fetch alone, is what bounds the driver's memory: a fixpoint's sets are fetched
        and concatenated iteration after iteration, and every relation made stays in the
        JVM until the evaluation ends (maintaining reachability from 1,000 sources over
        gnp10K held 2.6 million rows that way, ten relations of a quarter of a fetch each,
        and ran a 2 GiB driver out of heap)."""
        return max(self.fetch_limit - self._held, 0)

    def _fetch_rows(self, cx: EpochContext, relations: dict[str, tuple[str, Columns]], label: str,
                    small: bool) -> dict[str, pd.DataFrame | None]:
        """Per key, the rows of the relation fetched to the driver with one job, or None
        when they exceed their share of what remains of the evaluation's budget
        (:meth:`_budget`); as small statements if ``small`` and the evaluation reads no
        large sets."""
        if not relations:
            return {}
        collector = Collector()
        for relation, columns in relations.values():
            collector.add(f"(SELECT * FROM {relation})", list(columns) + [(DIFF, Kind.LONG)])
        limit = self._budget()
        if not small or self._files or self._large_state:
            frames = collector.run(self.spark, cx, limit, label)
        else:
            with self.small_statements():
                frames = collector.run(self.spark, cx, limit, label)
        return dict(zip(relations, frames))

    def _write(self, frame: DataFrame, spread: bool) -> FiledRows:
        """``frame``'s rows kept in Spark, as files of this evaluation (one job); ``spread``:
        in at least a file per shuffle partition, since a statement reads a file per task
        (a large set computed in one partition, from a small relation, would otherwise be
        read by one task)."""
        self._writes += 1
        partitions = int(self.spark.conf.get("spark.sql.shuffle.partitions"))
        if spread and frame._jdf.queryExecution().executedPlan().outputPartitioning().numPartitions() < partitions:
            frame = frame.repartition(partitions)
        return FiledRows.write(frame, self._directory, str(self._writes))

    def _relation(self, files: FiledRows | None, local: pd.DataFrame | None, columns: Columns) -> str:
        """A relation of ``files`` and ``local`` rows together, remembered as both."""
        if files is None or not files.rows:
            return self._local_relation(local if local is not None else _empty(columns), columns)
        view = register_view(files.frame(self.spark), prefix="ff_s")
        self._views.append(view)
        relation = view
        if local is not None and len(local):
            relation = f"(SELECT * FROM {view} UNION ALL SELECT * FROM {self._local_relation(local, columns)})"
            self._local[relation] = local
        self._files[relation] = files
        return relation

    def _append_stored(self, trace: Trace, relation: str, label: str) -> str | None:
        """Checkpoint ``relation`` (a consolidated change) organized as ``trace`` stores it,
        append it and return a view of it (None when it has no rows)."""
        stored, rows, view = self._checkpointed(trace, relation, label)
        if not rows:
            self._stored.append(stored)
            return None
        self._append(trace, stored, rows)
        return view

    def _local_relation(self, data: pd.DataFrame, columns: Columns) -> str:
        relation, view = local_relation(self.spark, data, _schema(columns), prefix="ff_l")
        self._held += len(data)
        if view is not None:
            self._views.append(view)
        relation = one_partition(relation)
        self._local[relation] = data
        return relation

    # ------------------------------------------------------------ small epochs: fetch to the driver
    def _fetch(self, steps, outputs, label: str) -> list[tuple[Stateful, str]]:
        """Fetch and commit the round's pending rows with one job; returns the steps whose
        relations exceeded their share of ``fetch_limit`` (nothing of them committed).

        Every step is a PENDING one: a small epoch splits no Distinct (see :meth:`_split`).
        """
        cx = self.cx
        collector = Collector()
        fetched_steps = []
        for node, step in steps:
            relation = node.pending(cx)
            if relation is None:
                continue
            extra = [(DIFF, Kind.LONG)] + ([(OUT, Kind.LONG)] if isinstance(node, Distinct) else [])
            collector.add(relation, list(node.columns) + extra)
            fetched_steps.append((node, step))
        frames = self._verify(collector, label) if self.check is not None else None
        if frames is None:
            with self.small_statements():
                frames = collector.run(self.spark, cx, self.fetch_limit, label)
        over = []
        for (node, step), frame in zip(fetched_steps, frames):
            if frame is None:
                over.append((node, step))
            else:
                node.writer.append_pandas(frame[node.names + [DIFF]], cx.epoch)
                outputs[node] = frame
        if over:
            log.info("%s: the rows of %s exceed their share of fetch_limit (%d); kept in Spark", label,
                     ", ".join(node.writer.name for node, _ in over), self.fetch_limit)
        return over

    def _verify(self, collector: Collector, label: str) -> list[pd.DataFrame | None]:
        """Fetch ``collector``'s relations and the check of the guessed changes with one job;
        raise :class:`Misspeculated` (nothing of the fetch committed) unless the check has no
        rows. Returns the frames of the collector's relations."""
        position = collector.add(self.check, [("a", Kind.LONG)])
        with self.small_statements():
            frames = collector.run(self.spark, self.cx, self.fetch_limit, f"{label}; its guessed changes checked")
        found = frames.pop(position)
        if found is None or len(found):
            raise Misspeculated(set() if found is None else set(found["a"].tolist()))
        self.check = None
        return frames

    # ------------------------------------------------------------ bulk epochs and installs: keep in Spark
    def _store(self, steps, outputs, subscribed, label: str) -> None:
        cx = self.cx
        for node, step in steps:  # inputs first, so later operators read materialized frames
            relation = node.state_delta(cx) if step == STATE else node.pending(cx)
            if relation is None:
                continue
            stored, rows, view = self._checkpointed(node.writer, relation, f"{label}: {node.writer.name} ({step})")
            if step == STATE:
                cx.set(node, "state", view)
                self._stored.append(stored)
                continue
            node.adopt(cx, view)
            self._append(node.writer, stored, rows)
            if node in subscribed:
                outputs[node] = self._output(node, stored, view, rows, subscribed[node], label)

    def _checkpointed(self, trace: Trace, relation: str, label: str) -> tuple[DataFrame, int, str]:
        """``relation`` organized as ``trace`` stores batches and checkpointed (one job): the
        checkpoint, its rows and a view of it."""
        frame = self._organized(trace, self.spark.sql(self.cx.statement(f"SELECT * FROM {relation}")))
        self.spark.sparkContext.setJobDescription(label)
        stored, rows = checkpoint(frame, self._expected_rows(trace))
        view = register_view(stored, prefix="ff_p")
        self._views.append(view)
        return stored, rows, view

    def _expected_rows(self, trace: Trace) -> int:
        """About how many rows a checkpoint of ``trace``'s changes may hold (how its blocks
        are kept, see :func:`~factflow.arrangement.batch.storage_level`): an evaluation that
        kept sets in Spark, or runs a fixpoint holding more than a fetch, may write as many
        as those sets hold; otherwise the changes of an epoch are taken to be at most what
        the trace holds."""
        if self._writes or self._large_state:
            return max(self.fetch_limit, trace.tuples) + 1
        return trace.tuples

    def _append(self, trace: Trace, stored: DataFrame, rows: int) -> None:
        """Append a checkpointed change to ``trace``; the checkpoint is released when the
        evaluation ends unless the batch now owns it."""
        batch = trace.append_stored(stored.select(*trace.layout.names, DIFF), rows, self.cx.epoch, stored)
        if batch is None or not batch.owns_stored:
            self._stored.append(stored)

    def _output(self, node: Stateful, stored: DataFrame, view: str, rows: int, columns: list[str] | None,
                label: str) -> pd.DataFrame | HeldRows:
        """A subscribed operator's rows: fetched whole when they fit in one fetch (or when
        wanted whole), else its changes on ``columns`` written to Spark in chunks (one job)."""
        self.spark.sparkContext.setJobDescription(f"{label}: output of {node.writer.name}")
        if columns is None or rows <= self.fetch_limit:
            return stored.toArrow().to_pandas()
        diff = OUT if isinstance(node, Distinct) else DIFF
        picked = ", ".join([zset.ident(c) for c in columns] + [f"{zset.ident(diff)} AS {zset.ident(DIFF)}"])
        changes = self.spark.sql(zset.consolidate(f"(SELECT {picked} FROM {view})", columns))
        root = self._root.child(f"changes-{uuid.uuid4().hex}")
        return HeldRows(FiledRows.write(changes, root, "rows", chunk=self.fetch_limit, expected=rows))

    def _organized(self, trace: Trace, frame: DataFrame) -> DataFrame:
        """``frame`` organized as ``trace`` stores batches. An install's rows that Spark
        plans in one partition (from a small start, see :class:`factflow.dataflow.delta.DeltaJoin`)
        are sorted where they are, not shuffled, so that its statement runs as one stage;
        the plan that tells is the one the checkpoint then runs (other installs plan their
        statement twice: tens of milliseconds, against seconds of work)."""
        if self.cx.install:
            sorted_in_place = trace.organize(frame, shuffle=False)
            if sorted_in_place._jdf.queryExecution().executedPlan().outputPartitioning().numPartitions() == 1:
                return sorted_in_place
        return trace.organize(frame)


def _schema(columns: Columns) -> T.StructType:
    """The Spark schema of a relation of ``columns`` and ``_diff``."""
    return T.StructType([T.StructField(n, spark_type(k), True) for n, k in columns]
                        + [T.StructField(DIFF, T.LongType(), False)])


def _empty(columns: Columns) -> pd.DataFrame:
    return pd.DataFrame({name: [] for name in [n for n, _ in columns] + [DIFF]})


def _over_result_limit(exc: BaseException) -> bool:
    """Whether a Spark failure is a collect stopped by ``spark.driver.maxResultSize``."""
    return "maxResultSize" in str(exc)
