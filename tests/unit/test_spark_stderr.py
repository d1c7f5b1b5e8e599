"""Spark's JVM stderr passed on without its Python workers' tracebacks (streaming/session.py `forward_stderr`)."""

from __future__ import annotations

import io
import logging

import pytest

from compactd.streaming.session import forward_stderr

# what a streaming source's worker printed in a test run on a busy machine, between two of the JVM's own lines
WORKER = """\
WARNING: Using incubator modules: jdk.incubator.vector
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "pyspark.zip/pyspark/worker_util.py", line 246, in get_sock_file_to_executor
pyspark.errors.exceptions.base.PySparkRuntimeError: [CANNOT_OPEN_SOCKET] Can not open socket: ["timed out"].
Setting default log level to "OFF".
"""
CHAINED = """\
Traceback (most recent call last):
  File "a.py", line 1, in <module>
KeyError: 'x'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "a.py", line 3, in <module>
ValueError: y
To adjust logging level use sc.setLogLevel(newLevel).
"""


def test_the_jvms_start_up_lines_go_to_the_debug_log(caplog: pytest.LogCaptureFixture) -> None:
    out = io.StringIO()
    with caplog.at_level(logging.DEBUG, logger="compactd.spark"):
        forward_stderr(io.BytesIO((WORKER.split("\n", 1)[0] + "\nkept\n" + CHAINED.splitlines()[-1]).encode()), out)
    assert out.getvalue() == "kept\n"
    assert "incubator" in caplog.text and "setLogLevel" in caplog.text


@pytest.mark.parametrize(
    ("text", "kept", "dropped"),
    [
        (WORKER + "a line of its own\n", "a line of its own\n", "CANNOT_OPEN_SOCKET"),
        (CHAINED + "after\n", "after\n", "ValueError: y"),
        ("no traceback\nat all\n", "no traceback\nat all\n", None),
        ("ends in one\nTraceback (most recent call last):\n  File \"x\"\n", "ends in one\n", 'File "x"'),
    ],
)  # fmt: skip
def test_worker_tracebacks_go_to_the_debug_log_and_the_rest_is_passed_on(
    text: str, kept: str, dropped: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    out = io.StringIO()
    with caplog.at_level(logging.DEBUG, logger="compactd.spark"):
        forward_stderr(io.BytesIO(text.encode()), out)
    assert out.getvalue() == kept
    debug = "\n".join(r.getMessage() for r in caplog.records)
    assert "Traceback" not in out.getvalue()
    if dropped is not None:
        assert dropped in debug and "Traceback (most recent call last)" in debug
