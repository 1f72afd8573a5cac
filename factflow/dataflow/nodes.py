"""Dataflow operators over Z-set relations, each with its incremental (delta) rule.

Every operator produces relations with its data columns plus ``_diff``, as SQL named in
the evaluation's :class:`EpochContext`. ``delta(cx)`` is the change of the operator's
collection in the evaluated epoch (None when nothing changed); ``read(cx, version)`` is
the whole collection as of the epoch before (OLD) or after (NEW) the change. In install
mode the whole state is the change and OLD is empty, so the same rules compute initial
results.

Operators that keep state hold it in traces: :class:`Arranged` (an intermediate result
arranged privately, as join-at-a-time plans need) and :class:`Distinct` (derivation
counts, to report a set). Their pending changes are collected by the engine once per
epoch for all queries together and then committed to their traces.

Operators are built by planning, which allocates nothing: what an operator will hold (a
handle on a shared arrangement, a private trace, the view of a constant relation) is a
slot (:mod:`.slots`) until installing binds it (``bind``). ``plan_data`` describes an
operator as plain data (see :mod:`factflow.planner.plan`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from factflow.arrangement.batch import DIFF
from factflow.arrangement.views import one_partition
from factflow.arrangement.trace import Trace, TraceHandle
from factflow.dataflow import zset
from factflow.dataflow.context import EpochContext, Version
from factflow.dataflow.lookup import TRACE_DIFF, probe, probe_product
from factflow.dataflow.slots import Allocator, HandleSlot, RowsSlot, TraceSlot, plain
from factflow.dataflow.zset import ident, literal
from factflow.model.types import Kind

__all__ = ["Node", "Scan", "Static", "Filter", "Bind", "Project", "Rename", "Join", "AntiJoin", "Union",
           "Arranged", "Distinct", "Stateful", "OUT"]

OUT = "_out"
Columns = tuple[tuple[str, Kind], ...]


class Node:
    """Base class of dataflow operators."""

    columns: Columns = ()

    @property
    def names(self) -> list[str]:
        """Output column names (without ``_diff``)."""
        return [n for n, _ in self.columns]

    def kind_of(self, name: str) -> Kind:
        """Kind of an output column."""
        return dict(self.columns)[name]

    def inputs(self) -> Sequence["Node"]:
        """Operators this one reads."""
        return ()

    def empty_when_installed(self, empty: Callable[["Node"], bool]) -> bool:
        """Whether this operator certainly has no rows when its query is installed, given
        ``empty``, the same judgement of the operators it reads (see
        :func:`factflow.engine.install.produces_nothing`). False where unsure: a constant
        relation, and every operator that does not say otherwise."""
        return False

    def delta(self, cx: EpochContext) -> str | None:
        """This epoch's change (a relation name; memoized per evaluation)."""
        return cx.memo(self, "delta", lambda: self._delta(cx))

    def read(self, cx: EpochContext, version: Version) -> str:
        """The whole collection as of OLD or NEW (a relation name; memoized per evaluation)."""
        return cx.memo(self, f"read-{version.value}", lambda: self._read(cx, version))

    def join_into(self, cx: EpochContext, version: Version, frame: str, frame_columns: Columns,
                  on: Sequence[str]) -> str:
        """Join a (change) relation with columns ``frame_columns`` with this collection as
        of ``version`` on the columns ``on``; output: the frame's columns, then this one's others."""
        sql = zset.join(frame, [n for n, _ in frame_columns], self.read(cx, version), self.names, on)
        return cx.define(sql)

    def _delta(self, cx: EpochContext) -> str | None:
        raise NotImplementedError

    def _read(self, cx: EpochContext, version: Version) -> str:
        raise NotImplementedError

    def reachable(self, stop: Callable[["Node"], bool] = lambda n: False) -> list["Node"]:
        """Every operator upstream of this one (not itself), each once; the search does not
        go past operators for which ``stop`` is true (they are included)."""
        found: list[Node] = []
        seen: set[int] = set()
        stack: list[Node] = list(self.inputs())
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            found.append(n)
            if not stop(n):
                stack.extend(n.inputs())
        return found

    def walk(self) -> list["Node"]:
        """This operator and everything upstream of it, each once, inputs first."""
        seen: set[int] = set()
        order: list[Node] = []

        def visit(n: Node) -> None:
            if id(n) in seen:
                return
            seen.add(id(n))
            for i in n.inputs():
                visit(i)
            order.append(n)

        visit(self)
        return order

    def describe(self) -> str:
        """One line for explain output."""
        return type(self).__name__

    def details(self) -> list[str]:
        """Further explain lines under this operator (none by default)."""
        return []

    def slots(self) -> list[HandleSlot | TraceSlot | RowsSlot]:
        """What installing allocates for this operator (see :mod:`.slots`; none by default)."""
        return []

    def bind(self, alloc: Allocator) -> None:
        """Take what ``alloc`` allocates for this operator's slots (nothing by default)."""

    def params(self, ref: Callable[["Node"], int]) -> dict:
        """The operator's own parameters as plain data; ``ref`` numbers another operator of the plan."""
        return {}

    def plan_data(self, ref: Callable[["Node"], int]) -> dict:
        """The operator as plain data: its type, columns, inputs (numbered by ``ref``) and parameters."""
        return {"op": type(self).__name__, "columns": [[n, k.value] for n, k in self.columns],
                "inputs": [ref(n) for n in self.inputs()], **self.params(ref)}


class Scan(Node):
    """A data pattern over one face of a shared attribute arrangement.

    ``e`` and ``v`` are each a column name (binding a variable), a constant, or None (a
    blank, projected away while keeping multiplicities).
    """

    def __init__(self, slot: HandleSlot, value_kind: Kind, e_col: str | None, e_const, v_col: str | None, v_const,
                 label: str):
        self.slot = slot
        self.handle: TraceHandle | None = None  # bound at install
        self.attribute_name = slot.attribute
        self.face = slot.face
        self.value_kind = value_kind
        self.e_col, self.e_const = e_col, e_const
        self.v_col, self.v_const = v_col, v_const
        self.label = label
        cols: list[tuple[str, Kind]] = []
        if e_col is not None:
            cols.append((e_col, Kind.LONG))
        if v_col is not None and v_col != e_col:
            cols.append((v_col, value_kind))
        self.columns = tuple(cols)

    def slots(self):
        return [self.slot]

    def bind(self, alloc):
        self.handle = alloc.handle(self.slot)

    def empty_when_installed(self, empty):
        return self.handle.tuples == 0

    def params(self, ref):
        return {"slot": self.slot.to_data(), "value_kind": self.value_kind.value, "e": self.e_col,
                "e_const": plain(self.e_const), "v": self.v_col, "v_const": plain(self.v_const), "label": self.label}

    def _constants(self) -> list[tuple[str, str]]:
        """The pattern's constants: the index column each fixes (``e`` or ``v``) and its SQL literal."""
        return [(side, literal(value, kind)) for side, value, kind in
                (("e", self.e_const, Kind.LONG), ("v", self.v_const, self.value_kind)) if value is not None]

    def _shape(self, cx: EpochContext, relation: str, probed: str | None = None) -> str:
        """``relation``'s rows that match the pattern, as its columns; ``probed`` names the
        column a probe by the constant has matched already (not filtered again: the constant
        then appears nowhere in the statement's generated code, which Spark compiles once
        for a query whatever its constant)."""
        conditions = [f"`{side}` = {value}" for side, value in self._constants() if side != probed]
        if self.e_col is not None and self.e_col == self.v_col:
            conditions.append("`e` = `v`")
        outs = []
        if self.e_col is not None:
            outs.append(f"`e` AS {ident(self.e_col)}")
        if self.v_col is not None and self.v_col != self.e_col:
            outs.append(f"`v` AS {ident(self.v_col)}")
        outs.append(ident(DIFF))
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        return cx.define(f"SELECT {', '.join(outs)} FROM {relation}{where}")

    def _delta(self, cx):
        if cx.install:
            return self._shape(cx, self.handle.read(cx.epoch))
        batches = self.handle.changes(cx.epoch)
        if not batches:
            return None
        if len(batches) == 1:
            return self._shape(cx, batches[0])
        return self._shape(cx, "(" + " UNION ALL ".join(f"SELECT * FROM {b}" for b in batches) + ")")

    def _read(self, cx, version):
        if version is Version.OLD and cx.install:
            return self._shape(cx, self.handle.empty())
        as_of = _as_of(cx, version)
        keyed = self.keyed_read(cx, as_of)
        if keyed is not None:
            return self._shape(cx, keyed, probed=self.slot.key[0])
        return self._shape(cx, self.handle.read(as_of))

    @property
    def selective(self) -> bool:
        """Whether a constant binds the key of the index this pattern reads."""
        key = self.slot.key
        return key == ("e",) and self.e_const is not None or key == ("v",) and self.v_const is not None

    def keyed_read(self, cx: EpochContext, as_of: int) -> str | None:
        """The index rows of a pattern whose constant binds the index key, probed by that
        key (``e, v, _diff``), or None when a probe does not apply. The constant is a row of
        an inline table, not a literal of the statement, so that Spark's generated code does
        not depend on it."""
        if not self.selective:
            return None
        key = self.slot.key[0]
        other = "v" if key == "e" else "e"
        value, kind = (self.e_const, Kind.LONG) if key == "e" else (self.v_const, self.value_kind)
        constant = cx.define(f"SELECT * FROM VALUES ({literal(value, kind)}, 1L) AS t(`_k`, {ident(DIFF)})")
        probed = probe(cx, self.handle, constant, [("_k", kind)], [("_k", key)], [(other, other)], as_of, how="semi")
        if probed is None:
            return None
        return f"(SELECT `_k` AS `{key}`, `{other}`, {ident(TRACE_DIFF)} AS {ident(DIFF)} FROM {probed})"

    def join_into(self, cx, version, frame, frame_columns, on):
        """Probe the index by the frame's keys where that applies (see :mod:`.lookup`). A
        constant on the side the index is not keyed by (``[?l :l/shipinstruct "IN PERSON"]``
        looked up by ``?l``) is tested on the probed rows: joined whole instead, such a
        pattern read every row of its attribute in each small epoch (TPC-H's Q19: 179
        scans of a line item attribute, 10.8 million rows, for one order)."""
        if not (self.e_col is not None and self.e_col == self.v_col):
            source = {c: side for c, side in ((self.e_col, "e"), (self.v_col, "v")) if c is not None}
            constants = self._constants()
            values = [(source[c], c) for c in self.names if c not in on] + [(side, f"_c{side}") for side, _ in constants]
            product = probe_product(cx, self.handle, frame, frame_columns, [(c, source[c]) for c in on], values,
                                    _as_of(cx, version))
            if product is not None:
                if not constants:
                    return product
                test = " AND ".join(f"`_c{side}` = {value}" for side, value in constants)
                names = [n for n, _ in frame_columns] + [c for c in self.names if c not in on]
                return cx.define(zset.select(f"({zset.where(product, test)})", names))
        return super().join_into(cx, version, frame, frame_columns, on)

    def describe(self):
        return f"Scan {self.label} via {self.face} index of {self.attribute_name}"


def _as_of(cx: EpochContext, version: Version) -> int:
    """The epoch a read of ``version`` is as of."""
    return cx.epoch if version is Version.NEW else cx.old_epoch


class Static(Node):
    """A constant relation (query inputs and literal collections); it never changes."""

    def __init__(self, slot: RowsSlot, label: str):
        self.slot = slot
        self.view: str | None = None  # bound at install: SQL of the rows
        self.columns = slot.columns
        self.label = label

    def slots(self):
        return [self.slot]

    def bind(self, alloc):
        self.view = one_partition(alloc.view(self.slot))

    def params(self, ref):
        return {"slot": self.slot.to_data(), "label": self.label}

    def _delta(self, cx):
        return self.view if cx.install else None

    def _read(self, cx, version):
        if cx.install and version is Version.OLD:
            return cx.define(zset.empty(self.columns))
        return self.view

    def describe(self):
        return f"Static {self.label}"


class _Linear(Node):
    """An operator applied tuple by tuple: delta and reads are the operator applied to the input's."""

    def __init__(self, child: Node):
        self.child = child

    def inputs(self):
        return (self.child,)

    def empty_when_installed(self, empty):
        return empty(self.child)

    def apply(self, relation: str) -> str:
        """SQL of this operator applied to ``relation``."""
        raise NotImplementedError

    def _delta(self, cx):
        d = self.child.delta(cx)
        return None if d is None else cx.define(self.apply(d))

    def _read(self, cx, version):
        return cx.define(self.apply(self.child.read(cx, version)))

    def _join_through(self, cx: EpochContext, version: Version, frame: str, frame_columns: Columns,
                      on: Sequence[str], sources: dict[str, str]) -> str:
        """:meth:`join_into` for an operator whose every column is one of the input's
        (``sources``: each of its columns' name in the input): the frame, its keys renamed,
        joins the input, which probes by key where it can (a rule's result read through the
        renaming that binds it to a query's variables, for one), and the input's columns are
        renamed back. Joins the whole collection when the frame's other columns share a name
        with the input's."""
        frame_names = [n for n, _ in frame_columns]
        if {n for n in frame_names if n not in on} & set(self.child.names):
            return super().join_into(cx, version, frame, frame_columns, on)
        renamed = [(sources[n] if n in on else n, kind) for n, kind in frame_columns]
        outs = [f"{ident(n)} AS {ident(r)}" for n, (r, _) in zip(frame_names, renamed)] + [ident(DIFF)]
        keyed = cx.define(f"SELECT {', '.join(outs)} FROM {frame}")
        joined = self.child.join_into(cx, version, keyed, tuple(renamed), [sources[k] for k in on])
        back = [f"{ident(sources[n])} AS {ident(n)}" if n in on else ident(n) for n in frame_names]
        mine = [f"{ident(sources[n])} AS {ident(n)}" for n in self.names if n not in on]
        return cx.define(f"SELECT {', '.join(back + mine + [ident(DIFF)])} FROM {joined}")


class Filter(_Linear):
    """Keep tuples satisfying a SQL condition over the input's columns."""

    def __init__(self, child: Node, condition: str, label: str):
        super().__init__(child)
        self.condition = condition
        self.columns = child.columns
        self.label = label

    def apply(self, relation):
        return zset.where(relation, self.condition)

    def params(self, ref):
        return {"condition": self.condition, "label": self.label}

    def join_into(self, cx, version, frame, frame_columns, on):
        """Join with the unfiltered input, then filter: the condition reads only its columns."""
        return cx.define(self.apply(self.child.join_into(cx, version, frame, frame_columns, on)))

    def describe(self):
        return f"Filter {self.label}"


class Bind(_Linear):
    """Bind a computed value to a column (or, if the column exists, keep tuples where it matches)."""

    def __init__(self, child: Node, name: str, kind: Kind, value: str, label: str):
        super().__init__(child)
        self.name, self.value, self.label = name, value, label
        self.rebinds = name in child.names
        self.columns = child.columns if self.rebinds else child.columns + ((name, kind),)

    def params(self, ref):
        return {"name": self.name, "value": self.value, "label": self.label}

    def apply(self, relation):
        return self._bound(relation, self.child.names)

    def _bound(self, relation: str, names: Sequence[str]) -> str:
        """``relation`` (columns ``names``, the input's among them) with the value bound."""
        if self.rebinds:
            return zset.where(relation, f"{ident(self.name)} = {self.value}")
        outs = [ident(n) for n in names] + [f"{self.value} AS {ident(self.name)}", ident(DIFF)]
        inner = f"SELECT {', '.join(outs)} FROM {relation}"
        return f"SELECT * FROM ({inner}) WHERE {ident(self.name)} IS NOT NULL"

    def join_into(self, cx, version, frame, frame_columns, on):
        """Join with the input, then bind (the value reads only the input's columns), so that
        the input is probed by key where it can be instead of read whole; a join on the
        bound column itself joins the bound collection."""
        if self.name in on:
            return super().join_into(cx, version, frame, frame_columns, on)
        joined = self.child.join_into(cx, version, frame, frame_columns, on)
        names = [n for n, _ in frame_columns] + [n for n in self.child.names if n not in on]
        return cx.define(self._bound(joined, names))

    def describe(self):
        return f"Bind {self.label}"


class Project(_Linear):
    """Keep some columns (multiset projection: multiplicities add up, nothing is consolidated)."""

    def __init__(self, child: Node, names: Sequence[str]):
        super().__init__(child)
        kinds = dict(child.columns)
        self.columns = tuple((n, kinds[n]) for n in names)

    def apply(self, relation):
        return zset.select(relation, self.names)

    def join_into(self, cx, version, frame, frame_columns, on):
        """Join with the input, which probes by key where it can, then project."""
        return self._join_through(cx, version, frame, frame_columns, on, {n: n for n in self.names})

    def present_as_installed(self, cx: EpochContext) -> None:
        """Present what this projects (a shared aggregate rule's Reduce, whose hidden
        accumulators it drops) as installed; the projection follows from it."""
        self.child.present_as_installed(cx)  # type: ignore[attr-defined]

    def describe(self):
        return "Project"


class Rename(_Linear):
    """Rename columns (``mapping`` old -> new), dropping the columns it does not name."""

    def __init__(self, child: Node, mapping: dict[str, str]):
        super().__init__(child)
        self.mapping = dict(mapping)
        kinds = dict(child.columns)
        self.columns = tuple((new, kinds[old]) for old, new in self.mapping.items())

    def params(self, ref):
        return {"mapping": [[old, new] for old, new in self.mapping.items()]}

    def apply(self, relation):
        outs = [f"{ident(old)} AS {ident(new)}" for old, new in self.mapping.items()] + [ident(DIFF)]
        return f"SELECT {', '.join(outs)} FROM {relation}"

    def join_into(self, cx, version, frame, frame_columns, on):
        """Join with the input under its own names, which probes by key where it can."""
        return self._join_through(cx, version, frame, frame_columns, on,
                                  {new: old for old, new in self.mapping.items()})

    def describe(self):
        return "Rename " + ", ".join(f"{a} -> {b}" for a, b in self.mapping.items())


class Join(Node):
    """Binary equi-join on shared columns: d(L join R) = dL join R_new + L_old join dR."""

    def __init__(self, left: Node, right: Node):
        self.left, self.right = left, right
        self.on = [n for n in left.names if n in right.names]
        self.columns = left.columns + tuple(c for c in right.columns if c[0] not in self.on)

    def params(self, ref):
        return {"on": list(self.on)}

    def inputs(self):
        return (self.left, self.right)

    def empty_when_installed(self, empty):
        return empty(self.left) or empty(self.right)

    def _delta(self, cx):
        parts = []
        dl = self.left.delta(cx)
        if dl is not None:
            parts.append(self.right.join_into(cx, Version.NEW, dl, self.left.columns, self.on))
        dr = self.right.delta(cx)
        if dr is not None:
            parts.append(self.left.join_into(cx, Version.OLD, dr, self.right.columns, self.on))
        if not parts:
            return None
        return cx.define(zset.union(parts, self.names))

    def _read(self, cx, version):
        joined = zset.join(self.left.read(cx, version), self.left.names, self.right.read(cx, version),
                           self.right.names, self.on)
        return cx.define(zset.select(f"({joined})", self.names))

    def describe(self):
        on = ", ".join(self.on) if self.on else "nothing (cartesian product)"
        return f"Join on {on}"


class AntiJoin(Node):
    """Negation: the tuples of ``left`` whose ``on`` columns are not in the set ``negated``.

    ``negated`` must be set-valued (a :class:`Distinct`). With ``N`` the indicator of the
    negated set, the output is ``L * (1 - N)``, so its change is
    ``dL antijoin N_new - L_old join dN``: a key entering the negated set removes the old
    left tuples with that key, a key leaving it brings them back.
    """

    def __init__(self, left: Node, negated: Node, label: str):
        self.left, self.negated, self.label = left, negated, label
        self.on = list(negated.names)
        self.columns = left.columns

    def params(self, ref):
        return {"on": list(self.on), "label": self.label}

    def inputs(self):
        return (self.left, self.negated)

    def empty_when_installed(self, empty):
        return empty(self.left)

    def _delta(self, cx):
        parts = []
        dl = self.left.delta(cx)
        if dl is not None:
            parts.append(self._kept(cx, dl))
        dn = self.negated.delta(cx)
        if dn is not None:
            flipped = cx.define(zset.select(dn, self.on, diff=f"-{ident(DIFF)}"))
            on_columns = tuple((n, self.left.kind_of(n)) for n in self.on)
            joined = self.left.join_into(cx, Version.OLD, flipped, on_columns, self.on)
            parts.append(cx.define(zset.select(joined, self.names)))
        if not parts:
            return None
        return cx.define(zset.union(parts, self.names))

    def _kept(self, cx: EpochContext, dl: str) -> str:
        """The left change's rows whose key is not in the negated set as of NEW."""
        if isinstance(self.negated, Stateful):
            return self.negated.without(cx, Version.NEW, dl, self.left.columns, self.on)
        return cx.define(zset.semijoin(dl, self.negated.read(cx, Version.NEW), self.on, anti=True))

    def _read(self, cx, version):
        kept = zset.semijoin(self.left.read(cx, version), self.negated.read(cx, version), self.on, anti=True)
        return cx.define(kept)

    def describe(self):
        return f"AntiJoin {self.label} on {', '.join(self.on)}"


class Union(Node):
    """Concatenation of collections with the same columns."""

    def __init__(self, children: Sequence[Node]):
        self.children = list(children)
        self.columns = self.children[0].columns

    def inputs(self):
        return tuple(self.children)

    def empty_when_installed(self, empty):
        return all(empty(n) for n in self.children)

    def _delta(self, cx):
        parts = [d for d in (c.delta(cx) for c in self.children) if d is not None]
        return cx.define(zset.union(parts, self.names)) if parts else None

    def _read(self, cx, version):
        return cx.define(zset.union([c.read(cx, version) for c in self.children], self.names))

    def describe(self):
        return f"Union of {len(self.children)}"


class Stateful(Node):
    """An operator that keeps its input in a private trace, updated once per epoch.

    ``pending(cx)`` is the relation the engine collects (consolidated changes to the
    trace, plus an ``_out`` column for operators whose output differs from their state).
    The operator reads its state through ``handle`` only; ``writer`` is the trace itself,
    which only the engine's evaluation appends what it collected to (both allocated at
    install from ``slot``).
    """

    def __init__(self, child: Node, slot: TraceSlot):
        self.child = child
        self.slot = slot
        self.role = slot.role
        self.columns = child.columns
        self.writer: Trace | None = None  # bound at install, with the handle
        self.handle: TraceHandle | None = None

    def inputs(self):
        return (self.child,)

    def empty_when_installed(self, empty):
        return empty(self.child)  # an aggregate of nothing has no group

    def slots(self):
        return [self.slot]

    def bind(self, alloc):
        self.writer, owner = alloc.trace(self.slot)
        self.handle = self.writer.handle(self.writer.upper - 1, owner)

    def params(self, ref):
        return {"slot": self.slot.to_data()}

    def state_delta(self, cx: EpochContext) -> str | None:
        """This epoch's consolidated change to the trace."""
        return cx.memo(self, "state", lambda: self._state_delta(cx))

    def _state_delta(self, cx):
        d = self.child.delta(cx)
        return None if d is None else cx.define(zset.consolidate(d, self.names))

    def pending(self, cx: EpochContext) -> str | None:
        """What the engine collects for this operator in this evaluation."""
        return self.state_delta(cx)

    def state(self, cx: EpochContext, version: Version) -> str:
        """The trace's updates as of ``version`` (not consolidated)."""
        return cx.memo(self, f"state-{version.value}", lambda: self._state(cx, version))

    def _state(self, cx, version):
        if version is Version.OLD:
            if cx.install:
                return cx.define(zset.empty(self.columns))
            return cx.define(zset.select(self.handle.read(cx.old_epoch), self.names))
        d = self.state_delta(cx)
        old = self.state(cx, Version.OLD)
        return old if d is None else cx.define(zset.union([old, d], self.names))

    def present_as_installed(self, cx: EpochContext) -> None:
        """For an install evaluation that must not recompute this (already maintained, a
        shared rule's) operator: its current state is the change, its old state empty, and
        downstream reads what that state shows (:meth:`_shown`)."""
        updates = cx.define(zset.select(self.handle.read(cx.epoch), self.names))
        empty = cx.define(zset.empty(self.columns))
        shown = self._shown(cx, updates)
        for what, relation in (("state-old", empty), ("state-new", updates), ("read-old", empty),
                               ("read-new", shown), ("delta", shown)):
            cx.set(self, what, relation)

    def _shown(self, cx: EpochContext, updates: str) -> str:
        """What downstream reads of the trace's ``updates`` (the updates themselves, unless
        the operator presents them otherwise)."""
        return updates

    def adopt(self, cx: EpochContext, relation: str) -> None:
        """Use ``relation`` (the materialized pending rows) for everything downstream."""
        cx.set(self, "state", cx.define(zset.select(relation, self.names)))
        cx.set(self, "pending", relation)

    def probe_old(self, cx: EpochContext, frame: str, frame_columns: Columns, on: Sequence[str],
                  how: str = "inner", present: bool = False) -> str | None:
        """``frame`` probed against the trace as of the epoch before (see :mod:`.lookup`)."""
        if not self.names or cx.install:
            return None
        values = [(n, n) for n in self.names if n not in on]
        return probe(cx, self.handle, frame, frame_columns, [(c, c) for c in on], values, cx.old_epoch,
                     how=how, present=present)

    def product_old(self, cx: EpochContext, frame: str, frame_columns: Columns, on: Sequence[str],
                    present: bool = False) -> str | None:
        """``frame`` joined with the trace as of the epoch before by a probe, as a Z-set
        (:func:`.lookup.probe_product`: it may continue the probe chain that made ``frame``)."""
        if not self.names or cx.install:
            return None
        values = [(n, n) for n in self.names if n not in on]
        return probe_product(cx, self.handle, frame, frame_columns, [(c, c) for c in on], values, cx.old_epoch,
                             present=present)

    def probed_join(self, cx: EpochContext, frame: str, frame_columns: Columns, on: Sequence[str],
                    change: str | None, present: bool = False) -> str | None:
        """``frame`` joined with this collection by a probe of the trace as of the epoch
        before, plus ``frame`` joined with ``change`` when given (this epoch's change to what
        is joined, for a join as of NEW); None when a probe does not apply."""
        product = self.product_old(cx, frame, frame_columns, on, present=present)
        if product is None or change is None:
            return product
        names = [n for n, _ in frame_columns] + [n for n in self.names if n not in on]
        changed = cx.define(zset.join(frame, [n for n, _ in frame_columns], change, self.names, on))
        return cx.define(zset.union([product, changed], names))

    def join_into(self, cx, version, frame, frame_columns, on):
        """Probe the old state by the frame's keys (plus, as of NEW, join this epoch's change),
        where that applies (see :mod:`.lookup`); else join the whole state. (A lookup of an
        aggregate rule by its group, as TPC-H Q18's orders by their summed quantity, read
        the whole result in every small epoch before.)"""
        change = self.state_delta(cx) if version is Version.NEW else None
        joined = self.probed_join(cx, frame, frame_columns, on, change)
        return super().join_into(cx, version, frame, frame_columns, on) if joined is None else joined

    def without(self, cx: EpochContext, version: Version, frame: str, frame_columns: Columns,
                on: Sequence[str]) -> str:
        """The rows of ``frame`` whose ``on`` columns are not in this collection as of
        ``version``: probed by key when that state is the trace's (as of OLD, or NEW when
        nothing changed in this epoch; see :mod:`.lookup`), else an anti-join."""
        unchanged = version is Version.OLD or self.state_delta(cx) is None
        probed = self.probe_old(cx, frame, frame_columns, on, how="left", present=True) if unchanged else None
        if probed is not None:
            return cx.define(f"{zset.select(probed, [n for n, _ in frame_columns])} WHERE {ident(TRACE_DIFF)} = 0")
        return cx.define(zset.semijoin(frame, self.read(cx, version), on, anti=True))


class Arranged(Stateful):
    """An intermediate collection arranged privately (join-at-a-time plans)."""

    def _delta(self, cx):
        return self.state_delta(cx)

    def _read(self, cx, version):
        return self.state(cx, version)

    def describe(self):
        return f"Arrange privately by {', '.join(self.slot.key) or '(all)'}"


def _set_change(old_count: str, diff: str) -> str:
    """SQL of a set's change for a row whose count goes from ``old_count`` (NULL: 0) by ``diff``."""
    before = f"coalesce({old_count}, 0)"
    return (f"CAST(CASE WHEN {before} <= 0 AND {before} + {diff} > 0 THEN 1 "
            f"WHEN {before} > 0 AND {before} + {diff} <= 0 THEN -1 ELSE 0 END AS BIGINT)")


class Distinct(Stateful):
    """Set semantics: tracks derivation counts and reports each present tuple once."""

    def pending(self, cx):
        return cx.memo(self, "pending", lambda: self._pending(cx))

    def _pending(self, cx):
        d = self.state_delta(cx)
        if d is None:
            return None
        group = ", ".join(ident(n) for n in self.names)
        probed = self.probe_old(cx, d, self.columns, self.names, how="left")
        if probed is not None:  # d holds each row once, so its rows group back exactly
            counts = (f"SELECT {group}, {ident(DIFF)}, SUM({ident(TRACE_DIFF)}) AS `_old` FROM {probed} "
                      f"GROUP BY {group}, {ident(DIFF)}")
            return cx.define(f"SELECT {group}, {ident(DIFF)}, {_set_change('`_old`', ident(DIFF))} AS {ident(OUT)} "
                             f"FROM ({counts})")
        old = zset.semijoin(self.state(cx, Version.OLD), d, self.names)
        on = " AND ".join(f"d.{ident(n)} = o.{ident(n)}" for n in self.names)
        counts = f"SELECT {group}, SUM({ident(DIFF)}) AS `_old` FROM ({old}) GROUP BY {group}"
        cols = ", ".join(f"d.{ident(n)}" for n in self.names)
        join = f"LEFT JOIN ({counts}) o ON {on}" if self.names else f"CROSS JOIN ({counts}) o"
        change = _set_change("o.`_old`", f"d.{ident(DIFF)}")
        return cx.define(f"SELECT {cols}, d.{ident(DIFF)}, {change} AS {ident(OUT)} FROM {d} d {join}")

    def _delta(self, cx):
        p = self.pending(cx)
        if p is None:
            return None
        return cx.define(zset.where(f"({zset.select(p, self.names, diff=ident(OUT))})", f"{ident(DIFF)} <> 0"))

    def _present(self, cx: EpochContext, updates: str) -> str:
        """Tuples whose accumulated count in ``updates`` is positive, each once."""
        return cx.define(zset.present(updates, self.names))

    def _read(self, cx, version):
        return self._present(cx, self.state(cx, version))

    def join_into(self, cx, version, frame, frame_columns, on):
        """Join with the present set, probed by key: as of NEW, the set as of OLD probed
        and this epoch's change to the set joined."""
        change = self.delta(cx) if version is Version.NEW else None
        joined = self.probed_join(cx, frame, frame_columns, on, change, present=True)
        if joined is not None:
            return joined
        touched = zset.semijoin(self.state(cx, version), frame, on)
        present = self._present(cx, f"({touched})")
        return cx.define(zset.join(frame, [n for n, _ in frame_columns], present, self.names, on))

    def without(self, cx, version, frame, frame_columns, on):
        """As :meth:`Stateful.without`, probed by key as of NEW too: the set as of OLD
        probed, this epoch's change to the set added per key (``on`` naming all its columns)."""
        if version is Version.OLD or set(on) != set(self.names):
            return super().without(cx, version, frame, frame_columns, on)
        d = self.delta(cx)
        if d is None:  # the set is as it was
            return super().without(cx, Version.OLD, frame, frame_columns, on)
        probed = self.probe_old(cx, frame, frame_columns, on, how="left", present=True)
        if probed is None:
            return super().without(cx, version, frame, frame_columns, on)
        keys = ", ".join(ident(n) for n in on)
        changes = f"SELECT {keys}, SUM({ident(DIFF)}) AS `_changed` FROM {d} GROUP BY {keys}"
        match = " AND ".join(f"p.{ident(n)} = c.{ident(n)}" for n in on)
        kept = ", ".join(f"p.{ident(n)}" for n, _ in frame_columns)
        return cx.define(f"SELECT {kept}, p.{ident(DIFF)} FROM {probed} p LEFT JOIN ({changes}) c ON {match} "
                         f"WHERE p.{ident(TRACE_DIFF)} + coalesce(c.`_changed`, 0) = 0")

    def _shown(self, cx: EpochContext, updates: str) -> str:
        return self._present(cx, updates)

    def describe(self):
        return f"Distinct (derivation counts in {self.writer.name if self.writer else self.slot.label})"
