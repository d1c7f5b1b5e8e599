"""A stand-in for compactd's coordinator-request child that dies of the signal its first argument names (SIGSEGV by
default), as librdkafka 2.16 makes the real one die: SIGSEGV when an OffsetFetch is answered NOT_COORDINATOR
(librdkafka#5040), SIGABRT when a coordinator request's send fails while the coordinator moves (librdkafka#4605).
Its second argument, when given, is the one call it dies on ("offsets" or "assignments"); it answers the others as
the real child does, against the real cluster."""

from __future__ import annotations

import json
import os
import signal
import sys

from compactd.kafka import coordinator
from compactd.kafka.config import new_admin

if __name__ == "__main__":
    sig = signal.Signals[sys.argv[1] if len(sys.argv) > 1 else "SIGSEGV"]
    fatal = sys.argv[2] if len(sys.argv) > 2 else None
    signal.signal(sig, signal.SIG_DFL)  # Python's own handlers must not turn the death into an exit code
    conf = json.loads(sys.stdin.buffer.readline())
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if fatal in (None, request["call"]):
            os.kill(os.getpid(), sig)
        serve = coordinator.CALLS[request["call"]]
        answer = serve(new_admin({**conf, "log_level": 0}), request["groups"], float(request["timeout_s"]))
        sys.stdout.buffer.write(json.dumps(answer).encode() + b"\n")
        sys.stdout.buffer.flush()
