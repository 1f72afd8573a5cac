"""The engine's tuning knobs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    """Tuning knobs.

    ``local_limit``: change sets and merged batches of at most this many rows are held on
    the driver and shipped to Spark as local relations; larger ones are checkpointed in Spark.
    ``merge_factor``: geometric merging factor of traces. ``merge_limit``: rows one merge
    may read before it stops growing, unless an eighth of the trace is more (no round then
    rewrites a large trace whole; see :meth:`factflow.arrangement.trace.Trace.merge_cap`).
    ``partitions``: partitions of checkpointed batches (default:
    ``spark.sql.shuffle.partitions``). ``small_conf``: SQL
    settings for the statements of small epochs, whose cost is Spark's fixed overhead per
    task and per compiled stage rather than data (one shuffle partition, no broadcast joins:
    each broadcast is a Spark job of its own; no generated code, neither whole-stage nor per
    expression: generating the code of a statement's projections, orderings and
    aggregations cost its one task more than its rows, and interpreting them made a
    1-change epoch with five LDBC queries 0.6x as long, docs/benchmarks.md); they
    apply only while such a statement is planned and run. With the statement's subqueries in one
    partition each (:class:`factflow.dataflow.statement.Statement`), two more keep the
    statement free of shuffles: inputs in one partition are joined where they are however
    large Spark estimates them (``maxSinglePartitionBytes``), and the optimizer does not
    push semi joins below the coalescing of a subquery (which would leave a local relation
    of several partitions under a join). Spark's check of every optimizer rule's result
    (``lightweightPlanChangeValidation``, a guard against Spark's own bugs) is off: a small
    epoch's statement over 22 TPC-H queries has about a thousand subqueries, and the check
    took a quarter of the time Spark spent planning such statements.
    ``fetch_limit``: the most rows one fetch brings to the driver (a round of a small
    epoch's queries, or an iteration of recursive rules), shared equally by the relations
    it fetches. In a small epoch, an operator whose rows exceed its share is checkpointed in
    Spark instead, as in a bulk epoch (``EpochReport.kept_in_spark`` names it); a recursive
    set over its share is kept in Spark as files and the component iterates there (see
    :meth:`factflow.engine.evaluation.Evaluation.collect`). The sets a recursive
    component holds on the driver, over all its iterations, stay within it together. It
    is also the most rows a subscriber receives in one call: a query's changes in an
    epoch beyond it come in chunks (see :meth:`factflow.Query.subscribe`). The default keeps a fetch well
    within a 2 GiB driver heap (measured in :mod:`factflow.engine.evaluation`).
    ``recompute_fraction``: a recursive component whose delete-and-rederive overdeletes more
    than this fraction of the tuples it holds is derived again from scratch instead (see
    :meth:`factflow.dataflow.recursion.Fixpoint.run`).

    ``overlap_merges``: merges that need Spark run in the background after an epoch's
    delivery (see :mod:`factflow.engine.maintenance`); by default the next epoch or install
    waits for them before it starts, so they use the time between commands and never
    compete with an epoch for task slots. ``True`` lets them run beside the next epoch
    (at most one round behind): on this 2-core machine that cut the triangle benchmark's
    slow tail but made a 100-change two-hop epoch slower to its results
    (docs/benchmarks.md, "Maintenance in the background").

    ``reuse_plans``: small epochs bind their driver-held rows to slots that a kept plan
    reads when it runs, so that a statement of a shape seen before is not planned again
    (see :mod:`factflow.arrangement.bound`; needs Spark's local mode and factflow's jar on
    the driver's class path, as factflow's own sessions have it). ``False`` plans every
    statement anew.

    ``guess_changes``: a small transaction that installed queries read is appended as the
    effective changes it usually is (new facts asserted, present ones retracted), and its
    queries' job checks that guess, so the epoch is one Spark job instead of two; a wrong
    guess is rolled back and the epoch run again (see :mod:`factflow.engine.speculation`).
    ``False`` computes the effective changes first, in a job of their own.

    Durable engines (``Engine(state_dir=...)``, see :mod:`factflow.engine.durability`):
    a checkpoint is written in the background once ``checkpoint_interval`` epochs (0: only
    when :meth:`factflow.Engine.checkpoint` is called) or ``checkpoint_log_bytes`` bytes of
    log have accumulated since the last one, whichever comes first; restarts replay at most
    that much log. ``offset_history``: offsets remembered per source with the epoch that
    applied them (see :mod:`factflow.engine.offsets`).

    ``index_cache_bytes``: when the state directory is on an object store, the index files
    probes open are copied to each executor's local disk once, and at most this many bytes
    of copies are kept there (least recently used out; see :mod:`factflow.storage.cache`).
    """

    local_limit: int = 20_000
    merge_factor: int = 2
    merge_limit: int = 1_000_000
    partitions: int | None = None
    small_conf: tuple[tuple[str, str], ...] = (
        ("spark.sql.shuffle.partitions", "1"),
        ("spark.sql.codegen.wholeStage", "false"),
        ("spark.sql.codegen.factoryMode", "NO_CODEGEN"),
        ("spark.sql.autoBroadcastJoinThreshold", "-1"),
        ("spark.sql.maxSinglePartitionBytes", str(2**62)),
        ("spark.sql.lightweightPlanChangeValidation", "false"),
        ("spark.sql.optimizer.excludedRules", "org.apache.spark.sql.catalyst.optimizer.PushDownLeftSemiAntiJoin,"
                                              "org.apache.spark.sql.catalyst.optimizer.PushLeftSemiLeftAntiThroughJoin"),
    )
    fetch_limit: int = 1_000_000
    recompute_fraction: float = 0.5
    overlap_merges: bool = False
    reuse_plans: bool = True
    guess_changes: bool = True
    checkpoint_interval: int = 1000
    checkpoint_log_bytes: int = 64 << 20
    offset_history: int = 10_000
    index_cache_bytes: int = 4 << 30
