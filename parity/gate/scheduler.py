"""The gate's xdist scheduler: the groups in the order run_order gave them, and no hoarding.

`--dist loadgroup` undoes run_order's longest-first order twice over:

- it sorts the groups by their number of tests (most first) before handing any out, so a group of
  forty 0.1 s doc tests starts before a single 60 s compile test; the gate's pytest runs pass
  `--no-loadscope-reorder` (xdist's own switch), which keeps the collection order;
- a worker is given its next group whenever it has 2 or fewer tests left, so with the slowest single
  tests at the front each of the first workers queues three of them while the others run out of work.

LongestFirstScheduling gives a worker its next group only when it is down to its last test (a worker
runs a test once it knows the one after it, so one must stay queued). On the warm H100 gate's CPU
layers (13 workers, measured test times of docs/measurements/gate/gate-time-h100-warm-2026-11-26-c86e4a7)
a replay of xdist's rules ends at 200 s as shipped, 181 s with the collection order kept, 161 s with
this lookahead; the work divided evenly is 157 s.

tests/conftest.py makes this the scheduler of a loadgroup run under the gate (SAMFAST_TEST_TIMES set);
plain pytest and CI keep xdist's. It overrides one method of xdist's LoadGroupScheduling (3.8); the
test extras pin xdist below 4 and tests/unit/test_gate_scheduler.py runs it in a real xdist session.
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling

# A worker is topped up once its unfinished tests (the one it runs included) are down to this many: it
# runs a test only once it knows the next, so it gets its next group while it runs its last test.
LOOKAHEAD = 1


class LongestFirstScheduling(LoadGroupScheduling):
    """loadgroup that tops a worker up only when it is down to LOOKAHEAD pending tests."""

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > LOOKAHEAD:
            return
        self._assign_work_unit(node)
