package factflow.jvm;

import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;

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
import org.apache.spark.sql.Row;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.execution.LocalTableScanExec;
import org.apache.spark.sql.execution.SortExec;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.arrow.ArrowBatchStreamWriter;
import org.apache.spark.sql.execution.datasources.v2.BatchScanExec;
import org.apache.spark.sql.execution.python.MapInArrowExec;
import org.apache.spark.sql.internal.SQLConf;

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
 * one of its executor's. A plan that reads anything else (files, cached or stored data), runs
 * other Python, shuffles or broadcasts is not run here.
 */
public final class DriverRun {
  /** Attempt ids of driver-run tasks: negative, so they never meet a real task's. */
  private static final AtomicLong ATTEMPTS = new AtomicLong();

  private DriverRun() {}

  /**
   * What {@link #collect} computed: the file holding its rows as an Arrow IPC stream (schema
   * first; the caller deletes it), and the rows its scans read. A file, not a byte array:
   * Py4J took 43 ms to hand the driver a result of 7.5 KB.
   */
  public static final class Collected {
    private final String file;
    private final long rowsRead;

    Collected(String file, long rowsRead) {
      this.file = file;
      this.rowsRead = rowsRead;
    }

    /** The file holding the statement's rows as an Arrow IPC stream. */
    public String file() { return file; }

    /** The rows its scans of bound rows read, as a job's input records would count them. */
    public long rowsRead() { return rowsRead; }
  }

  /**
   * The rows of {@code frame} computed in this JVM, written to a new file under
   * {@code directory}; null when its plan reads anything but bound and literal rows, or
   * needs an exchange (its own, as a limit over several partitions has), a subquery or Python
   * other than {@code mapInArrow}.
   */
  public static Collected collect(Dataset<Row> frame, String directory) throws IOException, SparkException {
    SparkPlan plan = frame.queryExecution().executedPlan();
    if (!local(plan)) {
      return null;
    }
    SQLConf conf = frame.sparkSession().sessionState().conf();
    RDD<byte[]> batches = frame.toArrowBatchRdd(plan);
    Properties properties = new Properties();
    properties.putAll(frame.sparkSession().sparkContext().getLocalProperties());
    scala.jdk.javaapi.CollectionConverters.asJava(conf.getAllConfs()).forEach(properties::setProperty);
    Partition[] partitions = batches.partitions();
    Path file = Files.createTempFile(Path.of(directory), "factflow-driver-run-", ".arrow");
    long read = 0;
    try (OutputStream out = new BufferedOutputStream(Files.newOutputStream(file), 64 * 1024)) {
      ArrowBatchStreamWriter writer = new ArrowBatchStreamWriter(frame.schema(), out, conf.sessionLocalTimeZone(),
          "legacy".equals(conf.pandasStructHandlingMode()), conf.arrowUseLargeVarTypes());
      for (Partition partition : partitions) {
        read += run(batches, partition, partitions.length, properties, writer);
      }
      writer.end();
    } catch (IOException | SparkException | RuntimeException | Error e) {
      Files.deleteIfExists(file);
      throw e;
    } finally {
      forgetSorters(plan);
    }
    return new Collected(file.toString(), read);
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
   * Compute one partition of {@code batches} under a task context of its own, writing its
   * batches; returns the rows its scans read.
   */
  private static long run(RDD<byte[]> batches, Partition partition, int partitions, Properties properties,
                          ArrowBatchStreamWriter writer) throws SparkException {
    long attempt = -ATTEMPTS.incrementAndGet();
    SparkEnv env = SparkEnv.get();
    TaskMemoryManager memory = new TaskMemoryManager(env.memoryManager(), attempt);
    TaskContextImpl context = new TaskContextImpl(0, 0, partition.index(), attempt, 0, partitions, memory,
        properties, env.metricsSystem(), TaskMetrics$.MODULE$.empty(), 1,
        scala.collection.immutable.Map$.MODULE$.empty());
    TaskContext previous = TaskContext.get();
    TaskContext$.MODULE$.setTaskContext(context);
    Throwable failure = null;
    try {
      writer.writeBatches(batches.iterator(partition, context));
      return context.taskMetrics().inputMetrics().recordsRead();
    } catch (RuntimeException | Error e) {
      failure = e;
      context.markTaskFailed(e);
      if (e instanceof PythonException) {  // wrapped as a failed job wraps it: PySpark raises a PythonException
        throw new SparkException("A Python function failed in a statement run on the driver", e);
      }
      throw e;
    } finally {
      try {
        context.markTaskCompleted(scala.Option.apply(failure));
      } finally {
        memory.cleanUpAllAllocatedMemory();
        if (previous == null) {
          TaskContext$.MODULE$.unset();
        } else {
          TaskContext$.MODULE$.setTaskContext(previous);
        }
      }
    }
  }

  /**
   * Whether {@code plan} reads only bound and literal rows through narrow operators of the JVM
   * and Python functions mapped over Arrow batches.
   */
  private static boolean local(SparkPlan plan) {
    if (!plan.subqueries().isEmpty()) {
      return false;
    }
    if (plan instanceof MapInArrowExec) {
      return local(plan.children().head());
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
