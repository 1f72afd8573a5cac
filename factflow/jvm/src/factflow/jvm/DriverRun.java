package factflow.jvm;

import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.Dependency;
import org.apache.spark.Partition;
import org.apache.spark.SparkException;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.TaskContext$;
import org.apache.spark.TaskContextImpl;
import org.apache.spark.api.python.PythonException;
import org.apache.spark.executor.TaskMetrics$;
import org.apache.spark.memory.TaskMemoryManager;
import org.apache.spark.rdd.RDD;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection$;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.plans.physical.SinglePartition$;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.execution.ColumnarToRowExec;
import org.apache.spark.sql.execution.LocalTableScanExec;
import org.apache.spark.sql.execution.RDDScanExec;
import org.apache.spark.sql.execution.SortExec;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.arrow.ArrowBatchStreamWriter;
import org.apache.spark.sql.execution.columnar.InMemoryTableScanExec;
import org.apache.spark.sql.execution.datasources.v2.BatchScanExec;
import org.apache.spark.sql.execution.exchange.Exchange;
import org.apache.spark.sql.execution.exchange.ReusedExchangeExec;
import org.apache.spark.sql.execution.exchange.ShuffleExchangeExec;
import org.apache.spark.sql.execution.python.MapInArrowExec;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.CallSite$;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * Runs a small statement's plan in the driver's JVM, as one task would, without a Spark job.
 *
 * <p>A small epoch's statement reads only rows the driver holds: slots of bound rows
 * ({@link BoundRows}) and literal rows. Spark would still ship it as a job of one task to an
 * executor, which on a cluster deserializes a plan of a few hundred operators in a JVM that
 * runs a handful of tasks a second. {@link #collect} computes the same partitions here, under a
 * task context of its own (memory from the driver's memory manager, the session's SQL settings
 * as the task's properties), and writes the rows as an Arrow IPC stream, as
 * {@code collectAsArrowToPython} would send them, to a file the driver's Python reads. A
 * Python function mapped over Arrow batches ({@code mapInArrow}: factflow's probes of index
 * files, keyed by bound rows) runs in a Python worker of the driver's, as a task's would run in
 * one of its executor's. The parts a statement computes once and reads again are computed
 * here once at each run: an exchange into one partition (a subquery the statement reads more
 * than once, read again through Spark's reuse of the exchange) and a cached relation (a probe
 * the statement persists; its cache is never filled). So a plan kept and run again here reads
 * its inputs' new rows everywhere, where a job would reuse the first run's shuffle output and
 * a cache would hold the first run's rows. A plan that reads anything else (files, stored
 * data), runs other Python, shuffles into several partitions or broadcasts is not run here.
 *
 * <p>A plan is prepared to run here once ({@link Prepared}: its RDDs built, each part it
 * computes once read through rows each run fills) and run again from that, so a plan kept for
 * later epochs pays Spark's building of its RDDs once.
 */
public final class DriverRun {
  /**
   * Attempt ids of driver-run tasks: negative, so they never meet a real task's, and far below
   * the id the block manager gives writers outside tasks (-1024; counting down from -1, the
   * 1,024th run took it, and releasing its locks unregistered every such writer).
   */
  private static final AtomicLong ATTEMPTS = new AtomicLong(-(1L << 40));
  /** The local properties that name where an RDD is made (read instead of a stack trace). */
  private static final String CALL_SITE_SHORT = CallSite$.MODULE$.SHORT_FORM();
  private static final String CALL_SITE_LONG = CallSite$.MODULE$.LONG_FORM();
  private static final ClassTag<InternalRow> ROW = ClassTag$.MODULE$.apply(InternalRow.class);

  private DriverRun() {}

  /**
   * What a run computed: the file holding its rows as an Arrow IPC stream (schema first; the
   * caller deletes it), the rows its scans read, and the prepared plan that runs it again. A
   * file, not a byte array: Py4J took 43 ms to hand the driver a result of 7.5 KB.
   */
  public static final class Collected {
    private final String file;
    private final long rowsRead;
    private final Prepared prepared;

    Collected(String file, long rowsRead, Prepared prepared) {
      this.file = file;
      this.rowsRead = rowsRead;
      this.prepared = prepared;
    }

    /** The file holding the statement's rows as an Arrow IPC stream. */
    public String file() { return file; }

    /** The rows its scans of bound rows read, as a job's input records would count them. */
    public long rowsRead() { return rowsRead; }

    /** The prepared plan that computed these rows, to run again with the rows then bound. */
    public Prepared prepared() { return prepared; }
  }

  /**
   * The rows of {@code frame} computed in this JVM ({@link Prepared#collect}), its plan
   * prepared for this run; null when the plan reads anything but bound and literal rows
   * (cached relations of such rows included), or needs an exchange into several partitions
   * (its own, as a limit over several partitions has), a subquery or Python other than
   * {@code mapInArrow}; null too as soon as the parts it computes once come to more than
   * {@code heldBytes}.
   */
  public static Collected collect(Dataset<Row> frame, String directory, long heldBytes)
      throws IOException, SparkException {
    SparkPlan plan = frame.queryExecution().executedPlan();
    return local(plan) ? new Prepared(frame, plan).collect(directory, heldBytes) : null;
  }

  /** A run's parts computed once came to more than it may hold. */
  private static final class TooLarge extends RuntimeException {
    private static final long serialVersionUID = 1L;

    TooLarge() {
      super("the parts a statement computes once are too large to hold on the driver", null, false, false);
    }
  }

  /** What a task does with the rows of its partition. */
  private interface PartitionConsumer<T> {
    void accept(scala.collection.Iterator<T> rows);
  }

  /**
   * A plan made ready to run here any number of times: its RDDs built once, each part it
   * computes once per run (an exchange into one partition, a cached relation) read through a
   * {@link HeldRows} that the run fills before anything reads it.
   *
   * <p>Building a plan's RDDs is most of what running a large plan again would cost: Spark
   * cleans and test-serializes the closure of every operator that zips its inputs (a
   * sort-merge join's holds the whole plan below it) and generates each stage's code anew.
   * Kept with its plan, a prepared plan pays that once. Runs of one prepared plan take turns.
   */
  public static final class Prepared {
    private final SparkContext context;
    private final SQLConf conf;
    private final StructType schema;
    /** The parts a run computes, in an order where each comes after those it reads. */
    private final List<Part> parts = new ArrayList<>();
    private final Map<Exchange, HeldRows> exchanges = new IdentityHashMap<>();
    private final Map<Object, CachedPart> caches = new IdentityHashMap<>();
    /** Every plan whose RDDs a run computes (sorts keep their sorters in them). */
    private final List<SparkPlan> plans = new ArrayList<>();
    private final RDD<byte[]> batches;

    Prepared(Dataset<Row> frame, SparkPlan plan) throws SparkException {
      context = frame.sparkSession().sparkContext();
      conf = frame.sparkSession().sessionState().conf();
      schema = frame.schema();
      String[] site = namedCallSite(context);
      try {
        SparkPlan computable = computable(plan);
        plans.add(computable);
        batches = frame.toArrowBatchRdd(computable);
      } finally {
        restoreCallSite(context, site);
      }
    }

    /**
     * The rows of the plan computed here, with the rows bound now, written to a new file under
     * {@code directory}; null as soon as the parts it computes once come to more than
     * {@code heldBytes} (nothing is left of the run). A job would keep those parts in Spark's
     * memory, which spills to disk; held here, they take the heap.
     */
    public synchronized Collected collect(String directory, long heldBytes) throws IOException, SparkException {
      Properties properties = new Properties();
      properties.putAll(context.getLocalProperties());
      scala.jdk.javaapi.CollectionConverters.asJava(conf.getAllConfs()).forEach(properties::setProperty);
      Run run = new Run(properties, heldBytes);
      Path file = Files.createTempFile(Path.of(directory), "factflow-driver-run-", ".arrow");
      String[] site = namedCallSite(context);
      try (OutputStream out = new BufferedOutputStream(Files.newOutputStream(file), 64 * 1024)) {
        for (Part part : parts) {
          part.fill(run);
        }
        ArrowBatchStreamWriter writer = new ArrowBatchStreamWriter(schema, out, conf.sessionLocalTimeZone(),
            "legacy".equals(conf.pandasStructHandlingMode()), conf.arrowUseLargeVarTypes());
        Partition[] partitions = batches.partitions();
        for (Partition partition : partitions) {
          run.task(batches, partition, partitions.length, writer::writeBatches);
        }
        writer.end();
      } catch (TooLarge e) {
        Files.deleteIfExists(file);
        return null;
      } catch (IOException | SparkException | RuntimeException | Error e) {
        Files.deleteIfExists(file);
        throw e;
      } finally {
        restoreCallSite(context, site);
        parts.forEach(Part::clear);
        plans.forEach(DriverRun::forgetSorters);
      }
      return new Collected(file.toString(), run.read, this);
    }

    /**
     * {@code plan} with each exchange into one partition, each reuse of one, and each scan of
     * a cached relation replaced by a scan of rows a run computes here (once per exchange or
     * cache), those parts noted in the order a run computes them.
     */
    private SparkPlan computable(SparkPlan plan) throws SparkException {
      InMemoryTableScanExec cached = cachedScan(plan);
      if (plan instanceof ShuffleExchangeExec || plan instanceof ReusedExchangeExec) {
        Exchange exchange = plan instanceof ReusedExchangeExec reused ? reused.child() : (Exchange) plan;
        HeldRows rows = exchanges.get(exchange);
        if (rows == null) {
          SparkPlan source = computable(exchange.child());
          rows = new HeldRows(context, 1);
          parts.add(new ExchangePart(sourceOf(source), rows));
          exchanges.put(exchange, rows);
        }
        return new RDDScanExec(plan.output(), rows, "rows computed on the driver", plan.outputPartitioning(),
            plan.outputOrdering(), scala.Option.empty());
      }
      if (cached != null) {
        return scanOfComputed(cached);
      }
      List<SparkPlan> children = new ArrayList<>();
      boolean changed = false;
      scala.collection.Iterator<SparkPlan> it = plan.children().iterator();
      while (it.hasNext()) {
        SparkPlan child = it.next();
        SparkPlan replaced = computable(child);
        changed |= replaced != child;
        children.add(replaced);
      }
      return changed ? plan.withNewChildren(scala.jdk.javaapi.CollectionConverters.asScala(children).toSeq()) : plan;
    }

    /**
     * A scan of the rows of {@code scan}'s cached relation, computed by a run (once per cache):
     * its columns, in its partitions, and said to be partitioned and ordered as the scan says
     * its rows are. Operators above it rely on that: a union of inputs partitioned alike keeps
     * their partitions, so an aggregate over it needs no exchange. (Said to be partitioned
     * otherwise, such a union gave two partitions, and TPC-H's Q13 at scale factor 0.1 counted
     * a customer's orders in each.)
     */
    private SparkPlan scanOfComputed(InMemoryTableScanExec scan) throws SparkException {
      CachedPart part = caches.get(scan.relation().cacheBuilder());
      if (part == null) {
        part = new CachedPart(sourceOf(computable(scan.relation().cachedPlan())));
        parts.add(part);
        caches.put(scan.relation().cacheBuilder(), part);
      }
      @SuppressWarnings("unchecked")
      UnsafeProjection columns = UnsafeProjection$.MODULE$.create(
          (scala.collection.immutable.Seq<Expression>) (scala.collection.immutable.Seq<?>) scan.attributes(),
          scan.relation().output());
      HeldRows rows = new HeldRows(context, part.source.partitions().length);
      part.scans.add(new ScanOfPart(rows, columns));
      return new RDDScanExec(scan.output(), rows, "rows computed on the driver", scan.outputPartitioning(),
          scan.outputOrdering(), scala.Option.empty());
    }

    /** The RDD of {@code plan}, a part's source, noted among the plans a run computes. */
    private RDD<InternalRow> sourceOf(SparkPlan plan) {
      plans.add(plan);
      return plan.execute();
    }
  }

  /** A part of a plan that a run computes once, before the operators that read it. */
  private interface Part {
    /** Compute this part's rows for {@code run} and hand them to the scans that read them. */
    void fill(Run run) throws SparkException;

    /** Let go of the rows the last run computed. */
    void clear();
  }

  /** An exchange into one partition: its input's rows, all partitions in one. */
  private record ExchangePart(RDD<InternalRow> source, HeldRows rows) implements Part {
    @Override
    public void fill(Run run) throws SparkException {
      List<InternalRow> all = new ArrayList<>();
      run.partitionsOf(source).forEach(all::addAll);
      rows.hold(List.of(all));
    }

    @Override
    public void clear() {
      rows.hold(null);
    }
  }

  /** A scan of a cached relation's rows: where its columns go, and how it takes them. */
  private record ScanOfPart(HeldRows rows, UnsafeProjection columns) {}

  /** A cached relation: its plan's rows by partition, projected for each scan of it. */
  private static final class CachedPart implements Part {
    final RDD<InternalRow> source;
    final List<ScanOfPart> scans = new ArrayList<>();

    CachedPart(RDD<InternalRow> source) {
      this.source = source;
    }

    @Override
    public void fill(Run run) throws SparkException {
      List<List<InternalRow>> parts = run.partitionsOf(source);
      for (ScanOfPart scan : scans) {
        List<List<InternalRow>> projected = new ArrayList<>(parts.size());
        for (List<InternalRow> part : parts) {
          List<InternalRow> rows = new ArrayList<>(part.size());
          for (InternalRow row : part) {
            rows.add(run.hold(scan.columns().apply(row).copy()));
          }
          projected.add(rows);
        }
        scan.rows().hold(projected);
      }
    }

    @Override
    public void clear() {
      scans.forEach(scan -> scan.rows().hold(null));
    }
  }

  /**
   * Rows a run of a prepared plan computes and its operators read, in a fixed number of
   * partitions: an RDD built once with the plan, filled anew by each run.
   */
  private static final class HeldRows extends RDD<InternalRow> {
    private static final long serialVersionUID = 1L;
    private final int count;
    /** The current run's rows by partition; null between runs. */
    private transient List<List<InternalRow>> rows;

    @SuppressWarnings("unchecked")
    HeldRows(SparkContext context, int count) {
      super(context, (scala.collection.immutable.Seq<Dependency<?>>) (Object) scala.collection.immutable.Nil$.MODULE$,
          ROW);
      this.count = count;
    }

    void hold(List<List<InternalRow>> rows) {
      if (rows != null && rows.size() != count) {
        throw new IllegalStateException("a part computed on the driver gave " + rows.size()
            + " partitions where its plan has " + count);
      }
      this.rows = rows;
    }

    @Override
    public scala.collection.Iterator<InternalRow> compute(Partition partition, TaskContext task) {
      if (rows == null) {
        throw new IllegalStateException("rows computed on the driver were read outside their run");
      }
      return scala.jdk.javaapi.CollectionConverters.asScala(rows.get(partition.index()).iterator());
    }

    @Override
    public Partition[] getPartitions() {
      Partition[] partitions = new Partition[count];
      for (int i = 0; i < count; i++) {
        partitions[i] = new Index(i);
      }
      return partitions;
    }
  }

  /** A partition of {@link HeldRows}: its index. */
  private record Index(int index) implements Partition {}

  /** One run of a prepared plan: its tasks' properties, the rows its scans read and the bytes it holds. */
  private static final class Run {
    private final Properties properties;
    private final long heldBytes;
    private long read;
    private long held;

    Run(Properties properties, long heldBytes) {
      this.properties = properties;
      this.heldBytes = heldBytes;
    }

    /** {@code row}, now held by this run; {@link TooLarge} past the bytes it may hold. */
    InternalRow hold(InternalRow row) {
      held += (row instanceof UnsafeRow unsafe ? unsafe.getSizeInBytes() : 64) + 16;
      if (held > heldBytes) {
        throw new TooLarge();
      }
      return row;
    }

    /** The rows of {@code rdd}, computed here partition by partition, by partition. */
    List<List<InternalRow>> partitionsOf(RDD<InternalRow> rdd) throws SparkException {
      Partition[] partitions = rdd.partitions();
      List<List<InternalRow>> parts = new ArrayList<>();
      for (Partition partition : partitions) {
        List<InternalRow> rows = new ArrayList<>();
        task(rdd, partition, partitions.length, it -> {
          while (it.hasNext()) {
            rows.add(hold(it.next().copy()));
          }
        });
        parts.add(rows);
      }
      return parts;
    }

    /**
     * Compute one partition of {@code rdd} under a task context of its own, handing its rows
     * to {@code consume}, and count the rows its scans read.
     */
    <T> void task(RDD<T> rdd, Partition partition, int partitions, PartitionConsumer<T> consume)
        throws SparkException {
      long attempt = ATTEMPTS.decrementAndGet();
      SparkEnv env = SparkEnv.get();
      TaskMemoryManager memory = new TaskMemoryManager(env.memoryManager(), attempt);
      TaskContextImpl task = new TaskContextImpl(0, 0, partition.index(), attempt, 0, partitions, memory,
          properties, env.metricsSystem(), TaskMetrics$.MODULE$.empty(), 1,
          scala.collection.immutable.Map$.MODULE$.empty());
      TaskContext previous = TaskContext.get();
      TaskContext$.MODULE$.setTaskContext(task);
      // as an executor registers a task: memory it needs may evict cached blocks, which takes
      // their locks for the task (an unregistered one failed with a NullPointerException)
      env.blockManager().registerTask(attempt);
      Throwable failure = null;
      try {
        consume.accept(rdd.iterator(partition, task));
        read += task.taskMetrics().inputMetrics().recordsRead();
      } catch (RuntimeException | Error e) {
        failure = e;
        task.markTaskFailed(e);
        if (e instanceof PythonException) {  // wrapped as a failed job wraps it: PySpark raises a PythonException
          throw new SparkException("A Python function failed in a statement run on the driver", e);
        }
        throw e;
      } finally {
        try {
          task.markTaskCompleted(scala.Option.apply(failure));
        } finally {
          memory.cleanUpAllAllocatedMemory();
          env.blockManager().releaseAllLocksForTask(attempt);
          if (previous == null) {
            TaskContext$.MODULE$.unset();
          } else {
            TaskContext$.MODULE$.setTaskContext(previous);
          }
        }
      }
    }
  }

  /**
   * Name where the RDDs built from here on are made, returning what was named before: every
   * RDD records that, and unnamed reads it off a stack trace of this thread (a fifth of a
   * TPC-H Q19 epoch's time, building 5,000 operators' RDDs).
   */
  private static String[] namedCallSite(SparkContext context) {
    String[] before = {context.getLocalProperty(CALL_SITE_SHORT), context.getLocalProperty(CALL_SITE_LONG)};
    context.setLocalProperty(CALL_SITE_SHORT, "factflow DriverRun");
    context.setLocalProperty(CALL_SITE_LONG, "factflow DriverRun");
    return before;
  }

  /** Name again the call site {@link #namedCallSite} found. */
  private static void restoreCallSite(SparkContext context, String[] site) {
    context.setLocalProperty(CALL_SITE_SHORT, site[0]);
    context.setLocalProperty(CALL_SITE_LONG, site[1]);
  }

  /**
   * Drop the sorters a run left in {@code plan}'s sorts. A task's sort keeps its sorter in a
   * field of its own copy of the plan; run here, that is the driver's plan, which must stay
   * serializable (a thread-local is not) and should not hold the sorter until the next run.
   */
  private static void forgetSorters(SparkPlan plan) {
    if (plan instanceof SortExec sort) {
      sort.rowSorter_$eq(null);
    }
    scala.collection.Iterator<SparkPlan> children = plan.children().iterator();
    while (children.hasNext()) {
      forgetSorters(children.next());
    }
  }

  /**
   * The scan of a cached relation that {@code plan} reads as rows: the plan itself, or the
   * scan under a conversion of its batches to rows; null for any other plan.
   */
  private static InMemoryTableScanExec cachedScan(SparkPlan plan) {
    if (plan instanceof InMemoryTableScanExec scan) {
      return scan;
    }
    if (plan instanceof ColumnarToRowExec rows && rows.child() instanceof InMemoryTableScanExec scan) {
      return scan;
    }
    return null;
  }

  /**
   * Whether {@code plan} reads only bound and literal rows through narrow operators of the JVM,
   * Python functions mapped over Arrow batches, exchanges into one partition and cached
   * relations whose plans are such.
   */
  private static boolean local(SparkPlan plan) {
    if (!plan.subqueries().isEmpty()) {
      return false;
    }
    if (plan instanceof MapInArrowExec) {
      return local(plan.children().head());
    }
    if (plan instanceof ShuffleExchangeExec exchange) {
      return SinglePartition$.MODULE$.equals(exchange.outputPartitioning()) && local(exchange.child());
    }
    if (plan instanceof ReusedExchangeExec reused) {
      return reused.child() instanceof ShuffleExchangeExec && local(reused.child());
    }
    InMemoryTableScanExec cached = cachedScan(plan);
    if (cached != null) {
      return local(cached.relation().cachedPlan());
    }
    String name = plan.getClass().getSimpleName();
    if (name.contains("Exchange") || name.contains("Adaptive") || name.contains("Python")
        || name.contains("Arrow") || name.contains("InPandas") || name.contains("InBatch")
        || name.contains("QueryStage") || name.contains("Subquery") || name.contains("Cache")
        || name.contains("InMemory") || name.contains("CollectLimit") || name.contains("CollectTail")
        || name.contains("TakeOrdered")) {
      return false;  // the last three gather their child's partitions through a shuffle of their own
    }
    if (plan.children().isEmpty()) {
      if (plan instanceof LocalTableScanExec) {
        return true;
      }
      return plan instanceof BatchScanExec scan && scan.scan().description().startsWith(BoundRows.DESCRIPTION);
    }
    scala.collection.Iterator<SparkPlan> children = plan.children().iterator();
    while (children.hasNext()) {
      if (!local(children.next())) {
        return false;
      }
    }
    return true;
  }
}
