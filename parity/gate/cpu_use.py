"""Which of the gate's steps burns the machine's cores, and moving a step off some of them.

The gate's steps run side by side on one machine, so its time is set by the cores they use together
(docs/gpu-gate.md: a warm H100 gate keeps all 16 busy). StepCpu samples each step's processes from
Linux's /proc once a second and reports the core-seconds each step used; the gate prints them under
its time table. A process's CPU time is read while it lives: what one uses in its last second, and a
process shorter than a second, can be missed, so the figures are lower bounds.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat from the field after the process name (which may hold spaces) on, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # ended meanwhile
        return None
    return stat[stat.rindex(")") + 2:].split()


def children_of() -> dict[int, list[int]]:
    """Every live process's children, by parent pid (one pass over Linux's /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(entry.name)) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def process_tree(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """`pid` and every process below it, parents before children (`children`: a children_of() to reuse)."""
    children = children_of() if children is None else children
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop(0))
        todo.extend(children.get(tree[-1], []))
    return tree


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one process so far (all its threads), or None once it has ended."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def move_to(pid: int, cores: set[int]) -> int:
    """Put process `pid`, the processes below it and all their threads on `cores` (how many threads
    moved). A thread or process started later inherits the mask of the one that started it; two
    passes catch those started while the first one ran."""
    moved = set()
    for _ in range(2):
        for process in process_tree(pid):
            try:
                threads = [int(t) for t in os.listdir(f"/proc/{process}/task")]
            except OSError:
                continue
            for thread in threads:
                try:
                    os.sched_setaffinity(thread, cores)
                    moved.add(thread)
                except (ProcessLookupError, PermissionError):  # ended meanwhile
                    continue
    return len(moved)


class StepCpu:
    """Core-seconds per step: every `interval` seconds, each watched step's process tree read from /proc."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self._roots: dict[str, int] = {}
        self._seen: dict[tuple[str, int], float] = {}  # (step, pid) -> its CPU seconds when last read
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, step: str, pid: int) -> None:
        with self._lock:
            self._roots[step] = pid
        self.sample()  # from the start: a step's first processes are read before they can end

    def start(self) -> StepCpu:
        self._thread.start()
        return self

    def sample(self) -> None:
        with self._lock:
            roots = dict(self._roots)
        children = children_of()  # one pass over /proc for every step's tree
        for step, root in roots.items():
            for pid in process_tree(root, children):
                seconds = cpu_seconds(pid)
                if seconds is not None:
                    with self._lock:
                        self._seen[(step, pid)] = max(seconds, self._seen.get((step, pid), 0.0))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> dict[str, float]:
        """Core-seconds each watched step used (at least), in the order the steps were watched."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        totals = dict.fromkeys(self._roots, 0.0)
        for (step, _), seconds in self._seen.items():
            totals[step] += seconds
        return totals
