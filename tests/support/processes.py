"""What a process started, from /proc: to check that nothing a job started outlives it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    sid: int
    start: int  # clock ticks after boot: with the pid, names one process even if the pid is reused
    zombie: bool
    cmd: str


def _proc(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    return Proc(pid, int(fields[1]), int(fields[3]), int(fields[19]), fields[0] == b"Z", cmd[:200])


def processes() -> dict[int, Proc]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (p := _proc(int(name))) is not None:
            found[p.pid] = p
    return found


def tree(root: int) -> dict[int, Proc]:
    """`root` and every live descendant of it."""
    every = processes()
    found = {root: every[root]} if root in every else {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for p in every.values():
            if p.ppid == parent and p.pid not in found:
                found[p.pid] = p
                frontier.append(p.pid)
    return found


def survivors(started: dict[int, Proc]) -> list[Proc]:
    """Processes of `started` still running (same pid and start time, not a zombie), and any live process in one of
    their sessions (a worker started after the snapshot)."""
    sessions = {p.sid for p in started.values()}
    left = []
    for p in processes().values():
        if p.zombie:
            continue
        same = p.pid in started and started[p.pid].start == p.start
        if same or p.sid in sessions:
            left.append(p)
    return left


def wait_until_gone(started: dict[int, Proc], timeout_s: float = 5.0) -> list[Proc]:
    """What of `started` (and their sessions) still runs `timeout_s` from now; [] as soon as nothing does."""
    deadline = time.monotonic() + timeout_s
    while (left := survivors(started)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
