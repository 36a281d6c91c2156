"""parity.gate.cpu_use: the core-seconds each of the gate's steps used, read from /proc while they run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from parity.gate import cpu_use

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")

# A step whose work is in a process it starts: the child burns 1.3 CPU seconds (its own clock, not the
# wall's; /proc counts in clock ticks, so the test asks for 1.0), then sleeps so the sampler reads its
# final figure before it ends.
BUSY_TREE = textwrap.dedent("""\
    import subprocess, sys
    child = "import time\\nwhile time.process_time() < 1.3: pass\\ntime.sleep(1.0)"
    subprocess.run([sys.executable, "-c", child], check=True)
    """)


def test_each_step_is_charged_what_its_processes_used():
    cpu = cpu_use.StepCpu(interval=0.1).start()
    busy = subprocess.Popen([sys.executable, "-c", BUSY_TREE])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    cpu.watch("busy", busy.pid)
    cpu.watch("idle", idle.pid)
    assert busy.wait() == 0 and idle.wait() == 0
    used = cpu.stop()
    assert list(used) == ["busy", "idle"]
    assert used["busy"] >= 1.0  # the grandchild's burnt 1.3 s, read while it slept
    assert used["idle"] < 0.5 < used["busy"] - used["idle"]


def test_a_tree_lists_the_process_and_everything_below_it():
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               "'import sys; sys.stdin.read()'])"], stdin=subprocess.PIPE)
    try:
        for _ in range(200):  # until the child has started
            tree = cpu_use.process_tree(parent.pid)
            if len(tree) == 2:
                break
            subprocess.run(["sleep", "0.05"])
        assert tree[0] == parent.pid and len(tree) == 2
        assert cpu_use.cpu_seconds(tree[1]) is not None
    finally:
        parent.stdin.close()
        parent.wait()
    assert cpu_use.cpu_seconds(parent.pid) is None  # ended
