"""The one line a Spark failure becomes (`streaming.job.root_cause`): the task's own error, Python's or compactd's
JVM code's; else the innermost JVM cause; never Py4J's "An error occurred while calling"."""

from __future__ import annotations

from compactd.streaming.job import root_cause

SPARK = """Py4JJavaError: An error occurred while calling o115.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2935)
"""


def test_a_python_error_inside_a_task_is_the_line() -> None:
    text = SPARK + (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/spark_run.py", line 9, in read\n'
        "compactd.errors.SourceReadError: orders/0: read stalled at 5 of [0,10)\n"
    )
    assert root_cause(text) == "SourceReadError: orders/0: read stalled at 5 of [0,10)"


def test_compactds_own_jvm_exception_is_the_line() -> None:
    text = SPARK + (
        "Caused by: io.compactd.compaction.ViewRunException: orders/0: offsets from 0 were deleted\n"
        "\tat io.compactd.compaction.ViewRun.scan(ViewRun.java:238)\n"
    )
    assert root_cause(text) == "ViewRunException: orders/0: offsets from 0 were deleted"


def test_otherwise_the_innermost_jvm_cause_not_py4js_wrapper() -> None:
    text = SPARK + (
        "Caused by: org.apache.kafka.common.KafkaException: Failed to construct kafka consumer\n"
        "\tat org.apache.kafka.clients.consumer.KafkaConsumer.<init>(KafkaConsumer.java:1)\n"
        "Caused by: java.lang.IllegalArgumentException: Could not find a 'KafkaClient' entry\n"
        "\t... 30 more\n"
    )
    assert root_cause(text) == "IllegalArgumentException: Could not find a 'KafkaClient' entry"


def test_a_message_without_causes_gives_its_first_line() -> None:
    assert root_cause("\nsomething broke\nmore") == "something broke"
