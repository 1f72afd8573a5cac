"""Delta queries and the worst-case optimal join (Hector) as one dataflow operator.

A :class:`DeltaJoin` computes the join of several *bindings* (relations over variable
columns: attribute patterns read from the shared arrangements, rule relations, inputs,
unions) and *constraints* (predicates, function bindings, negated sets) without keeping
any state of its own. Its change in an epoch is the sum of one *pipeline* per binding
that changed: the pipeline starts from that binding's change and extends it, stage by
stage, by lookups into the other bindings. Bindings are totally ordered; a pipeline reads
the bindings ordered before its source as of the new epoch (NEW) and those after it as
of the epoch before (OLD), so that simultaneous changes to several bindings are derived
exactly once (the product rule ``d(A B) = dA B_new + A_old dB``, seeds 004 and thesis
13.4). A negated binding ``N`` takes part as the factor ``1 - N``: its pipeline starts
from ``-dN`` and elsewhere it validates by anti-join.

Stages are of four sorts:

* :class:`Lookup` joins the prefix with one binding on the columns they share (the
  delta-query stage; with every column of the binding bound it is a validation);
* :class:`Extend` binds one more variable the worst-case optimal way (thesis 13.1-13.2):
  every *extender* (a binding whose only unbound column is that variable) counts its
  proposals per prefix, from an attribute's count index where it has one; per prefix the
  extender with the fewest proposes and the others validate its proposals;
* :class:`Apply` runs a filter or a function binding once its inputs are bound;
* :class:`Exclude` drops prefixes whose key is in a negated set.

Every binding's multiplicity is applied exactly once (by the stage that binds its last
variable), so results equal the join-at-a-time plan's as Z-sets, multiset semantics
included. Install, and reading the whole collection, run one pipeline with every binding
read as of one version. In an epoch whose changes reach several bindings and are a large
share of what they hold, the change is computed from two such readings instead
(:data:`REBUILT_FROM`); when they are a small share and every binding that can change
has a column in common (a star on one variable), from two such readings confined to the
values of that column the changes touch (:meth:`DeltaJoin._keyed_difference`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence, Union as TypingUnion

from factflow.arrangement.batch import DIFF
from factflow.arrangement.trace import TraceHandle
from factflow.arrangement.views import one_partition
from factflow.dataflow import zset
from factflow.dataflow.context import EpochContext, Version
from factflow.dataflow.lookup import TRACE_DIFF, probe
from factflow.dataflow.nodes import Columns, Filter, Node, Scan, Stateful, Static
from factflow.dataflow.slots import HandleSlot
from factflow.dataflow.zset import ident
from factflow.model.types import Kind
from factflow.text import plural

__all__ = ["selective", "CountIndex", "Extender", "Lookup", "Extend", "Apply", "Exclude", "Pipeline", "DeltaJoin", "Shape"]

_COUNT = "_n"
_WINNER = "_w"

#: A join with changes to this many of its bindings or more, whose changed attribute
#: patterns changed by at least :data:`REBUILT_SHARE` of the updates they hold, computes its
#: change as the whole join as of NEW less the whole join as of OLD: two pipelines instead
#: of one per changed binding. Each pipeline joins every binding, and in a worst-case
#: optimal plan each stage counts, proposes and validates against every extender, so the
#: pipelines of a bulk TPC-H epoch that changes all of Q21's lineitem bindings made one
#: statement of 1,148 joins and 356 broadcasts: Spark took 20 s to plan it and ran the
#: driver out of memory building the broadcasts. Small epochs too: a third of TPC-H's
#: suppliers arriving as one (33 entities) change six of Q2's fifteen bindings, and its six
#: pipelines alone were optimized into 84,682 operators, more than a 2 GiB driver could
#: plan beside the epoch's other queries. A change that is a small share of the state keeps
#: its pipelines: they read only what the change touches, the difference reads the whole
#: join twice.
REBUILT_FROM = 3
REBUILT_SHARE = 0.125


class Shape(Node):
    """The columns of a pipeline prefix: lets filters and binders be built for a stage."""

    def __init__(self, columns: Columns):
        self.columns = tuple(columns)

    def _delta(self, cx):
        raise AssertionError("a prefix shape is never evaluated")

    _read = _delta


@dataclass
class CountIndex:
    """A shared count index (``key -> number of values``) of one attribute face."""

    slot: HandleSlot
    source: str   # the index's key column ('e' or 'v')
    column: str   # the variable column it counts for
    handle: TraceHandle | None = None  # bound at install

    def to_data(self) -> dict:
        """The count index as plain data."""
        return {"slot": self.slot.to_data(), "source": self.source, "column": self.column}

    def counts(self, cx: EpochContext, version: Version, prefix: str) -> str:
        """SQL of ``(column, _n)`` as of ``version``, for the keys of ``prefix`` only."""
        if version is Version.OLD and cx.install:
            relation = self.handle.empty()
        else:
            as_of = cx.old_epoch if version is Version.OLD else cx.epoch
            keys = f"(SELECT {ident(self.column)}, CAST(1 AS BIGINT) AS {ident(DIFF)} FROM {prefix})"
            probed = probe(cx, self.handle, keys, [(self.column, self.handle.layout.columns[0][1])],
                           [(self.column, self.source)], [], as_of, how="semi")
            if probed is not None:
                return (f"SELECT {ident(self.column)}, SUM({ident(TRACE_DIFF)}) AS {_COUNT} FROM {probed} "
                        f"GROUP BY {ident(self.column)}")
            relation = self.handle.read(as_of)
        keyed = f"SELECT {ident(self.source)} AS {ident(self.column)}, {ident(DIFF)} FROM {relation}"
        touched = zset.semijoin(f"({keyed})", prefix, [self.column])
        return f"SELECT {ident(self.column)}, SUM({ident(DIFF)}) AS {_COUNT} FROM ({touched}) GROUP BY {ident(self.column)}"


@dataclass
class Extender:
    """A binding that can propose values of the stage's variable, given ``key`` bound."""

    relation: Node
    position: int
    key: list[str]
    count_index: CountIndex | None = None
    label: str = ""

    def to_data(self, ref) -> dict:
        """The extender as plain data (``ref`` numbers its relation)."""
        return {"relation": ref(self.relation), "position": self.position, "key": list(self.key),
                "count_index": self.count_index.to_data() if self.count_index is not None else None,
                "label": self.label}

    def counts(self, cx: EpochContext, version: Version, prefix: str) -> str:
        """SQL of ``(key..., _n)``: the number of proposals per key of ``prefix``."""
        if self.count_index is not None:
            return self.count_index.counts(cx, version, prefix)
        relation = self.relation.read(cx, version)
        if self.key:
            relation = f"({zset.semijoin(relation, prefix, self.key)})"
        keys = ", ".join(ident(k) for k in self.key)
        total = f"SUM({ident(DIFF)}) AS {_COUNT}"
        return f"SELECT {keys}, {total} FROM {relation} GROUP BY {keys}" if keys else f"SELECT {total} FROM {relation}"


@dataclass
class Lookup:
    """Join the prefix with one binding on ``on`` (its columns already bound)."""

    relation: Node
    position: int
    on: list[str]
    label: str = ""


@dataclass
class Extend:
    """Bind ``column`` by count / propose / validate among ``extenders``."""

    column: str
    extenders: list[Extender]


@dataclass
class Apply:
    """A filter or function binding (a Filter or Bind built over the prefix's Shape)."""

    op: Node


@dataclass
class Exclude:
    """Drop prefixes whose ``on`` columns are in a negated set (validate-only negation)."""

    relation: Node
    position: int
    on: list[str]
    label: str = ""


Stage = TypingUnion[Lookup, Extend, Apply, Exclude]


@dataclass
class Pipeline:
    """The delta query of one source binding: its stages, in order."""

    source: Node
    position: int
    negated: bool
    label: str
    stages: list[Stage] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # the variables in the order the pipeline binds them

    def to_data(self, ref) -> dict:
        """The pipeline as plain data (``ref`` numbers the operators it reads)."""
        stages = []
        for s in self.stages:
            if isinstance(s, Lookup):
                stages.append({"lookup": ref(s.relation), "position": s.position, "on": list(s.on), "label": s.label})
            elif isinstance(s, Extend):
                stages.append({"extend": s.column, "extenders": [e.to_data(ref) for e in s.extenders]})
            elif isinstance(s, Apply):
                stages.append({"apply": ref(s.op)})
            else:
                stages.append({"exclude": ref(s.relation), "position": s.position, "on": list(s.on), "label": s.label})
        return {"source": ref(self.source), "position": self.position, "negated": self.negated, "label": self.label,
                "order": list(self.order), "stages": stages}

    def relations(self, negated: bool = True) -> Iterator[Node]:
        """The bindings it reads, in stage order from its source: those it joins, and with
        ``negated`` those whose keys it excludes."""
        yield self.source
        for s in self.stages:
            if isinstance(s, Lookup) or negated and isinstance(s, Exclude):
                yield s.relation
            elif isinstance(s, Extend):
                yield from (e.relation for e in s.extenders)

    def count_indexes(self) -> list[CountIndex]:
        """The count indexes its stages read."""
        return [e.count_index for s in self.stages if isinstance(s, Extend) for e in s.extenders
                if e.count_index is not None]


def selective(node: Node) -> bool:
    """Whether a binding is known to be small: query inputs, or a pattern whose constant
    binds its index key (a pipeline started from it looks up few keys at every stage)."""
    return isinstance(node, Static) or isinstance(node, Scan) and node.selective


class DeltaJoin(Node):
    """The join of a conjunction's bindings by delta pipelines (see the module docs).

    ``strategy`` is 'delta' (stages are lookups in a greedy connected order) or 'wco'
    (stages are Hector extensions); ``reader`` is the pipeline used to read the whole
    collection and to install.
    """

    def __init__(self, columns: Columns, pipelines: Sequence[Pipeline], reader: Pipeline, strategy: str):
        self.columns = tuple(columns)
        self.pipelines = list(pipelines)
        self.reader = reader
        self.strategy = strategy

    def inputs(self):
        found: list[Node] = []
        for p in self.pipelines:
            found += [n for n in p.relations() if all(n is not f for f in found)]
        return tuple(found)

    def empty_when_installed(self, empty):
        return any(empty(n) for n in self.reader.relations(negated=False))

    def _count_indexes(self) -> list[CountIndex]:
        return list({id(c): c for p in [*self.pipelines, self.reader] for c in p.count_indexes()}.values())

    def slots(self):
        return [c.slot for c in self._count_indexes()]

    def bind(self, alloc):
        for c in self._count_indexes():
            c.handle = alloc.handle(c.slot)

    def params(self, ref):
        return {"strategy": str(self.strategy), "pipelines": [p.to_data(ref) for p in self.pipelines],
                "reader": self.reader.to_data(ref)}

    # ------------------------------------------------------------ evaluation
    def _delta(self, cx):
        if cx.install:
            return self.read(cx, Version.NEW)
        changed = [(p, d) for p in self.pipelines if (d := p.source.delta(cx)) is not None]
        if not changed:
            return None
        if len(changed) >= REBUILT_FROM:
            if self._changed_by_a_large_share(cx, changed):
                return self._difference(cx)
            key = self._common_key()
            bindings = len(list(self.reader.relations()))
            if key is not None and len(changed) * (bindings - 1) > 2 * bindings:
                return self._keyed_difference(cx, key, [d for _, d in changed])
        parts = []
        for p, d in changed:
            if p.negated:
                d = cx.define(zset.select(d, p.source.names, diff=f"-{ident(DIFF)}"))
            parts.append(self._run(cx, p, d, lambda position, s=p.position: Version.NEW if position < s else Version.OLD))
        return cx.define(zset.union(parts, self.names))

    @staticmethod
    def _changed_by_a_large_share(cx: EpochContext, changed) -> bool:
        """Whether the attribute patterns among the ``changed`` bindings changed in this epoch
        by at least :data:`REBUILT_SHARE` of the updates they hold (False without any)."""
        handles = [p.source.handle for p, _ in changed if isinstance(p.source, Scan)]
        held = sum(h.tuples for h in handles)
        return held > 0 and sum(h.change_rows(cx.epoch) for h in handles) >= REBUILT_SHARE * held

    def _difference(self, cx: EpochContext) -> str:
        """The change as the whole collection as of NEW less the one as of OLD, consolidated."""
        old = cx.define(zset.select(self.read(cx, Version.OLD), self.names, diff=f"-{ident(DIFF)}"))
        return cx.define(zset.consolidate(f"({zset.union([self.read(cx, Version.NEW), old], self.names)})", self.names))

    def _common_key(self) -> tuple[str, Kind] | None:
        """A column every binding that can change has, and the reader's start too (the
        first of the start's such columns), or None: the join is then a union of joins per
        value of that column, and its change is confined to the values the change touches."""
        shared = set(self.reader.source.names)
        for p in self.pipelines:
            shared &= set(p.source.names)
        return next(((n, k) for n, k in self.reader.source.columns if n in shared), None)

    def _keyed_difference(self, cx: EpochContext, key: tuple[str, Kind], changes: list[str]) -> str:
        """The change as the join as of NEW less the join as of OLD, both read only where
        ``key`` has a value some binding's change has (``changes``): two readings of every
        binding by key instead of a pipeline per changed binding, each of which looks up
        every other binding. Taken when that reads fewer bindings: ``2n`` against ``c(n-1)``
        for ``c`` of ``n`` bindings changed. TPC-H's Q1 joins seven line item attributes by
        line item, and an epoch of new line items changes all seven: 14 lookups against 42."""
        name = ident(key[0])
        values = " UNION ALL ".join(f"SELECT {name} FROM {d}" for d in changes)
        touched = cx.define(zset.touched(f"({values})", [key[0]]))
        columns = [key] + [c for c in self.reader.source.columns if c[0] != key[0]]  # as join_into outputs them
        parts = []
        for version, sign in ((Version.NEW, ""), (Version.OLD, "-")):
            start = self.reader.source.join_into(cx, version, touched, [key], [key[0]])
            read = self._run(cx, self.reader, start, lambda position, v=version: v, columns)
            parts.append(cx.define(zset.select(read, self.names, diff=f"{sign}{ident(DIFF)}")))
        return cx.define(zset.consolidate(f"({zset.union(parts, self.names)})", self.names))

    def _read(self, cx, version):
        # a small start (inputs, a constant key): every stage looks up few keys, in the one
        # partition the start is in; operators above see that, so an install's aggregates
        # and its stored result need no shuffle
        small = cx.install and selective(self.reader.source)
        if small:
            cx = cx.child(probes=True)
        start = self.reader.source.read(cx, version)
        merged = not small and version is Version.NEW and self._partitioned_alike(cx)
        read = self._run(cx, self.reader, start, lambda position: version, merged=merged)
        return cx.define(one_partition(read)) if small else read

    def _partitioned_alike(self, cx: EpochContext) -> bool:
        """At an install, whether the reader is a star of attribute patterns looked up by
        the entity of its start, each attribute's state one batch kept in Spark and
        hash-partitioned by entity into as many partitions as the others': its lookups then
        join partition by partition, with no shuffle and no broadcast. Spark would broadcast
        every attribute under its threshold instead (a job each; TPC-H's Q1 six of 60,175 rows)."""
        start = _entity_scan(self.reader.source)
        if not cx.install or start is None:
            return False
        lookups = [s for s in self.reader.stages if not isinstance(s, Apply)]
        scans = [start] + [_entity_scan(s.relation) if isinstance(s, Lookup) else None for s in lookups]
        if len(scans) == 1 or any(scan is None or [scan.e_col] != s.on or scan.e_col != start.e_col
                                  for scan, s in zip(scans[1:], lookups)):
            return False
        counts = {scan.handle.hash_partitions(cx.epoch) for scan in scans}
        return len(counts) == 1 and None not in counts

    def _run(self, cx: EpochContext, pipeline: Pipeline, relation: str, version_of,
             columns: list[tuple[str, Kind]] | None = None, merged: bool = False) -> str:
        """``pipeline``'s stages run from ``relation`` (columns ``columns``, default its
        source's), each binding read as of ``version_of(its position)``; ``merged``: every
        lookup is a sort-merge join (see :meth:`_partitioned_alike`)."""
        columns = list(pipeline.source.columns) if columns is None else list(columns)
        for stage in pipeline.stages:
            if isinstance(stage, Lookup):
                version = version_of(stage.position)
                if merged:
                    relation = cx.define(zset.join(relation, [n for n, _ in columns], stage.relation.read(cx, version),
                                                   stage.relation.names, stage.on, hint="MERGE"))
                else:
                    relation = stage.relation.join_into(cx, version, relation, columns, stage.on)
                bound = {n for n, _ in columns}
                columns += [c for c in stage.relation.columns if c[0] not in bound]
            elif isinstance(stage, Extend):
                relation = self._extend(cx, stage, relation, columns, version_of)
                columns.append((stage.column, self.kind_of(stage.column)))
            elif isinstance(stage, Apply):
                relation = cx.define(stage.op.apply(relation))
                columns = list(stage.op.columns)
            elif isinstance(stage.relation, Stateful):
                relation = stage.relation.without(cx, version_of(stage.position), relation, columns, stage.on)
            else:
                negated = stage.relation.read(cx, version_of(stage.position))
                relation = cx.define(zset.semijoin(relation, negated, stage.on, anti=True))
        return cx.define(zset.select(relation, self.names))

    def _extend(self, cx: EpochContext, stage: Extend, prefix: str, columns: list[tuple[str, Kind]],
                version_of) -> str:
        """One Hector stage: count, nominate the smallest extender, propose, validate."""
        extenders = stage.extenders
        if len(extenders) == 1:
            only = extenders[0]
            return only.relation.join_into(cx, version_of(only.position), prefix, columns, only.key)
        names = [n for n, _ in columns]
        counted = prefix
        for i, e in enumerate(extenders):
            counts = e.counts(cx, version_of(e.position), prefix)
            on = " AND ".join(f"p.{ident(k)} = c.{ident(k)}" for k in e.key)
            joined = f"LEFT JOIN ({counts}) c ON {on}" if on else f"CROSS JOIN ({counts}) c"
            counted = cx.define(f"SELECT p.*, coalesce(c.{_COUNT}, 0) AS {_COUNT}{i} FROM {counted} p {joined}")
        n = [f"{_COUNT}{i}" for i in range(len(extenders))]
        cases = " ".join(f"WHEN {' AND '.join(f'{n[i]} <= {n[j]}' for j in range(i + 1, len(n)))} THEN {i}"
                         for i in range(len(n) - 1))
        nominated = cx.define(f"SELECT *, CASE {cases} ELSE {len(n) - 1} END AS {_WINNER} FROM {counted}")
        extended = columns + [(stage.column, self.kind_of(stage.column))]
        parts = []
        for i, proposer in enumerate(extenders):
            mine = cx.define(zset.select(f"{nominated} WHERE {_WINNER} = {i} AND {n[i]} > 0", names))
            relation = proposer.relation.join_into(cx, version_of(proposer.position), mine, columns, proposer.key)
            for j, validator in enumerate(extenders):
                if j != i:
                    relation = validator.relation.join_into(cx, version_of(validator.position), relation, extended,
                                                            validator.key + [stage.column])
            parts.append(relation)
        return cx.define(zset.union(parts, [n for n, _ in extended]))

    # ------------------------------------------------------------ explain
    def describe(self):
        return f"DeltaJoin ({self.strategy}): {plural(len(self.pipelines), 'pipeline')}, no private state"

    def details(self) -> list[str]:
        """Lines describing each pipeline: its source, variable order and stages."""
        lines = []
        for p in self.pipelines:
            head = f"pipeline from {'-d ' if p.negated else 'd '}{p.label}"
            if p.order:
                head += f"; variable order {' '.join(p.order)}"
            lines.append(head)
            for stage in p.stages:
                lines.append("  " + _describe_stage(stage))
        return lines


def _entity_scan(node: Node) -> Scan | None:
    """The attribute pattern ``[?e :a ?v]`` read by entity (no constants) that ``node`` is,
    or filters: rows of its state, partitioned as that state is (None for anything else)."""
    while isinstance(node, Filter):
        node = node.child
    if (isinstance(node, Scan) and node.slot.key == ("e",) and node.e_col is not None
            and node.e_const is None and node.v_const is None and node.e_col != node.v_col):
        return node
    return None


def _describe_stage(stage: Stage) -> str:
    if isinstance(stage, Lookup):
        what = "validate with" if set(stage.relation.names) <= set(stage.on) else "look up"
        on = ", ".join(stage.on) if stage.on else "nothing (cartesian product)"
        return f"{what} {stage.label} on {on}"
    if isinstance(stage, Extend):
        parts = []
        for e in stage.extenders:
            counted = "count index" if e.count_index is not None else "counted by lookup"
            parts.append(f"{e.label} by {', '.join(e.key) or '(all)'} ({counted})")
        kind = "extend" if len(stage.extenders) > 1 else "extend (single extender)"
        return f"{kind} to {stage.column}: " + "; ".join(parts)
    if isinstance(stage, Apply):
        return stage.op.describe()
    return f"anti-join {stage.label} on {', '.join(stage.on)}"
