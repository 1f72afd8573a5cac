package factflow.jvm;

import java.util.Collections;

import org.apache.spark.api.java.JavaSparkContext;

/**
 * The class loader Spark's tasks run under, for driver threads to share in local mode.
 *
 * <p>Spark caches the classes it compiles from generated code by source <em>and</em> by the
 * compiling thread's context class loader. The driver compiles each whole-stage class when it
 * plans the stage, and the first task to run the stage compiles it again; in local mode both
 * run in this JVM, but a task runs under its executor's class loader, not the driver thread's,
 * so each class was compiled twice. A driver thread that {@link #adopt adopts} the tasks'
 * loader finds the classes its tasks compiled, and its tasks find the ones it compiled. The
 * tasks' loader delegates to the driver's first, so classes resolve as before.
 */
public final class TaskClassLoader {
  private static volatile ClassLoader tasks;

  private TaskClassLoader() {}

  /**
   * Run one task that records the class loader it runs under; returns whether it ran in this
   * JVM (Spark's local mode), so that there is a loader to adopt.
   */
  public static boolean capture(JavaSparkContext context) {
    tasks = null;
    context.parallelize(Collections.singletonList(0), 1)
        .foreachPartition(rows -> tasks = Thread.currentThread().getContextClassLoader());
    return tasks != null;
  }

  /** Make the captured loader the calling thread's context class loader; false if none was captured. */
  public static boolean adopt() {
    ClassLoader loader = tasks;
    if (loader == null) {
      return false;
    }
    Thread.currentThread().setContextClassLoader(loader);
    return true;
  }
}
