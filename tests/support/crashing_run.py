"""`compactd ARGS...` with a probe that SIGKILLs the process at one point of one batch, as an OOM kill would.

Usage: python -m tests.support.crashing_run <after_merge|after_enqueue>:<batch_id> run --once --config FILE
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable

from compactd.app.cli import main
from compactd.daemon.application import Application


def killer(point: str, batch: int) -> Callable[[str, int], None]:
    def probe(at: str, batch_id: int) -> None:
        if (at, batch_id) == (point, batch):
            os.kill(os.getpid(), signal.SIGKILL)

    return probe


if __name__ == "__main__":
    where, _, number = sys.argv[1].partition(":")
    sys.exit(main(sys.argv[2:], app_factory=functools.partial(Application, probe=killer(where, int(number)))))
