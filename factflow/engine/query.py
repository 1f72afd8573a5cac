"""The handle a client holds on an installed query."""

from __future__ import annotations

import re
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import pandas as pd
from pyspark.sql import DataFrame

from factflow.arrangement.batch import DIFF, checkpoint_eagerly
from factflow.arrangement.filed import FiledRows, HeldRows
from factflow.dataflow import zset
from factflow.dataflow.nodes import OUT, Distinct, Stateful
from factflow.dataflow.zset import ident
from factflow.engine.definition import QueryDefinition
from factflow.engine.granularity import Window
from factflow.engine.pull import PullView
from factflow.engine.history import History, changes_sql, oldest_available
from factflow.engine.rows import changes_from_frame, python_rows
from factflow.model.frames import consolidated
from factflow.errors import EngineClosedError, HistoryCompactedError, QueryError
from factflow.io.sinks import CHANGE, Sink, SinkWriter
from factflow.model.types import Kind
from factflow.lang.ast import Pull
from factflow.engine.dataflow import Dataflow
from factflow.planner.plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.engine import Engine

__all__ = ["Query", "Subscriber"]

Subscriber = Callable[[int, list], None]


class Query:
    """An installed query: its current result and a stream of consolidated changes.

    ``results()`` gives the result as of the latest epoch, shaped by the find spec:

    - relation ``[:find ?a ?b]``: ``{row_tuple: multiplicity}`` (multiplicity 1 under set
      semantics, the number of derivations under multiset semantics);
    - collection ``[:find [?a ...]]``: a list of the values, sorted where they compare
      (each value once under set semantics, repeated per multiplicity under multiset);
    - tuple ``[:find [?a ?b]]``: one row as a tuple, or None when the result is empty;
    - scalar ``[:find ?a .]``: one value, or None when the result is empty.

    Where a tuple or scalar query has several rows, the smallest is returned (Datomic
    returns an arbitrary one; factflow keeps it deterministic). A pull expression's
    position holds a :class:`factflow.PullMap` (see :mod:`factflow.engine.pull`); rows with
    pulls are kept on the driver, so reading them runs no Spark job.
    A query installed with ``slack=N`` also answers ``results(as_of=E)`` and
    ``rows(as_of=E)`` for the N closed epochs before the latest (see
    :mod:`factflow.engine.history`).
    ``subscribe(fn)`` calls ``fn(epoch, [(row, diff), ...])`` after every epoch in which
    the result changed; summing the diffs from the install epoch on gives ``results()``.
    ``changes_frame(since)`` gives those changes as a Spark DataFrame, ``write_to(path)``
    writes them to a directory after every epoch (:mod:`factflow.io.sinks`), and a query
    installed with a granularity delivers them at most once per window
    (:mod:`factflow.engine.granularity`).

    Threads: ``results()``, ``rows()``, ``frame()`` and ``explain()`` may be called from
    any thread, also while another one runs an epoch. Each reads under the engine lock, so
    it sees exactly the latest closed epoch (never part of a running one): it waits for a
    running epoch to close, and the next epoch waits for its Spark job. (Reading outside
    the lock is not safe: an epoch's maintenance merges batches and frees the stored ones.)
    Subscribers are called outside the lock, on the thread that ran the epoch (see
    :mod:`factflow.engine.delivery`).

    Once the query is closed, every public method and property but :meth:`close` raises
    :class:`~factflow.EngineClosedError` (the attributes set when it was installed, such as
    ``name`` and ``definition``, stay readable). The members whose names start with an
    underscore serve the engine, whose delivery of an epoch committed before the close may
    still be under way.
    """

    def __init__(self, engine: "Engine", dataflow: Dataflow, installed_at: int, lock: threading.RLock,
                 definition: QueryDefinition):
        self._engine = engine
        self._lock = lock
        self.dataflow = dataflow
        self.name = dataflow.name
        self.installed_at = installed_at
        #: when it was installed (seconds since the Unix epoch)
        self.installed_time = time.time()
        #: what the query was installed from (a durable engine keeps it to install it again)
        self.definition = definition
        #: closed epochs before the latest that ``rows(as_of=...)`` can read
        self.slack = definition.slack
        #: whether it is installed again when its engine's state directory is reopened
        self.durable = False
        #: whether ``Engine(introspection=True)`` describes it (``Engine.query(introspect=...)``)
        self.introspect = True
        self._subscribers: list[Subscriber] = []
        self._sinks: list[SinkWriter] = []
        #: the granularity window holding changes back (None: every epoch is delivered)
        self.window: Window | None = None
        self.closed = False
        self._pull = PullView(dataflow) if dataflow.pulls else None
        if self._pull is not None:
            try:
                self._pull.load(engine.spark, installed_at, self._current_sql())
            except BaseException:
                dataflow.close()
                raise

    @property
    def plan(self) -> Plan:
        """The plan the query was installed from (see :mod:`factflow.planner.plan`): plain
        data, equal to ``Engine.plan`` of the same text, inputs, join and semantics."""
        self._check()
        return self.dataflow.plan

    @property
    def columns(self) -> list[str]:
        """The :find elements, in order (``?x`` or an aggregate such as ``(count ?x)``)."""
        self._check()
        return [str(v) for v, _ in self.dataflow.find]

    def _report(self):
        kinds = dict(self.dataflow.result.columns)
        return [(col, kinds[col]) for _, col in self.dataflow.find]

    def _decode(self, rows: list[tuple]) -> list[tuple]:
        decoders = [self.dataflow.decoders.get(col) for _, col in self.dataflow.find]
        if not any(decoders):
            return rows
        return [tuple(d(x) if d else x for d, x in zip(decoders, row)) for row in rows]

    def rows(self, as_of: int | None = None) -> dict[tuple, int]:
        """The result as of the latest closed epoch (or of the epoch ``as_of``, within the
        query's slack: :class:`factflow.HistoryError` otherwise) as ``{row_tuple:
        multiplicity}``, whatever the find spec (read under the engine lock, see the class
        docs; a result larger than a fetch is read as :meth:`chunks` does)."""
        return {row: n for chunk in self.chunks(as_of) for row, n in chunk}

    def chunks(self, as_of: int | None = None) -> Iterator[list[tuple[tuple, int]]]:
        """The result as :meth:`rows` gives it, in chunks of ``(row_tuple, multiplicity)``
        pairs: one chunk when the result trace holds at most ``EngineConfig.fetch_limit``
        rows (one fetch), else chunks of at most that many rows, which Spark writes once,
        under the engine lock, and the driver reads one at a time (so the driver's JVM never
        holds the whole result, and a caller that consumes each chunk never does either)."""
        held = pulled = None
        with self._lock:
            self._check()
            if self._pull is not None:
                if as_of is not None:
                    raise QueryError(f"query {self.name}: as_of reads are not supported for pull queries yet")
                pulled = list(self._pull.results().items())
            else:
                spark, limit = self._engine.spark, self._engine.config.fetch_limit
                frame = spark.sql(self._current_sql(as_of))
                spark.sparkContext.setJobDescription(f"results of {self.name}")
                expected = self.dataflow.result.handle.tuples
                if expected <= limit:
                    data = frame.toArrow().to_pandas()
                else:
                    root = self._engine.policy.directory.child(f"results-{uuid.uuid4().hex}")
                    held = HeldRows(FiledRows.write(frame, root, "rows", chunk=limit, expected=expected))
        if pulled is not None:
            return iter([pulled])
        if held is None:
            return iter([self._pairs(data)])
        return self._read(held)

    def _read(self, held: HeldRows) -> Iterator[list[tuple[tuple, int]]]:
        """The chunks of a result written by :meth:`chunks`, removed once read (or dropped)."""
        try:
            for data in held.files.chunks():
                yield self._pairs(data)
        finally:
            held.release()

    def _pairs(self, data: pd.DataFrame) -> list[tuple[tuple, int]]:
        """Rows of a consolidated result frame as ``(row_tuple, multiplicity)`` pairs."""
        rows = self._decode(python_rows(data, self._report()))
        return list(zip(rows, data[DIFF].astype("int64").tolist()))

    def results(self, as_of: int | None = None) -> Any:
        """The result as of the latest closed epoch (or of ``as_of``, as in :meth:`rows`),
        shaped by the find spec (see the class docs)."""
        rows = self.rows(as_of)
        kind = self.dataflow.find_kind
        if kind == "rel":
            return rows
        ordered = _sorted([row for row, n in rows.items() for _ in range(max(n, 0))])
        if kind == "coll":
            return [row[0] for row in ordered]
        if not ordered:
            return None
        return ordered[0][0] if kind == "scalar" else ordered[0]

    def frame(self) -> DataFrame:
        """The result as a Spark DataFrame: one column per :find variable (named without the
        '?') and ``_diff``, the multiplicity.

        It is the result as of the latest epoch closed when ``frame()`` is called, and stays
        exactly that, and valid, however many epochs follow (also after the query or the
        engine closes, while the Spark session lives). While the result is held on the
        driver (at most ``EngineConfig.local_limit`` rows per batch) the frame is lazy, its
        rows embedded in its plan; once the result has batches stored in Spark, which later
        epochs merge and free, the frame is materialized first with a local checkpoint (one
        Spark job), whose blocks Spark frees when the DataFrame is garbage collected.
        """
        renamed = [f"{ident(col)} AS {ident(_frame_column(v))}" for v, col in self.dataflow.find]
        with self._lock:
            frame = self._engine.spark.sql(f"SELECT {', '.join(renamed + [ident(DIFF)])} FROM ({self._current_sql()})")
            if self.dataflow.result.handle.stored:
                self._engine.spark.sparkContext.setJobDescription(f"frame of {self.name}")
                frame = checkpoint_eagerly(frame, self.dataflow.result.handle.tuples)
        return frame

    def _current_sql(self, as_of: int | None = None) -> str:
        """SQL of the consolidated result as of the latest closed epoch, or ``as_of`` (call under the engine lock)."""
        self._check()
        result = self.dataflow.result
        epoch = self._engine.epoch
        if as_of is not None:
            epoch = History.check(result.handle, as_of, self.installed_at, epoch, f"query {self.name}")
        updates = result.handle.read(epoch)
        if isinstance(result, Distinct):
            counts = zset.present(updates, result.names)
        else:
            counts = zset.consolidate(updates, result.names)
        report = [col for _, col in self.dataflow.find]
        if report != result.names:
            counts = zset.consolidate(f"({zset.select(f'({counts})', report)})", report)
        return counts

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(epoch, changes)`` after each epoch that changes the result; returns an unsubscribe function.

        ``fn`` receives every epoch that closes after ``subscribe`` returns (subscribing
        waits for a running epoch), in increasing order, and none after ``unsubscribe()``
        returns, unless its call is already under way. It is called outside the engine lock;
        if it raises, the error is logged and the epoch stays committed.

        Chunks: ``changes`` holds at most ``EngineConfig.fetch_limit`` rows. An epoch that
        changes the result by more rows than that comes in several calls with the same
        epoch, one after another, before any call of a later epoch; each row changes in
        one chunk only, and the chunks sum to the epoch's changes. They are kept in Spark
        and read one chunk at a time, so neither the driver's JVM nor Python holds more
        than a chunk for the delivery (see :mod:`factflow.engine.delivery`). A smaller
        epoch is one call, as always.
        """
        with self._lock:
            self._check()
            self._subscribers.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return unsubscribe

    @property
    def subscribers(self) -> tuple[Subscriber, ...]:
        """The functions subscribed now."""
        self._check()
        return tuple(self._subscribers)

    @property
    def has_subscribers(self) -> bool:
        """Whether anyone listens to this query's changes (subscribers or sinks)."""
        self._check()
        return bool(self._subscribers or self._sinks)

    @property
    def sinks(self) -> tuple[SinkWriter, ...]:
        """The sinks writing this query's changes."""
        self._check()
        return tuple(self._sinks)

    def output_columns(self) -> list[tuple[str, str, Kind]]:
        """Per find element: its internal column, its name in frames and sinks, its kind."""
        self._check()
        return self._output_columns()

    def _output_columns(self) -> list[tuple[str, str, Kind]]:
        return [(col, _frame_column(v), kind) for (v, _), (col, kind) in zip(self.dataflow.find, self._report())]

    def _output(self, frame: pd.DataFrame, diff: str) -> pd.DataFrame:
        """One epoch's output rows of the result operator consolidated onto the find
        elements' columns, with the change in ``_diff`` (what windows and sinks take)."""
        out = consolidated(frame, [col for _, col in self.dataflow.find], diff)
        return out.rename(columns={diff: DIFF}) if diff != DIFF else out

    def changes_frame(self, since: int | None = None) -> DataFrame:
        """The result's changes in every epoch after ``since`` as a Spark DataFrame: the
        find elements' columns (named as in :meth:`frame`), ``diff`` and ``epoch``, each row
        and epoch once, consolidated as subscribers receive them.

        History is kept back to :func:`factflow.engine.history.oldest_available`: a query's
        result trace compacts to the latest epoch less its ``slack`` (``db.query(...,
        slack=N)``). ``since=None`` means as far back as is kept: from the install on while
        its history is there (the install epoch's rows are then the whole result as of
        it), else after the oldest epoch kept. An older ``since`` raises
        :class:`HistoryCompactedError` naming both epochs. The frame is fixed and valid like
        :meth:`frame`'s. Not for queries with pull (:class:`QueryError`), whose changes it
        could not give as subscribers receive them.
        """
        with self._lock:
            self._check()
            if self.pulls:
                raise QueryError(f"query {self.name}: changes_frame is not supported for pull queries yet (its rows "
                                 "would hold the pulled entities' ids, and miss changes below them that subscribers "
                                 "receive); subscribe, or query the attributes without pull")
            oldest = oldest_available(self)
            start = max(self.installed_at - 1, oldest) if since is None else since
            if not isinstance(start, int) or isinstance(start, bool):
                raise QueryError(f"since must be an epoch number, not {since!r}")
            if start < oldest:
                raise HistoryCompactedError(
                    f"query {self.name}: the changes after epoch {start} are compacted away; the oldest epoch "
                    f"they can be read after is {oldest}", start, oldest)
            frame = self._engine.spark.sql(changes_sql(self, start, self._engine.epoch, self._output_columns()))
            if self.dataflow.result.handle.stored:
                self._engine.spark.sparkContext.setJobDescription(f"changes of {self.name}")
                frame = checkpoint_eagerly(frame, self.dataflow.result.handle.tuples)
        return frame

    def write_to(self, path: str, format: str = "parquet", mode: str = "diffs") -> SinkWriter:
        """Write the result's changes to the directory ``path`` from now on, atomically per
        epoch (see :mod:`factflow.io.sinks`): ``format`` parquet, json or csv; ``mode``
        ``diffs`` (each epoch's changes, starting with the whole current result) or
        ``snapshot`` (each epoch's whole result). Returns the sink's writer."""
        self._check()
        return self._engine._attach_sink(self, Sink(path, format, mode))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every sink has written every epoch delivered so far (or failed to);
        returns whether all of them are written."""
        return all([sink.flush(timeout) for sink in self.sinks])

    def _sink_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """An :meth:`_output` frame with the column names sinks write."""
        return frame.rename(columns=self._sink_columns())

    def _sink_columns(self) -> dict[str, str]:
        """The name sinks write for each column of an :meth:`_output` frame."""
        return {**{col: name for col, name, _ in self._output_columns()}, DIFF: CHANGE}

    def _changes(self, frame: pd.DataFrame, diff: str) -> list[tuple[tuple, int]]:
        """One epoch's output rows of the result operator as consolidated ``(row, diff)`` pairs, as subscribers get them."""
        changes = changes_from_frame(frame, self._report(), diff)
        if changes and self.dataflow.decoders:
            changes = list(zip(self._decode([row for row, _ in changes]), [d for _, d in changes]))
        return changes

    @property
    def pulls(self) -> bool:
        """Whether the result holds pulled entities (kept on the driver, see :mod:`factflow.engine.pull`)."""
        self._check()
        return self._pull is not None

    def _pull_changes(self, outputs: Mapping[Stateful, pd.DataFrame]) -> list[tuple[tuple, int]]:
        """A query with pulls: bring its rows on the driver up to date with the outputs the
        evaluation fetched (see :meth:`Dataflow.outputs`) and return the epoch's changes."""
        out = outputs.get(self.dataflow.result)
        changes = self._changes(out, OUT if OUT in out.columns else DIFF) if out is not None else []
        return self._pull.apply(changes, outputs)

    def explain(self) -> str:
        """A readable description of the plan: strategy, operators, the state they hold (read under the engine lock)."""
        with self._lock:
            self._check()
            return self.dataflow.explain()

    def close(self) -> None:
        """Uninterest: deliver a held granularity window, write what sinks have queued and
        stop them, tear the dataflow down and release its trace handles. A durable query is
        dropped for good (it is not installed again after a restart)."""
        if not self.closed:
            self._engine._release_outputs(self)
            self._engine._uninstall(self, drop=True)

    def _check(self) -> None:
        if self.closed:
            raise EngineClosedError(f"query {self.name} is closed")

    def __repr__(self) -> str:
        return f"<factflow.Query {self.name} {'closed' if self.closed else 'installed at epoch ' + str(self.installed_at)}>"


def _frame_column(element) -> str:
    """A DataFrame column name for a find element: ``?x`` -> ``x``, ``(count ?x)`` -> ``count_x``,
    ``(pull ?e [...])`` -> ``pull_e`` (the entity ids)."""
    text = f"pull {element.var}" if isinstance(element, Pull) else str(element)
    text = text.strip("()").replace("?", "")
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def _sorted(rows: list[tuple]) -> list[tuple]:
    try:
        return sorted(rows)
    except TypeError:  # values that do not compare (e.g. None, frozensets): keep Spark's order
        return rows
