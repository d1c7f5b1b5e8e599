"""A Kafka client that only cyclic garbage refers to, with requests still out, must not take the process down.

Its answers are built into Python objects on the client's own background thread; a collection that runs there finds
the client and destroys it on that thread, and librdkafka aborts ("calling rd_kafka_destroy() from librdkafka owned
thread is prohibited"). An xdist worker died that way (SIGABRT, no traceback) in 2 of 5 full runs, in the teardown of
the 3-node cluster, where every client's connections failed at once. (The control was not aborted once in 5 tries
under a loaded clean-clone run: it has 20 now, as has compactd's side.) compactd/gc_pause.py moves every collection of a
process that made a client through kafka/config.py to a thread of its own. The control makes its clients directly,
with automatic collection left on, and is aborted.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.fixtures import Cluster

SCRIPT = """
import gc, sys, time
from confluent_kafka.admin import AdminClient
from compactd.kafka.config import KafkaConnection, new_admin

make = new_admin if sys.argv[1] == "compactd" else (lambda conf: AdminClient(dict(conf)))
conf = KafkaConnection(sys.argv[2]).client("admin", {"log_level": 0})
first = make(conf)  # a process's first client (compactd's moves the collector to its thread)

freed = []

class Holder:
    def __del__(self):
        freed.append(True)

for _ in range(20):  # the control's abort depends on where a collection starts: 20 chances, not 5
    was = gc.isenabled()  # the setup below must not collect before the client is garbage
    gc.disable()
    freed.clear()
    client = make(conf)
    futures = [client.describe_cluster(request_timeout=30) for _ in range(5)]  # answered on the client's thread
    gc.collect()
    holder = Holder()
    holder.me, holder.client = holder, client  # only cyclic garbage refers to the client now
    del holder, client
    gc.set_threshold(5)  # the answers' few allocations start a collection wherever they are made
    if was:
        gc.enable()
    deadline = time.monotonic() + 30
    while not futures[-1].done() and not freed and time.monotonic() < deadline:
        time.sleep(0.05)  # this thread allocates nothing while it waits (a client freed first answers nothing)
    gc.set_threshold(700)
    gc.collect()
print("alive")
"""


def run(kind: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, kind, bootstrap], capture_output=True, text=True, timeout=120)


def test_a_client_in_cyclic_garbage_with_requests_out_is_freed_without_aborting(cluster: Cluster) -> None:
    ours = run("compactd", cluster.bootstrap)
    assert (ours.returncode, ours.stdout.strip()) == (0, "alive"), ours.stderr[-2000:]
    control = run("direct", cluster.bootstrap)
    assert control.returncode == -6 and "librdkafka owned thread" in control.stderr, (
        control.returncode,
        control.stderr[-2000:],
    )
