"""Assembling the nested maps of a pull query's result on the driver, and their changes.

A query with pull expressions is maintained on Spark as flat relations (its result rows,
holding entity ids where ``:find`` pulls, and one relation per pull stage, see
:mod:`factflow.planner.pull`). A :class:`PullView` keeps their current rows on the driver,
where the result is read and delivered anyway: every row it holds belongs to the result
(stage rows exist only for the entities the result pulls). Each epoch it takes the changes
of the result and of the stages (fetched with the epoch's other outputs), and for every
result row whose own row or whose pulled entities changed, it emits the retraction of the
row as it was and the addition of the row as it is (:meth:`PullView.apply`); only those
entities' maps are assembled again. Installing the query loads the rows with one Spark job.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Mapping

import pandas as pd
from pyspark.sql import SparkSession

from factflow import edn
from factflow.dataflow import zset
from factflow.dataflow.context import EpochContext
from factflow.dataflow.nodes import OUT, Stateful
from factflow.engine.collect import Collector
from factflow.engine.rows import changes_from_frame
from factflow.errors import QueryError
from factflow.lang.ast import Pull
from factflow.lang.pull import DB_ID
from factflow.model.pulled import PullMap
from factflow.model.types import Kind
from factflow.planner.pull import PullField, PullPlan
from factflow.engine.dataflow import Dataflow

__all__ = ["PullView", "pull_query", "pulled"]

Changes = list[tuple[tuple, int]]


class _Stages:
    """The rows of one pull expression's stages: path -> root -> entity prefix -> values."""

    def __init__(self, plan: PullPlan):
        self.plan = plan
        self.rows: dict[tuple[str, ...], dict[int, dict[tuple, set]]] = {key: {} for key in plan.paths}
        self.maps: dict[int, PullMap] = {}  # assembled maps of the roots, until they change

    def apply(self, key: tuple[str, ...], changes: Changes) -> set[int]:
        """Apply one stage's set changes ``((root, x1, .., xn), +-1)``; returns the roots touched."""
        by_root = self.rows[key]
        for (root, *rest), diff in changes:
            prefixes = by_root.setdefault(root, {})
            values = prefixes.setdefault(tuple(rest[:-1]), set())
            if diff > 0:
                values.add(rest[-1])
            else:
                values.discard(rest[-1])
                if not values:
                    del prefixes[tuple(rest[:-1])]
                    if not prefixes:
                        del by_root[root]
        touched = {row[0] for row, _ in changes}
        for root in touched:
            self.maps.pop(root, None)
        return touched

    def map_of(self, root: int) -> PullMap:
        """The pulled map of ``root`` as the rows stand."""
        if root not in self.maps:
            self.maps[root] = self._assemble(self.plan.fields, root, (), (), root)
        return self.maps[root]

    def _assemble(self, fields: tuple[PullField, ...], root: int, path: tuple[str, ...], prefix: tuple,
                  entity: int) -> PullMap:
        out: dict[str, Any] = {}
        for f in fields:
            if f.attribute is None:
                out[DB_ID] = entity
                continue
            key = path + (f.key,)
            values = self.rows[key].get(root, {}).get(prefix)
            if not values:
                continue
            ordered = _sorted(values)
            if f.nested is not None:
                items = [self._assemble(f.nested, root, key, prefix + (v,), v) or PullMap({DB_ID: v})
                         for v in ordered]
            elif f.attribute.value_type == "ref":
                items = [PullMap({DB_ID: v}) for v in ordered]
            else:
                items = ordered
            out[f.key] = items[0] if f.attribute.semantics == "one" else tuple(items)
        return PullMap(out)


class PullView:
    """The driver-side rows of a query with pull expressions, and its results as rows of :class:`PullMap`."""

    def __init__(self, dataflow: Dataflow):
        self.dataflow = dataflow
        self.report = [(col, dict(dataflow.result.columns)[col]) for _, col in dataflow.find]
        by_element = {id(p.element): p for p in dataflow.pulls}
        #: (position in the row, stages) for every pulled element of :find
        self.pulled = [(i, _Stages(by_element[id(e)])) for i, (e, _) in enumerate(dataflow.find)
                       if isinstance(e, Pull)]
        self.rows: Counter = Counter()  # result rows with entity ids, and their multiplicities
        self.holding: list[dict[int, set]] = [defaultdict(set) for _ in self.pulled]  # entity -> rows

    def load(self, spark: SparkSession, epoch: int, current_sql: str) -> None:
        """Read the result (``current_sql``: its consolidated rows) and every stage as of ``epoch``, in one job."""
        collector = Collector()
        collector.add(f"({current_sql})", self.report + [(zset.DIFF, Kind.LONG)])
        stages = [(stages, key, path.node) for _, stages in self.pulled for key, path in stages.plan.paths.items()]
        for _, _, node in stages:
            present = zset.present(node.handle.read(epoch), node.names)
            collector.add(f"({present})", list(node.columns) + [(zset.DIFF, Kind.LONG)])
        spark.sparkContext.setJobDescription(f"pull rows of {self.dataflow.name}")
        frames = collector.run(spark, EpochContext(epoch, spark), 2**31 - 2, f"pull rows of {self.dataflow.name}")
        self._absorb_result(changes_from_frame(frames[0], self.report, zset.DIFF))
        for (stages, key, node), frame in zip(stages, frames[1:]):
            stages.apply(key, changes_from_frame(frame, node.columns, zset.DIFF))

    def apply(self, result_changes: Changes, outputs: Mapping[Stateful, pd.DataFrame]) -> Changes:
        """Take one epoch's changes (of the result rows, and of the stages in ``outputs``);
        returns the changes of the rendered rows: for each affected row its old form
        retracted and its new form added."""
        stage_changes = []
        touched_rows = {row for row, _ in result_changes}
        for n, (position, stages) in enumerate(self.pulled):
            for key, path in stages.plan.paths.items():
                frame = outputs.get(path.node)
                if frame is None:
                    continue
                changes = changes_from_frame(frame, path.node.columns, OUT if OUT in frame.columns else zset.DIFF)
                if changes:
                    stage_changes.append((stages, key, changes))
                    for (root, *_), _ in changes:
                        touched_rows |= self.holding[n].get(root, set())
        if not touched_rows:
            return []
        out: Counter = Counter()
        for row in touched_rows:
            if self.rows[row] > 0:
                out[self.render(row)] -= self.rows[row]
        for stages, key, changes in stage_changes:
            stages.apply(key, changes)
        self._absorb_result(result_changes)
        for row in touched_rows:
            if self.rows[row] > 0:
                out[self.render(row)] += self.rows[row]
        return [(row, diff) for row, diff in out.items() if diff]

    def _absorb_result(self, changes: Changes) -> None:
        for row, diff in changes:
            count = self.rows[row] + diff
            if count > 0:
                self.rows[row] = count
                for n, (position, _) in enumerate(self.pulled):
                    self.holding[n][row[position]].add(row)
                continue
            del self.rows[row]
            for n, (position, stages) in enumerate(self.pulled):
                holding = self.holding[n][row[position]]
                holding.discard(row)
                if not holding:
                    del self.holding[n][row[position]]
                    stages.maps.pop(row[position], None)

    def render(self, row: tuple) -> tuple:
        """A result row with every pulled entity id replaced by its map."""
        out = list(row)
        for position, stages in self.pulled:
            out[position] = stages.map_of(row[position])
        return tuple(out)

    def results(self) -> dict[tuple, int]:
        """The rendered rows and their multiplicities."""
        return {self.render(row): n for row, n in self.rows.items()}


def _sorted(values: set) -> list:
    try:
        return sorted(values)
    except TypeError:  # values that do not compare: any fixed order
        return list(values)


def pull_query(pattern: Any, entity: Any) -> str:
    """The query ``Engine.pull(pattern, entity)`` installs: the pull of ``entity`` given as input."""
    if isinstance(entity, bool) or not isinstance(entity, int):
        raise QueryError(f"pull: the entity must be an integer entity id, not {entity!r}")
    text = pattern if isinstance(pattern, str) else edn.write(pattern)
    return f"[:find (pull ?e {text}) . :in $ ?e]"


def pulled(value: PullMap | None) -> dict[str, Any] | None:
    """What ``Engine.pull`` returns for a pulled map: plain dicts, or None (Datomic's nil) when
    the entity has none of the pattern's attributes (``:db/id`` alone does not count)."""
    if value is None or not any(key != DB_ID for key in value):
        return None
    return value.to_dict()
