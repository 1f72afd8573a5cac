package factflow.jvm;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.util.EnumSet;
import java.util.Map;
import java.util.OptionalLong;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.Statistics;
import org.apache.spark.sql.connector.read.SupportsReportStatistics;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A relation whose rows are bound when its plan runs, not when it is planned.
 *
 * <p>The driver binds rows (an Arrow IPC stream) to a named slot with {@link #bind}; a scan of
 * the slot (options {@code slot} and {@code schema}, a DDL string) reads whatever the slot held
 * when its task was sent. A plan over such scans can therefore be planned once and executed
 * again with new rows. The slots live in the driver's JVM; a task takes the rows with it: its
 * partition writes the slot's current rows when Spark serializes the task to launch it (on the
 * driver, at every launch, in local mode as on a cluster), and reads them back in the executor.
 *
 * <p>The scan reports one partition and a size of one byte, so that Spark's planner keeps a
 * small statement in one partition (see factflow's {@code EngineConfig.small_conf}).
 */
public final class BoundRows implements TableProvider {
  /** How a scan of a slot describes itself (the start of its description). */
  static final String DESCRIPTION = "bound rows ";
  private static final Map<String, byte[]> SLOTS = new ConcurrentHashMap<>();
  private static final BufferAllocator ALLOCATOR = new RootAllocator();

  /** Bind the rows of an Arrow IPC stream to {@code slot}, replacing what it held. */
  public static void bind(String slot, byte[] arrowStream) {
    SLOTS.put(slot, arrowStream);
  }

  /** Forget what {@code slot} holds. */
  public static void release(String slot) {
    SLOTS.remove(slot);
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return StructType.fromDDL(options.get("schema"));
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new SlotTable(properties.get("slot"), schema);
  }

  private static final class SlotTable implements SupportsRead {
    private final String slot;
    private final StructType schema;

    SlotTable(String slot, StructType schema) {
      this.slot = slot;
      this.schema = schema;
    }

    @Override public String name() { return "bound rows " + slot; }
    @Override public StructType schema() { return schema; }
    @Override public Set<TableCapability> capabilities() { return EnumSet.of(TableCapability.BATCH_READ); }
    @Override public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) { return () -> new SlotScan(slot, schema); }
  }

  private static final class SlotScan implements Scan, Batch, SupportsReportStatistics {
    private final String slot;
    private final StructType schema;

    SlotScan(String slot, StructType schema) {
      this.slot = slot;
      this.schema = schema;
    }

    @Override public StructType readSchema() { return schema; }
    @Override public String description() { return DESCRIPTION + slot; }
    @Override public Batch toBatch() { return this; }
    @Override public InputPartition[] planInputPartitions() { return new InputPartition[] {new SlotPartition(slot)}; }
    @Override public PartitionReaderFactory createReaderFactory() { return new SlotReaderFactory(); }

    @Override
    public Statistics estimateStatistics() {
      return new Statistics() {
        @Override public OptionalLong sizeInBytes() { return OptionalLong.of(1L); }
        @Override public OptionalLong numRows() { return OptionalLong.empty(); }
      };
    }
  }

  private static final class SlotPartition implements InputPartition {
    private static final long serialVersionUID = 1L;
    final String slot;
    /** The slot's rows as the task was serialized (null in the object the driver keeps). */
    transient byte[] rows;

    SlotPartition(String slot) {
      this.slot = slot;
    }

    private void writeObject(ObjectOutputStream out) throws IOException {
      out.defaultWriteObject();
      byte[] bound = SLOTS.get(slot);
      out.writeInt(bound == null ? -1 : bound.length);
      if (bound != null) {
        out.write(bound);
      }
    }

    private void readObject(ObjectInputStream in) throws IOException, ClassNotFoundException {
      in.defaultReadObject();
      int length = in.readInt();
      if (length >= 0) {
        rows = new byte[length];
        in.readFully(rows);
      }
    }
  }

  private static final class SlotReaderFactory implements PartitionReaderFactory {
    @Override public boolean supportColumnarReads(InputPartition partition) { return true; }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("bound rows are read as columnar batches");
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      SlotPartition slot = (SlotPartition) partition;
      byte[] rows = slot.rows != null ? slot.rows : SLOTS.get(slot.slot);
      if (rows == null) {
        throw new IllegalStateException("no rows are bound to " + slot.slot);
      }
      return new SlotReader(rows);
    }
  }

  private static final class SlotReader implements PartitionReader<ColumnarBatch> {
    private final BufferAllocator allocator = ALLOCATOR.newChildAllocator("bound rows", 0, Long.MAX_VALUE);
    private final ArrowStreamReader reader;
    private ColumnarBatch batch;

    SlotReader(byte[] rows) {
      reader = new ArrowStreamReader(new ByteArrayInputStream(rows), allocator);
    }

    @Override
    public boolean next() throws IOException {
      if (!reader.loadNextBatch()) {
        return false;
      }
      VectorSchemaRoot root = reader.getVectorSchemaRoot();
      ColumnVector[] columns = new ColumnVector[root.getFieldVectors().size()];
      for (int i = 0; i < columns.length; i++) {
        columns[i] = new ArrowColumnVector(root.getVector(i));
      }
      batch = new ColumnarBatch(columns, root.getRowCount());
      return true;
    }

    @Override public ColumnarBatch get() { return batch; }

    @Override
    public void close() throws IOException {
      reader.close();
      allocator.close();
    }
  }
}
