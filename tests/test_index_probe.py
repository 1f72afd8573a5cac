"""The task side of index probes (factflow.arrangement.index), without Spark (but for one check of a hash).

Index files are written here the way Spark writes them (rows sorted by a key hash); the
hash is any 64-bit function of the key, so collisions can be forced on purpose: a probe
must match rows by their key, the hash only narrows the search.
"""

from __future__ import annotations

import datetime as dt
import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from factflow.arrangement.index import (
    KEY_HASH, PROBE_HASH, PROBE_PARAMETERS, PROBE_PART, ParameterizedProbes, Probe, ProbeChain, TaggedProbes,
    arrow_schema, long_hash, long_partition_hash,
)
from factflow.model.types import Kind
from factflow.storage.location import Location

TRACE = [("e", Kind.LONG), ("v", Kind.STRING)]
TRACE_SCHEMA = arrow_schema(TRACE + [("_t", Kind.LONG), ("_diff", Kind.LONG)])


def weak_hash(value) -> int:
    """A deliberately weak hash: every key collides with others of the same remainder."""
    return hash(value) % 3


def write_file(path, rows):
    """An index file of update rows (e, v, t, diff), sorted by the hash of e."""
    rows = sorted(rows, key=lambda r: weak_hash(r[0]))
    table = pa.table({"e": [r[0] for r in rows], "v": [r[1] for r in rows], "_t": [r[2] for r in rows],
                      "_diff": [r[3] for r in rows], KEY_HASH: [weak_hash(r[0]) for r in rows]},
                     schema=TRACE_SCHEMA.append(pa.field(KEY_HASH, pa.int64())))
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    return str(path)


def prefix(rows, columns=(("k", Kind.LONG),)):
    names = [n for n, _ in columns]
    data = {n: [r[i] for r in rows] for i, n in enumerate(names)}
    data["_diff"] = [r[-1] for r in rows]
    data[PROBE_HASH] = [weak_hash(r[0]) for r in rows]
    data[PROBE_PART] = [0 for _ in rows]  # the files here are not named by partition: all are searched
    schema = (arrow_schema(list(columns) + [("_diff", Kind.LONG)]).append(pa.field(PROBE_HASH, pa.int64()))
              .append(pa.field(PROBE_PART, pa.int32())))
    return pa.Table.from_pydict(data, schema=schema)


def run(spec: Probe | ProbeChain, table: pa.Table) -> list[tuple]:
    chain = spec if isinstance(spec, ProbeChain) else ProbeChain([spec])
    out = pa.Table.from_batches(list(chain(iter(table.to_batches()))), schema=arrow_schema(chain.probes[-1].output))
    return sorted(tuple(r.values()) for r in out.to_pylist())


def probe(paths, local=(), how="inner", present=False, as_of=10, values=(("v", "w"),)):
    return Probe(files=[(Location(os.path.dirname(p)), os.path.basename(p)) for p in paths], local=list(local),
                 trace_schema=TRACE_SCHEMA,
                 prefix_columns=[("k", Kind.LONG), ("_diff", Kind.LONG)], hash_on=[("k", "e")],
                 join_on=[("k", "e")], values=list(values), as_of=as_of, how=how, present=present)


@pytest.fixture
def files(tmp_path):
    first = write_file(tmp_path / "a.arrow", [(1, "x", 1, 1), (2, "y", 1, 1), (3, "z", 2, 1), (4, "q", 3, 1)])
    second = write_file(tmp_path / "b.arrow", [(1, "x", 5, -1), (1, "x2", 5, 1), (7, "s", 6, 1)])
    return [first, second]


def test_inner_probe_matches_keys_not_hashes(files):
    # 1, 4 and 7 share a weak hash: only key 1's rows may match key 1
    assert run(probe(files), prefix([(1, 1)])) == [(1, 1, "x", -1), (1, 1, "x", 1), (1, 1, "x2", 1)]


def test_absent_keys_and_empty_prefix(files):
    assert run(probe(files), prefix([(99, 1)])) == []
    assert run(probe(files), prefix([])) == []
    assert run(probe([]), prefix([(1, 1)])) == []


def test_as_of_excludes_later_updates(files):
    assert run(probe(files, as_of=4), prefix([(1, 1)])) == [(1, 1, "x", 1)]


def test_present_consolidates_to_the_set(files):
    # (1, x) was added then retracted: only x2 is present
    assert run(probe(files, present=True), prefix([(1, 2)])) == [(1, 2, "x2", 1)]


def test_left_keeps_unmatched_prefix_rows_with_zero(files):
    assert run(probe(files, how="left", present=True), prefix([(1, 1), (5, -1)])) == [(1, 1, "x2", 1), (5, -1, None, 0)]


def test_semi_returns_each_matching_trace_row_once(files):
    rows = run(probe(files, how="semi", values=()), prefix([(3, 1), (3, 1), (4, 1)]))
    assert rows == [(3, 1), (4, 1)]


def test_local_batches_take_part(files):
    local = pa.Table.from_pydict({"e": [3, 8], "v": ["z", "n"], "_t": [7, 7], "_diff": [-1, 1]}, schema=TRACE_SCHEMA)
    assert run(probe(files, local=[local], present=True), prefix([(3, 1), (8, 1)])) == [(8, 1, "n", 1)]


def test_many_updates_of_one_key_in_one_file(tmp_path):
    # a cardinality-one value overwritten many times: only the last one is present
    rows = [(5, f"v{i}", i, 1) for i in range(200)] + [(5, f"v{i}", i + 1, -1) for i in range(199)]
    path = write_file(tmp_path / "c.arrow", rows)
    assert run(probe([path], present=True, as_of=1000), prefix([(5, 1)])) == [(5, 1, "v199", 1)]
    assert run(probe([path], present=True, as_of=50), prefix([(5, 1)])) == [(5, 1, "v50", 1)]


def test_string_and_instant_keys_of_any_content(tmp_path):
    columns = [("k", Kind.STRING)]
    schema = arrow_schema([("e", Kind.STRING), ("v", Kind.INSTANT), ("_t", Kind.LONG), ("_diff", Kind.LONG)])
    keys = ["", "a'b\"c", "x" * 100_000, "new\nline\ttab\\", "\u00e9\u4e2d\U0001F600", "\x00nul"]
    when = dt.datetime(2020, 1, 2, 3, 4, 5, 678901)
    table = pa.table({"e": keys, "v": [when] * len(keys), "_t": [1] * len(keys), "_diff": [1] * len(keys),
                      KEY_HASH: [weak_hash(k) for k in keys]}, schema=schema.append(pa.field(KEY_HASH, pa.int64())))
    table = table.sort_by(KEY_HASH)
    path = str(tmp_path / "s.arrow")
    with pa.ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)
    spec = Probe(files=[(Location(os.path.dirname(path)), os.path.basename(path))], local=[], trace_schema=schema, prefix_columns=columns + [("_diff", Kind.LONG)],
                 hash_on=[("k", "e")], join_on=[("k", "e")], values=[("v", "when")], as_of=5)
    got = run(spec, prefix([(k, 1) for k in keys] + [("absent", 1)], columns))
    assert got == sorted((k, 1, when, 1) for k in keys)


def test_a_chain_probes_the_product_of_the_probe_before(tmp_path):
    """Two probes in one chain (a path a->b->c through ``e -> v`` edges): the second one's
    prefix is the first one's output times its trace diffs, its key hashed in the task as
    Spark does (files sorted by that hash), sliced when large; equal to the two probes one
    after the other with the product taken in between."""
    schema = arrow_schema([("e", Kind.LONG), ("v", Kind.LONG), ("_t", Kind.LONG), ("_diff", Kind.LONG)])
    edges = [(1, 2, 1, 1), (1, 3, 1, 1), (2, 4, 1, 1), (2, 5, 1, 2), (3, 4, 1, 1), (3, 4, 2, -1), (4, 1, 1, 1),
             (-9, 6, 1, 1), (2 ** 62, -1, 1, 1)]
    table = pa.table({n: [r[i] for r in edges] for i, n in enumerate(schema.names)}, schema=schema)
    table = table.append_column(KEY_HASH, pa.array(long_hash([table.column("e")])))
    table = table.take(pa.array(sorted(range(len(edges)), key=lambda i: table.column(KEY_HASH)[i].as_py())))
    path = str(tmp_path / "edges.arrow")
    with pa.ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)

    def hop(columns, key):
        return Probe(files=[(Location(os.path.dirname(path)), os.path.basename(path))], local=[], trace_schema=schema,
                     prefix_columns=columns + [("_diff", Kind.LONG)], hash_on=[(key, "e")], join_on=[(key, "e")],
                     values=[("v", chr(ord(key) + 1))], as_of=5)

    first, second = hop([("a", Kind.LONG)], "a"), hop([("a", Kind.LONG), ("b", Kind.LONG)], "b")
    assert second.hashes_in_task()
    starts = pa.table({"a": [1, 2, -9, 7, None], "_diff": [1, 3, 1, 1, 1]})
    starts = starts.append_column(PROBE_HASH, pa.array(long_hash([starts.column("a")])))
    starts = starts.append_column(PROBE_PART, pa.array(long_partition_hash([starts.column("a")])))
    by_steps = []
    for a, d, b, t in run(first, starts):
        hashed = pa.table({"a": [a], "b": [b], "_diff": [d * t], PROBE_HASH: long_hash([pa.array([b])]),
                           PROBE_PART: long_partition_hash([pa.array([b])])})
        by_steps += run(second, hashed)
    for slice_rows in (1, 2, 1 << 20):
        assert run(ProbeChain([first, second], slice_rows), starts) == sorted(by_steps)
    assert sorted(by_steps) == sorted([(1, 2, 1, 4, 1), (1, 2, 1, 5, 2), (1, 3, 1, 4, 1), (1, 3, 1, 4, -1),
                                      (2, 4, 3, 1, 1)])


def test_tagged_probes_look_each_row_up_in_the_trace_its_tag_names(files):
    """Two traces in one task: the string trace of ``files`` and a local trace of longs. Each
    prefix row is looked up in its tag's trace only, its value lands in that trace's output
    column, the other value column is NULL; a tag without rows, a key in the other trace
    only and an absent key give nothing."""
    numbers = arrow_schema([("e", Kind.LONG), ("v", Kind.LONG), ("_t", Kind.LONG), ("_diff", Kind.LONG)])
    local = pa.Table.from_pydict({"e": [3, 9, 9], "v": [30, 90, 91], "_t": [1, 1, 20], "_diff": [1, 1, 1]},
                                 schema=numbers)

    def semi(files, local, schema):
        return Probe(files=[(Location(os.path.dirname(p)), os.path.basename(p)) for p in files], local=local,
                     trace_schema=schema, prefix_columns=[("e", Kind.LONG), ("_diff", Kind.LONG)],
                     hash_on=[("e", "e")], join_on=[("e", "e")], values=[("v", "v")], as_of=10, how="semi")

    probes = TaggedProbes({1: semi(files, [], TRACE_SCHEMA), 2: semi([], [local], numbers), 3: semi([], [], numbers)},
                          "a", {1: "vs", 2: "vl", 3: "vl"}, [("vl", Kind.LONG), ("vs", Kind.STRING)])
    rows = [(1, 1), (1, 3), (1, 9), (2, 9), (2, 4), (2, 3)]
    table = pa.table({"a": pa.array([r[0] for r in rows], pa.int32()), "e": [r[1] for r in rows],
                      "_diff": [1] * len(rows), PROBE_HASH: [weak_hash(r[1]) for r in rows],
                      PROBE_PART: pa.array([0] * len(rows), pa.int32())})
    out = pa.Table.from_batches(list(probes(iter(table.to_batches()))), schema=arrow_schema(probes.output))
    assert probes.output == [("a", Kind.LONG), ("e", Kind.LONG), ("vl", Kind.LONG), ("vs", Kind.STRING),
                             ("_tdiff", Kind.LONG)]
    assert sorted(tuple(r.values()) for r in out.to_pylist()) == [
        (1, 1, None, "x", -1), (1, 1, None, "x", 1), (1, 1, None, "x2", 1), (1, 3, None, "z", 1),
        (2, 3, 30, None, 1), (2, 9, 90, None, 1)]


def with_parameters(probes, table: pa.Table, at: int) -> list[pa.RecordBatch]:
    """``table``'s rows as a parameterized probe's input: one row of ``probes``' pickled
    parameters inserted before row ``at``, in batches of two rows."""
    parameters = pa.array([None] * at + [ParameterizedProbes.parameters_of(probes)] + [None] * (table.num_rows - at),
                          pa.binary())
    padded = {name: pa.concat_arrays([column.slice(0, at).combine_chunks(), pa.nulls(1, column.type),
                                      column.slice(at).combine_chunks()])
              for name, column in zip(table.column_names, table.columns)}
    return pa.table({**padded, PROBE_PARAMETERS: parameters}).to_batches(max_chunksize=2)


@pytest.mark.parametrize("at", [0, 3], ids=["parameters-first", "parameters-later"])
def test_parameterized_probes_take_their_files_local_batches_and_epoch_from_their_input(files, at):
    """A parameterized probe's function holds no files, local batches or epoch: it reads them
    from the one input row that carries them (wherever it comes), and probes the other rows
    as the probe it was made from does."""
    local = pa.Table.from_pydict({"e": [2, 5], "v": ["l2", "l5"], "_t": [4, 11], "_diff": [1, 1]}, schema=TRACE_SCHEMA)
    chain = ProbeChain([probe(files, local=[local], as_of=5)])
    table = prefix([(1, 1), (2, 1), (5, 1), (3, 2), (7, 1)])
    parameterized = ParameterizedProbes.of(chain)
    assert parameterized.probes.probes[0].parameters() == ([], [], 0)
    out = pa.Table.from_batches(list(parameterized(iter(with_parameters(chain, table, at)))),
                                schema=arrow_schema(chain.probes[-1].output))
    assert sorted(tuple(r.values()) for r in out.to_pylist()) == run(chain, table)
    assert run(chain, table) == [(1, 1, "x", -1), (1, 1, "x", 1), (1, 1, "x2", 1), (2, 1, "l2", 1), (2, 1, "y", 1),
                                 (3, 2, "z", 1)]  # 5's local row is after the epoch, 7's file row too
    lost = [b.filter(pc.is_null(b.column(PROBE_PARAMETERS))) for b in with_parameters(chain, table, at)]
    with pytest.raises(RuntimeError, match="no parameters"):
        list(parameterized(iter(lost)))


def test_long_hash_leaves_the_hash_as_it_is_at_a_null():
    with_null = long_hash([pa.array([5, 5]), pa.array([None, 7])])
    assert with_null[0] == long_hash([pa.array([5])])[0] and with_null[1] != with_null[0]


def test_a_probe_opens_only_the_files_of_the_partitions_its_keys_are_in(tmp_path, monkeypatch):
    """Files named ``part-<p>-of-<n>`` hold the rows whose key's Murmur3 hash is ``p`` modulo
    ``n``: a probe searches only the files its keys' partitions name; a batch with a file
    not so named is searched whole."""
    from factflow.arrangement import index

    schema = arrow_schema([("e", Kind.LONG), ("v", Kind.LONG), ("_t", Kind.LONG), ("_diff", Kind.LONG)])
    keys = list(range(40))
    partition = {k: int(long_partition_hash([pa.array([k])])[0]) % 4 for k in keys}
    for p in range(4):
        mine = sorted((k for k in keys if partition[k] == p), key=lambda k: long_hash([pa.array([k])])[0])
        table = pa.table({"e": mine, "v": [k * 10 for k in mine], "_t": [1] * len(mine), "_diff": [1] * len(mine)},
                         schema=schema)
        table = table.append_column(KEY_HASH, pa.array(long_hash([table.column("e")])))
        with pa.ipc.new_file(str(tmp_path / f"part-{p:05d}-of-00004.arrow"), table.schema) as writer:
            writer.write_table(table)
    opened = []
    real = index._open
    monkeypatch.setattr(index, "_open", lambda d, n, c: opened.append(n) or real(d, n, c))
    directory = Location(str(tmp_path))
    spec = Probe(files=[(directory, f"part-{p:05d}-of-00004.arrow") for p in range(4)], local=[], trace_schema=schema,
                 prefix_columns=[("k", Kind.LONG), ("_diff", Kind.LONG)], hash_on=[("k", "e")], join_on=[("k", "e")],
                 values=[("v", "w")], as_of=5)
    wanted = [k for k in keys if partition[k] == 2][:3]
    starts = pa.table({"k": wanted, "_diff": [1] * len(wanted)})
    starts = starts.append_column(PROBE_HASH, pa.array(long_hash([starts.column("k")])))
    starts = starts.append_column(PROBE_PART, pa.array(long_partition_hash([starts.column("k")])))
    assert run(spec, starts) == sorted((k, 1, k * 10, 1) for k in wanted)
    assert opened == ["part-00002-of-00004.arrow"]
    opened.clear()
    (tmp_path / "part-00003-of-00004.arrow").rename(tmp_path / "part-00003.arrow")  # one file not so named
    spec.files[3] = (directory, "part-00003.arrow")
    assert run(spec, starts) == sorted((k, 1, k * 10, 1) for k in wanted)
    assert len(opened) == 4


def test_the_partition_hash_is_sparks(spark):
    """``long_partition_hash`` equals Spark's ``hash`` of LONG columns, nulls included, and
    so the partition hash partitioning puts a row in."""
    rows = [(1, 2), (-1, None), (2**62, -(2**63)), (0, 0), (None, 5), (123456789012, 987654321)]
    frame = spark.createDataFrame(rows, "a long, b long")
    expected = [r[0] for r in frame.selectExpr("hash(a, b)").collect()]
    table = pa.table({"a": [r[0] for r in rows], "b": [r[1] for r in rows]}, schema=pa.schema(
        [("a", pa.int64()), ("b", pa.int64())]))
    assert list(long_partition_hash([table.column("a"), table.column("b")])) == expected


def test_an_evaluation_persists_the_probes_its_statement_reads_more_than_once(spark):
    """A probe whose view another probe's prefix reads, and the statement reads too, is
    persisted for the evaluation (so it runs once); one read once is not; releasing the
    evaluation unpersists it and drops the views."""
    from factflow.arrangement.bound import analysed_views
    from factflow.dataflow.context import EpochContext

    def same(batches):
        yield from batches

    cx = EpochContext(1, spark, small=True)
    first = spark.range(10).mapInArrow(same, "id long")
    below = cx.register(first)
    second = spark.sql(f"SELECT * FROM {below} WHERE id > 2").mapInArrow(same, "id long")
    above = cx.register(second)
    statement = spark.sql(f"SELECT * FROM {below} UNION ALL SELECT * FROM {above}")
    cx.persist_shared(lambda: analysed_views(statement))
    assert first.is_cached and not second.is_cached
    assert statement._jdf.queryExecution().executedPlan().toString().count("InMemoryTableScan") == 2
    assert sorted(r.id for r in statement.collect()) == sorted(list(range(10)) + list(range(3, 10)))
    cx.release()
    assert not first.is_cached
    assert not any(spark.catalog.tableExists(view) for view in (below, above))
