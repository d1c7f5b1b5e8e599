"""Real faults of Spark's own making, for the tests that meet them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DELAYED = "delayed-once"  # the marker file the slow worker leaves in its directory
RESTART_LINE = "query started again from its checkpoint (1 of 3)"


def slow_first_source_runner(where: Path) -> dict[str, str]:
    """An environment whose Python for Spark's workers starts the first streaming-source process 10.5 s late, past
    the 10 s Spark gives it to connect back (then none is late): what an overloaded machine does."""
    marker, wrapper = where / DELAYED, where / "python"
    wrapper.write_text(
        "#!/bin/bash\n"
        f'if [[ "$*" == *python_streaming_source_runner* && ! -e {marker} ]]; then touch {marker}; sleep 10.5; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PYSPARK_PYTHON"] = str(wrapper)
    return env


def restarted_once(log: str, where: Path) -> bool:
    """The fault happened, and compactd said once that it started the query again."""
    lines = [line for line in log.splitlines() if "did not connect back" in line]
    return (where / DELAYED).exists() and len(lines) == 1 and RESTART_LINE in lines[0]
