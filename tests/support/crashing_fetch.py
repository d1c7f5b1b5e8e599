"""A stand-in for compactd's offset-fetch child that dies of SIGSEGV on its first request, as librdkafka 2.16 makes
the real one die when an OffsetFetch is answered NOT_COORDINATOR (librdkafka#5040)."""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":
    sys.stdin.buffer.readline()  # the client's settings
    sys.stdin.buffer.readline()  # the request
    os.kill(os.getpid(), signal.SIGSEGV)
