"""Collection traces: multiversioned, indexed state made of immutable batches.

A trace is a list of batches ordered by time, complete for every epoch below ``upper``.
Reading *as of* an epoch ``t`` accumulates every update with time ``<= t``. Readers hold
:class:`TraceHandle` objects whose frontier promises that they will never read as of an
earlier epoch; the trace's compaction frontier is the least frontier of its live handles.

Maintenance merges adjacent batches geometrically (a batch is merged into its older
neighbour while that neighbour is at most ``factor`` times larger), the way an LSM tree or
a merge sort would, so a trace holds logarithmically many batches. The batches a chain of
such merges would reach are merged in one pass (:meth:`Trace.merge_due`): each row is read
and written once, not once per step of the chain. No merge reads more than a cap
(:meth:`Trace.merge_cap`), so no round rewrites a large trace whole; a trace then also
holds a bounded number of batches of about the cap's size. Maintenance comes in two parts:
:meth:`Trace.merge_local` merges trailing driver-side batches at once (no Spark), and
:meth:`Trace.stored_merge` hands what needs Spark (merges that make or read stored batches,
index files) to a :class:`StoredMerge`, which computes them from a pinned snapshot of the
batches without the engine lock and swaps them in afterwards, under it. Merging *compacts*:
times older than the compaction frontier are advanced to it, updates that become
indistinguishable are summed, and rows whose diff sums to zero are dropped. Small merged
batches stay on the driver (see :mod:`.batch`); larger ones are consolidated by Spark,
partitioned by the trace's key, checkpointed and counted, and written as sorted index
files (:mod:`.index`) so that small epochs probe them by key instead of scanning them.
Readers see a trace only through their handles (:class:`TraceHandle`: reads as of an
epoch, probe sources); appending, merging and compacting are the trace's own methods,
which only the engine's evaluation and maintenance call.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from factflow.arrangement.batch import DIFF, TIME, Batch, Layout, checkpoint, checkpoint_indexed, release_checkpoint
from factflow.arrangement.index import read_index_locally, remove_index, write_index
from factflow.errors import FactflowError
from factflow.model.frames import consolidated
from factflow.model.types import sql_type
from factflow.storage.location import Location

__all__ = ["OPERATOR_PROBE_ROWS", "MergePolicy", "StoredMerge", "Trace", "TraceHandle"]

log = logging.getLogger(__name__)
_TRACE_IDS = itertools.count(1)


@dataclass(frozen=True)
class MergePolicy:
    """How traces merge their batches.

    ``factor``: a newer batch is merged into its older neighbour while the neighbour holds
    at most ``factor`` times as many rows. ``local_limit``: merged batches of at most this
    many rows stay on the driver. ``partitions``: partitions of cached batches.
    ``directory``: where stored batches write their index files (None: not indexed), and
    ``cache_bytes`` how much of them an executor keeps copies of when they are remote (see
    :mod:`factflow.storage.cache`). ``in_files``: stored batches are kept in their index
    files only, not as checkpoints on executors (a cluster, where an executor and what it
    stores may be lost; see :meth:`Batch.from_files`).
    ``merge_limit`` and ``merge_share``: a merge stops growing before its parts would hold
    more than ``max(merge_limit, rows of the trace // merge_share)`` rows (see
    :meth:`Trace.merge_cap`).
    """

    factor: int = 2
    local_limit: int = 20_000
    partitions: int = 2
    directory: Location | None = None
    cache_bytes: int = 4 << 30
    in_files: bool = False
    merge_limit: int = 1_000_000
    merge_share: int = 8


class TraceHandle:
    """A reader's hold on a trace: it may read as of any epoch at or after its frontier.

    Handles are how operators see state: they read, probe and inspect, never append or
    merge (the trace itself, the writer, belongs to the engine's evaluation and
    maintenance)."""

    def __init__(self, trace: "Trace", frontier: int, owner: str):
        self._trace = trace
        self.frontier = frontier
        self.owner = owner
        self.live = True

    @property
    def name(self) -> str:
        """The trace's name."""
        return self._trace.name

    def read(self, as_of: int) -> str:
        """SQL relation of the trace's updates accumulated as of ``as_of`` (not consolidated)."""
        self._check(as_of)
        return self._trace.read(as_of)

    def probe_sources(self, as_of: int) -> tuple[list[tuple[Location, str]], list[pa.Table]] | None:
        """What a probe as of ``as_of`` reads: the index files of stored batches (their
        directories and names) and the
        Arrow rows of local ones; None when the trace cannot be probed, or holds no stored
        batch and fewer rows than its ``probe_local_rows`` (a SQL join over its local
        batches is then cheaper)."""
        self._check(as_of)
        return self._trace.probe_sources(as_of)

    def local_rows(self, as_of: int, column: str, values: list) -> pd.DataFrame | None:
        """The updates as of ``as_of`` whose ``column`` is one of ``values``, selected on the
        driver, when every batch to read is local (None otherwise): a few rows to bind into
        a statement instead of every local row (see :meth:`Trace.local_rows`)."""
        self._check(as_of)
        return self._trace.local_rows(as_of, column, values)

    def changes(self, epoch: int) -> list[str]:
        """SQL relations of the batches holding exactly the updates of ``epoch``."""
        self._check()
        return [b.source for b in self._trace.batches_between(epoch, epoch + 1)]

    def change_rows(self, epoch: int) -> int:
        """Update rows of the batches holding exactly the updates of ``epoch``."""
        self._check()
        return sum(b.rows for b in self._trace.batches_between(epoch, epoch + 1))

    def empty(self) -> str:
        """SQL relation with the trace's columns and no rows."""
        return self._trace.empty()

    @property
    def cache_bytes(self) -> int:
        """How many bytes of remote index files an executor keeps copies of (see :class:`MergePolicy`)."""
        return self._trace.policy.cache_bytes

    @property
    def key(self) -> tuple[str, ...]:
        """The columns the trace is keyed (and probed) by."""
        return self._trace.layout.index_key

    @property
    def layout(self) -> Layout:
        """The trace's column layout."""
        return self._trace.layout

    @property
    def tuples(self) -> int:
        """Update rows the trace holds (exact)."""
        return self._trace.tuples

    @property
    def stored(self) -> bool:
        """Whether some of the trace's batches are held in Spark rather than on the driver."""
        return any(not b.is_local for b in self._trace.batches)

    def hash_partitions(self, as_of: int) -> int | None:
        """When the trace as of ``as_of`` is one batch kept in Spark and hash-partitioned by
        the trace's key (a load or a merge stores it so): its number of partitions, else None."""
        self._check(as_of)
        batches = [b for b in self._trace.batches if b.lower <= as_of]
        if len(batches) != 1 or batches[0].upper - 1 > as_of:
            return None
        return batches[0].hash_partitions(self._trace.layout.index_key)

    def advance(self, frontier: int) -> None:
        """Promise never to read before ``frontier`` again, allowing compaction."""
        self._check()
        if frontier > self.frontier:
            self.frontier = frontier

    def release(self) -> None:
        """Give up this handle; the trace may then compact past its frontier."""
        if self.live:
            self.live = False
            self._trace._handles.discard(self)

    def _check(self, as_of: int | None = None) -> None:
        if not self.live:
            raise FactflowError(f"the handle of {self.owner} on {self._trace.name} was released")
        if as_of is not None and as_of < self.frontier:
            raise FactflowError(f"{self.owner} cannot read {self._trace.name} as of {as_of}: "
                                f"its frontier is {self.frontier}")


#: the rows from which an operator's own trace held on the driver whole is probed by key
#: in small epochs (see :meth:`Trace.probe_sources`). A statement reads an operator's state
#: in several versions and Spark copies each read wherever it is inlined: one order's epoch
#: of TPC-H's Q13 read its rule body's 14,821 rows whole 30 times (3.6-4.1 s; probed, 1.4 s).
#: Attributes' traces are not probed while on the driver: probing TPC-H's orders attributes
#: (15,000 rows each) made Q3's, Q9's and Q18's epochs 1.5-2.1x slower, each lookup a Python probe
#: where the JVM joined the bound rows in milliseconds; and probing every trace from 1,024
#: rows made the LDBC workload's 100-change epochs 1.9x slower (docs/benchmarks.md).
OPERATOR_PROBE_ROWS = 4_096


class Trace:
    """A multiversioned collection of updates ``(columns..., _t, _diff)``. ``probe_local_rows``:
    from how many rows the trace is probed by key while held on the driver whole (None:
    only once it holds a stored batch; see :meth:`probe_sources`)."""

    def __init__(self, spark: SparkSession, name: str, layout: Layout, policy: MergePolicy, upper: int,
                 probe_local_rows: int | None = None):
        self.spark = spark
        self.name = name
        self.layout = layout
        self.policy = policy
        self.probe_local_rows = probe_local_rows
        self.upper = upper
        self.since = upper - 1  # a new trace holds nothing, so every time from now on is readable
        self.batches: list[Batch] = []
        self._handles: set[TraceHandle] = set()
        self.merges = 0
        self.closed = False
        """Whether :meth:`close` ran: the trace holds nothing and nobody reads it any more."""
        self._id = next(_TRACE_IDS)
        self._indexes = itertools.count(1)

    # ------------------------------------------------------------ readers
    def handle(self, frontier: int, owner: str) -> TraceHandle:
        """A new reader handle at ``frontier`` (which must not precede the compacted past)."""
        if frontier < self.since:
            raise FactflowError(f"{owner} cannot hold {self.name} at {frontier}: it is compacted to {self.since}")
        h = TraceHandle(self, frontier, owner)
        self._handles.add(h)
        return h

    @property
    def handles(self) -> list[TraceHandle]:
        """Live handles on this trace."""
        return list(self._handles)

    def frontier(self) -> int:
        """The compaction frontier: the least frontier of live handles (the latest epoch if none)."""
        if self._handles:
            return min(h.frontier for h in self._handles)
        return self.upper - 1

    def empty(self) -> str:
        """SQL relation with this trace's columns and no rows."""
        cols = [f"CAST(NULL AS {sql_type(k)}) AS `{n}`" for n, k in self.layout.columns]
        return f"(SELECT {', '.join(cols + ['CAST(0 AS BIGINT) AS `_t`', 'CAST(0 AS BIGINT) AS `_diff`'])} WHERE FALSE)"

    def read(self, as_of: int) -> str:
        """SQL relation of updates with time ``<= as_of`` from every batch (diffs not consolidated)."""
        if as_of < self.since:
            raise FactflowError(f"{self.name} is compacted to {self.since}; it cannot be read as of {as_of}")
        whole = [b for b in self.batches if b.upper - 1 <= as_of]
        partial = [b for b in self.batches if b.lower <= as_of < b.upper - 1]
        if len(whole) == 1 and not partial:
            return whole[0].source
        parts = [f"SELECT * FROM {b.source}" for b in whole]
        parts += [f"SELECT * FROM {b.source} WHERE `_t` <= {as_of}L" for b in partial]
        if not parts:
            return self.empty()
        return "(" + " UNION ALL ".join(parts) + ")"

    def probe_sources(self, as_of: int) -> tuple[list[tuple[Location, str]], list[pa.Table]] | None:
        """See :meth:`TraceHandle.probe_sources`; writes the index of any stored batch
        that has none yet (a Spark job each, normally done by :meth:`maintain`)."""
        readable = [b for b in self.batches if b.lower <= as_of]
        if self.policy.directory is None:
            return None
        if all(b.is_local for b in readable) and (self.probe_local_rows is None
                                                  or sum(b.rows for b in readable) < self.probe_local_rows):
            return None
        self.index_stored()
        files = [(b.index, name) for b in readable if not b.is_local for name in b.index_paths]
        local = [b.arrow(self.layout) for b in readable if b.is_local]
        return files, local

    def local_rows(self, as_of: int, column: str, values: list) -> pd.DataFrame | None:
        """See :meth:`TraceHandle.local_rows`. A small transaction touching a few entities
        of TPC-H's orders (15,000 rows per attribute, all local) bound every row of nine
        attributes into its statement, and its job spent most of its time carrying them."""
        readable = [b for b in self.batches if b.lower <= as_of]
        if not all(b.is_local for b in readable):
            return None
        parts = [b.local[b.local[column].isin(values) & (b.local[TIME] <= as_of)] for b in readable]
        frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=self.layout.all_names)
        return self.layout.normalize_pandas(frame)

    def index_stored(self, batches: list[Batch] | None = None) -> None:
        """Write the index files of stored batches (default: this trace's) that have none (a
        Spark job each; a batch being indexed by another thread is waited for). Once the trace
        is closed (from another thread) it writes no more."""
        for b in self.batches if batches is None else batches:
            if self.closed:
                return
            if not b.is_local and b.index is None:
                self.spark.sparkContext.setJobDescription(f"index {self.name} [{b.lower}, {b.upper})")
                b.write_index(self.layout.index_key, self._index_directory())

    def _index_directory(self) -> Location:
        """A new directory for the index files of one of this trace's batches."""
        return self.policy.directory.child(f"trace-{self._id}", f"batch-{next(self._indexes)}")

    def batches_between(self, lower: int, upper: int) -> list[Batch]:
        """Batches that hold only times in ``[lower, upper)``."""
        return [b for b in self.batches if b.lower >= lower and b.upper <= upper]

    @property
    def tuples(self) -> int:
        """Update rows held by this trace (exact)."""
        return sum(b.rows for b in self.batches)

    # ------------------------------------------------------------ writers
    def append(self, batch: Batch) -> None:
        """Add the batch of the next epochs; empty batches only advance ``upper``."""
        if batch.lower < self.upper:
            raise FactflowError(f"{self.name}: batch [{batch.lower}, {batch.upper}) overlaps the trace (upper {self.upper})")
        self.upper = batch.upper
        if batch.rows == 0:
            batch.release()
            return
        self.batches.append(batch)

    def load(self, batch: Batch) -> None:
        """Start an empty trace from ``batch``, the consolidated state as of ``batch.upper - 1``
        (recovery): nothing before that epoch is readable."""
        if self.batches:
            raise FactflowError(f"{self.name}: only an empty trace can be loaded")
        self.upper = max(self.upper, batch.upper)
        self.since = max(self.since, batch.upper - 1)
        if batch.rows:
            self.batches.append(batch)
        else:
            batch.release()

    def append_pandas(self, frame: pd.DataFrame, epoch: int) -> Batch:
        """Append consolidated rows of one epoch held on the driver."""
        frame = frame.assign(**{TIME: epoch}) if TIME not in frame.columns else frame
        batch = Batch.from_pandas(self.spark, self.layout, frame, epoch, epoch + 1)
        self.append(batch)
        return batch

    def append_frame(self, frame: DataFrame, epoch: int) -> Batch:
        """Append one epoch's consolidated updates held in Spark: organized, checkpointed, counted.

        A batch small enough to live on the driver is fetched there instead.
        """
        timed = frame.selectExpr(*[f"`{n}`" for n in self.layout.names], f"CAST({epoch} AS BIGINT) AS `{TIME}`", f"`{DIFF}`")
        batch = self.materialize(timed, epoch, epoch + 1)
        self.append(batch)
        return batch

    def append_stored(self, frame: DataFrame, rows: int, epoch: int, stored: DataFrame) -> Batch:
        """Append one epoch's updates ``(columns..., _diff)`` read from ``stored``, a frame
        checkpointed and counted by the caller. A small batch is copied to the driver, and a
        stored one kept in files (``in_files``) is written from ``stored``: the returned batch
        does not own ``stored`` then, which stays the caller's to release (see
        :attr:`Batch.owns_stored`)."""
        if rows <= self.policy.local_limit:
            return self.append_pandas(frame.select(*self.layout.names, DIFF).toArrow().to_pandas(), epoch)
        frame = frame.selectExpr(*[f"`{n}`" for n in self.layout.names], f"CAST({epoch} AS BIGINT) AS `_t`", "`_diff`")
        if self.policy.in_files:
            batch = self._filed(frame, epoch, epoch + 1)
        else:
            batch = Batch.from_checkpoint(frame, rows, epoch, epoch + 1, stored)
        self.append(batch)
        return batch

    def advance_upper(self, upper: int) -> None:
        """Record that no updates exist for epochs below ``upper`` beyond those appended."""
        if upper > self.upper:
            self.upper = upper

    def truncate(self, epoch: int) -> None:
        """Drop the batches of ``epoch`` and later (undo of a failed epoch; never merged yet)."""
        for b in self.batches:
            if b.lower >= epoch:
                b.release()
        self.batches = [b for b in self.batches if b.lower < epoch]
        self.upper = min(self.upper, epoch)

    def maintain(self) -> int:
        """Merge batches now (local ones, then any :meth:`stored_merge`); returns the number of
        merges done."""
        done = self.merge_local()
        stored = self.stored_merge()
        if stored is not None:
            stored.run()
            done += stored.commit()
        return done

    def merge_local(self) -> int:
        """Merge the trailing local batches whose rows together fit on the driver into one
        (cheap, and every extra batch would cost Spark a scan task on each read); returns the
        batches merged away."""
        if not self.batches or not self.batches[-1].is_local:
            return 0
        count = self._trailing(self.batches, self._fits_locally)
        if count:
            self._merge_last(count)
            self.merges += count - 1
        return max(count - 1, 0)

    def stored_merge(self) -> "StoredMerge | None":
        """The merges left that need Spark (the geometric ones: a batch joins its older
        neighbour while that neighbour is at most ``factor`` times larger) and the index
        files stored batches lack, as a :class:`StoredMerge` of the current batches; None
        when there are none."""
        due = self.merge_due(self.batches) > 0
        unindexed = self.policy.directory is not None and any(
            not b.is_local and b.index is None for b in self.batches)
        return StoredMerge(self) if due or unindexed else None

    def merge_due(self, batches: list[Batch]) -> int:
        """How many trailing ``batches`` are due to merge into one, in one pass: the newest
        joins its older neighbour while that neighbour holds at most ``factor`` times as many
        rows and the merge stays within :meth:`merge_cap`, or both fit on the driver, and the
        merged batch goes on the same way (0: none)."""
        cap = self.merge_cap(batches)
        return self._trailing(batches, lambda older, rows: self._fits_locally(older, rows)
                              or (older.rows <= self.policy.factor * rows and older.rows + rows <= cap))

    def merge_cap(self, batches: list[Batch]) -> int:
        """The most rows one merge of ``batches`` may read: ``max(merge_limit, their rows //
        merge_share)``.

        Unbounded geometric merging sooner or later rewrites the whole trace in one round
        (binary triangles over oregon1: 2.1 million rows, 6 s that the next epoch waited
        for). With the cap no round rewrites more than a share of the trace, at the price
        of more batches to read: about ``2 * merge_share`` of the cap's size, plus the
        logarithmically many smaller ones. As the trace grows the cap grows with it, so
        those batches merge again and their number stays bounded."""
        return max(self.policy.merge_limit, sum(b.rows for b in batches) // self.policy.merge_share)

    def _fits_locally(self, older: Batch, rows: int) -> bool:
        """Whether ``older`` merged with ``rows`` newer rows (local if they fit) stays on the driver."""
        return older.is_local and older.rows + rows <= self.policy.local_limit

    @staticmethod
    def _trailing(batches: list[Batch], joins: Callable[[Batch, int], bool]) -> int:
        """How many trailing ``batches`` merge into one: the newest, then each older batch
        while ``joins(older, rows of the newer ones)`` (0 when fewer than two)."""
        if not batches:
            return 0
        count, rows = 1, batches[-1].rows
        for older in reversed(batches[:-1]):
            if not joins(older, rows):
                break
            count, rows = count + 1, rows + older.rows
        return count if count >= 2 else 0

    def compact(self) -> None:
        """Merge every batch into one, compacting to the current frontier."""
        if len(self.batches) >= 2 or (self.batches and self.frontier() > self.since):
            self._merge_last(len(self.batches))

    def close(self) -> None:
        """Release every batch and handle."""
        self.closed = True
        for b in self.batches:
            b.release()
        self.batches = []
        for h in list(self._handles):
            h.release()

    # ------------------------------------------------------------ internals
    def _merge_last(self, count: int) -> None:
        """Replace the ``count`` newest batches by their merge, at once (the caller holds the lock)."""
        parts = self.batches[-count:]
        merged, since = self._consolidate(parts, parts[0].lower, parts[-1].upper)
        for b in parts:
            b.release()
        self.since = max(self.since, since)
        self.batches[-count:] = [merged] if merged.rows else []

    def _consolidate(self, parts: list[Batch], lower: int, upper: int, index: bool = False) -> tuple[Batch, int]:
        """One batch of ``parts``' updates with times compacted to the frontier (the parts
        stay as they are); returns it and the frontier it compacted to (the caller's to
        record in ``since``). ``index``: a stored result is written with its index files
        (see :meth:`materialize`)."""
        frontier = min(self.frontier(), upper - 1)
        names = self.layout.names
        if sum(p.rows for p in parts) <= self.policy.local_limit and all(p.is_local for p in parts):
            merged = Batch.from_pandas(self.spark, self.layout, self._merged_locally(parts, frontier), lower, upper)
            times = merged.local[TIME].to_numpy()
            merged.single_time = int(times[0]) if len(times) and (times == times[0]).all() else None
            return merged, frontier
        union = self.spark.sql(" UNION ALL ".join(f"SELECT * FROM {p.source}" for p in parts if p.rows))
        summed = (self.by_key(union).selectExpr(*[f"`{n}`" for n in names], f"greatest(`_t`, {frontier}L) AS `_t`",
                                                "`_diff`")
                  .groupBy(*names, TIME).agg(F.sum(DIFF).alias(DIFF)).where(F.col(DIFF) != 0))
        self.spark.sparkContext.setJobDescription(f"merge {self.name} [{lower}, {upper})")
        return self.materialize(summed.select(*self.layout.all_names), lower, upper, by_key=True,
                                index=index, expected_rows=sum(p.rows for p in parts)), frontier

    def _merged_locally(self, parts: list[Batch], frontier: int) -> pd.DataFrame:
        """The rows of the local ``parts``, times compacted to ``frontier``, consolidated.

        A trace on the driver merges each epoch's small batch into its large one, and
        grouping all of the large one's rows again cost 4-8 ms per trace (TPC-H's orders
        attributes, 15,000 rows: 51-97 ms of a one-order epoch's maintenance). When the oldest
        part is consolidated at one time (:attr:`Batch.single_time`), its rows are distinct
        and stay so at the new time; only those whose first key column has a value some
        newer row has can meet a newer row, so only they are grouped with the newer rows."""
        names = self.layout.names + [TIME]
        first = parts[0]
        whole = first.single_time is None or len(parts) < 2 or not self.layout.names
        compacted = pd.concat([p.local for p in (parts if whole else parts[1:])], ignore_index=True)
        compacted[TIME] = np.maximum(compacted[TIME].to_numpy(), frontier)
        if whole:
            return consolidated(compacted, names, DIFF)
        column = self.layout.index_key[0]
        met = first.local[column].isin(compacted[column]).to_numpy()
        time = max(first.single_time, frontier)
        again = consolidated(pd.concat([first.local[met].assign(**{TIME: time}), compacted], ignore_index=True),
                             names, DIFF)
        kept = ~met  # the rows no newer row can meet, column by column (one copy of each)
        return pd.DataFrame({
            name: np.concatenate([np.full(int(kept.sum()), time, dtype="int64") if name == TIME
                                  else first.local[name].to_numpy()[kept], again[name].to_numpy()])
            for name in self.layout.all_names})

    def materialize(self, frame: DataFrame, lower: int, upper: int, by_key: bool = False,
                    index: bool = False, expected_rows: int = 0) -> Batch:
        """A batch of ``frame`` (the full layout, with ``_t``): checkpointed, partitioned by
        the key and counted, or moved to the driver when it is small. ``by_key``: ``frame``
        is partitioned by the key already (it consolidates the output of :meth:`by_key`),
        so it is only sorted, not shuffled again. ``index`` (a trace with an index
        directory): the same Spark job writes the batch's index files, which a small result
        then deletes. ``expected_rows``: about how many rows it will hold, where known (how
        its blocks are kept, see :func:`~factflow.arrangement.batch.storage_level`)."""
        organized = self.organize(frame, shuffle=not by_key)
        if self.policy.in_files:
            return self._filed(organized, lower, upper)
        written = None
        if index and self.policy.directory is not None:
            directory = self._index_directory()
            stored, rows, paths = checkpoint_indexed(organized, self.layout.index_key, directory, expected_rows)
            written = (directory, paths)
        else:
            stored, rows = checkpoint(organized, expected_rows)
        if rows > self.policy.local_limit:
            return Batch.from_checkpoint(stored, rows, lower, upper, index=written)
        if written is not None:
            remove_index(written[0])
        local = stored.toArrow().to_pandas()
        release_checkpoint(stored)
        return Batch.from_pandas(self.spark, self.layout, local, lower, upper)

    def _filed(self, frame: DataFrame, lower: int, upper: int) -> Batch:
        """A batch of ``frame`` (the full layout) kept in index files only (``in_files``): one
        Spark job writes them; a small batch is then read back to the driver from them (no
        second job) and the files removed."""
        directory = self._index_directory()
        names, rows = write_index(frame, self.layout.index_key, directory)
        if rows > self.policy.local_limit:
            return Batch.from_files(self.spark, self.layout, directory, names, rows, lower, upper,
                                    self.policy.cache_bytes)
        local = read_index_locally(directory, names, self.layout.all_names, self.policy.cache_bytes)
        remove_index(directory)
        return Batch.from_pandas(self.spark, self.layout, local.to_pandas(), lower, upper)

    def by_key(self, frame: DataFrame) -> DataFrame:
        """``frame`` hash-partitioned by the key as stored batches are; grouping it by columns
        that include the key keeps that partitioning (one shuffle for a merge, not two)."""
        return frame.repartition(self.policy.partitions, *self.layout.index_key)

    def organize(self, frame: DataFrame, shuffle: bool = True) -> DataFrame:
        """``frame`` partitioned by the key and sorted within partitions, as stored batches
        are (``shuffle=False``: partitioned already, see :meth:`by_key`, or in one partition)."""
        key = list(self.layout.index_key)
        return (self.by_key(frame) if shuffle else frame).sortWithinPartitions(*key)

    def __repr__(self) -> str:
        return f"Trace({self.name}, upper={self.upper}, since={self.since}, batches={self.batches})"


class StoredMerge:
    """A trace's merges and index writes that need Spark, computed from a snapshot of its
    batches so that they can run in the background, outside the engine lock.

    The snapshot's batches are pinned (a trace closed meanwhile frees them only once this is
    done). :meth:`run` merges the snapshot's trailing batches that are due and writes missing index
    files; it changes nothing readers see. :meth:`commit`, under the engine lock, puts the
    result in place of the snapshot if the trace still starts with it (epochs since then
    only appended batches after it; rollbacks only drop those), else throws the result
    away; :meth:`abandon` throws it away in any case.
    """

    def __init__(self, trace: Trace):
        self.trace = trace
        self.snapshot = list(trace.batches)
        self.result: list[Batch] | None = None
        self.merges = 0
        self.since = trace.since
        for b in self.snapshot:
            b.pin()

    def run(self) -> None:
        """Compute the merge due and write index files (Spark jobs; no lock needed)."""
        trace, batches = self.trace, list(self.snapshot)
        count = trace.merge_due(batches)
        merged = None
        try:
            if count:
                parts = batches[-count:]
                merged, since = trace._consolidate(parts, parts[0].lower, parts[-1].upper, index=True)
                self.since = max(self.since, since)
                self.merges = count - 1
                del batches[-count:]
                if merged.rows:
                    batches.append(merged)
                else:
                    merged.release()
                    merged = None
            if trace.policy.directory is not None:
                trace.index_stored(batches)
        except BaseException:
            if merged is not None:
                merged.release()
            raise
        self.result = batches

    def commit(self) -> int:
        """Swap the result in (under the engine lock); returns the merges that took effect."""
        trace = self.trace
        try:
            if self.result is None:
                return 0
            n = len(self.snapshot)
            if len(trace.batches) < n or any(a is not b for a, b in zip(trace.batches, self.snapshot)):
                self._drop_result()
                return 0
            trace.batches = self.result + trace.batches[n:]
            kept = {id(b) for b in self.result}
            for b in self.snapshot:
                if id(b) not in kept:
                    b.release()
            trace.since = max(trace.since, self.since)
            trace.merges += self.merges
            return self.merges
        finally:
            self._unpin()

    def abandon(self) -> None:
        """Throw the result away (a failed run, or an engine closing)."""
        self._drop_result()
        self._unpin()

    def _drop_result(self) -> None:
        if self.result is not None:
            snapshot = {id(b) for b in self.snapshot}
            for b in self.result:
                if id(b) not in snapshot:
                    b.release()
            self.result = None

    def _unpin(self) -> None:
        for b in self.snapshot:
            b.unpin()
        self.snapshot = []
