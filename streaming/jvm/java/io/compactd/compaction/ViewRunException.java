package io.compactd.compaction;

/**
 * A compaction task's failure, as the run reports it: one line. A top-level class, so the driver finds
 * {@code io.compactd.compaction.ViewRunException: message} among Spark's error lines (`streaming/job.root_cause`).
 */
public final class ViewRunException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public ViewRunException(String message) {
    super(message);
  }
}
