"""`compactd compact ...` that SIGKILLs itself at one phase boundary of the run, as an OOM kill or a node loss would.

Usage: python -m tests.support.crashing_compaction <planned|written|published> compact TOPIC [flags]
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from compactd.app.cli import main
from compactd.compaction import service


def install(phase: str) -> None:
    run = service.Compactor.run

    def killed_at(
        self: service.Compactor, topic: str, overrides: Any = None, on_phase: Callable | None = None, **kw: Any
    ) -> Any:
        def probe(at: str) -> None:
            if at == phase:
                os.kill(os.getpid(), signal.SIGKILL)

        return run(self, topic, overrides, probe, **kw)

    service.Compactor.run = killed_at  # type: ignore[method-assign]


if __name__ == "__main__":
    install(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
