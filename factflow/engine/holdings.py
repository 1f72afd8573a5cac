"""What each arrangement holds, in rows, batches and bytes, and which queries read it.

:meth:`factflow.engine.engine.Engine.holdings` lists every trace the engine keeps: a face
of a shared attribute index (forward, reverse, counts), a query's private trace
(intermediate or result) or a shared rule's, with its update rows, its batches (held on
the driver, or stored in Spark), the bytes they take and the queries reading it, so the
sharing of state between queries is visible (the server's console shows it on its State
page). Everything comes from what the engine already holds, with no Spark job and no
pass over rows:

* rows and batches: the counts each batch keeps;
* driver bytes: a driver batch's rows times the width of its columns in pandas (numbers
  at their width, strings by reference: their text is not counted), as pandas' own
  ``memory_usage()`` counts them, without asking each frame;
* Spark memory and disk: Spark's storage status of the checkpointed blocks of stored
  batches (one call for all of them);
* index bytes: the sizes of stored batches' sorted index files, asked once per file (a
  file never changes once written) and remembered while the file is in use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from factflow.arrangement.trace import Trace
from factflow.model.types import Kind

if TYPE_CHECKING:  # pragma: no cover
    from factflow.engine.state import EngineState

__all__ = ["Holdings"]

#: Bytes per value of a driver batch's column, by kind (pandas' arrays: a string is a reference).
_WIDTHS = {Kind.LONG: 8, Kind.DOUBLE: 8, Kind.STRING: 8, Kind.BOOLEAN: 1, Kind.INSTANT: 8}


class Holdings:
    """Reads what the arrangements of one engine hold (see the module docs); keeps the sizes
    of the index files it has seen."""

    def __init__(self) -> None:
        self._file_sizes: dict[str, int] = {}

    def read(self, state: "EngineState") -> list[dict[str, Any]]:
        """One entry per trace: ``name``, ``kind`` (``attribute``, ``query`` or ``rule``),
        ``owner`` (the attribute, query or shared rule), ``role`` (the face of an attribute
        index, else ``intermediate`` or ``result``), ``tuples``, ``batches``,
        ``driver_batches``, ``driver_bytes``, ``spark_memory_bytes``, ``spark_disk_bytes``,
        ``index_bytes`` and ``readers`` (the installed queries reading it, directly or
        through a shared rule). Call under the engine lock."""
        blocks = _spark_blocks(state)
        rule_users = {e.name: e.users for e in state.shared.entries()}
        sizes: dict[str, int] = {}
        entries = []

        def describe(trace: Trace, kind: str, owner: str, role: str) -> None:
            readers = set()
            for handle in trace.handles:
                readers |= rule_users.get(handle.owner, {handle.owner})
            if kind == "query":
                readers.add(owner)
            elif kind == "rule":
                readers |= rule_users.get(owner, set())
            width = sum(_WIDTHS[k] for _, k in trace.layout.columns) + 16  # and _t, _diff
            driver = spark_memory = spark_disk = index = 0
            for batch in trace.batches:
                if batch.is_local:
                    driver += batch.rows * width
                    continue
                if batch.owns_stored:
                    memory, disk = blocks.get(_rdd_id(batch.frame), (0, 0))
                    spark_memory += memory
                    spark_disk += disk
                for name in batch.index_paths if batch.index is not None else ():
                    index += self._file_size(batch.index, name, sizes)
            entries.append({
                "name": trace.name, "kind": kind, "owner": owner, "role": role, "tuples": trace.tuples,
                "batches": len(trace.batches), "driver_batches": sum(1 for b in trace.batches if b.is_local),
                "driver_bytes": driver, "spark_memory_bytes": spark_memory, "spark_disk_bytes": spark_disk,
                "index_bytes": index, "readers": sorted(r for r in readers if r in state.queries)})

        for arrangement in state.arrangements.values():
            for face, trace in arrangement.traces.items():
                describe(trace, "attribute", str(arrangement.attribute.name), face)
        for name, query in state.queries.items():
            for trace, role in query.dataflow.private_traces():
                describe(trace, "query", name, role)
        for entry in state.shared.entries():
            for trace, role in entry.traces:
                describe(trace, "rule", entry.name, role)
        self._file_sizes = sizes  # files no longer in use are forgotten
        return entries

    def _file_size(self, directory: Any, name: str, seen: dict[str, int]) -> int:
        path = directory.file(name)
        size = self._file_sizes.get(path)
        if size is None:
            try:
                size = directory.size(name)
            except OSError:  # removed by a merge meanwhile
                return 0
        seen[path] = size
        return size


def _spark_blocks(state: "EngineState") -> dict[int, tuple[int, int]]:
    """Bytes in memory and on disk of every RDD Spark keeps blocks of, by RDD id."""
    infos = state.spark.sparkContext._jsc.sc().getRDDStorageInfo()
    return {info.id(): (int(info.memSize()), int(info.diskSize())) for info in infos}


def _rdd_id(frame: Any) -> int | None:
    """The id of the RDD a checkpointed frame reads (see
    :func:`factflow.arrangement.batch.release_checkpoint`)."""
    try:
        return int(frame._jdf.queryExecution().analyzed().rdd().id())
    except Exception:  # noqa: BLE001 - a frame that is not a checkpoint has no blocks of its own
        return None
