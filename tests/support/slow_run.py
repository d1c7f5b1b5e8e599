"""`compactd ARGS...` with a probe that makes one batch slow, so a test can signal the process mid-batch.

Usage: python -m tests.support.slow_run MARKER SECONDS run --config FILE
The probe writes MARKER when batch 0 has merged, then sleeps SECONDS before the batch decides and acts.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path

from compactd.app.cli import main
from compactd.daemon.application import Application


def slow(marker: Path, seconds: float) -> Callable[[str, int], None]:
    def probe(at: str, batch_id: int) -> None:
        if (at, batch_id) == ("after_merge", 0):
            marker.write_text("in batch 0")
            time.sleep(seconds)

    return probe


if __name__ == "__main__":
    marker, seconds = Path(sys.argv[1]), float(sys.argv[2])
    sys.exit(main(sys.argv[3:], app_factory=functools.partial(Application, probe=slow(marker, seconds))))
