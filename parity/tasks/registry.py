"""Every task the gate knows, by the name `--task` takes; the first is the default. The CLI dispatches
`--task` here, and the gate (parity.gate.run) and `nox -s golden` take every task's embedded checks
(Task.embedded) from here: they name no task."""

from __future__ import annotations

from parity.tasks.amg.task import AMG
from parity.tasks.concept.task import CONCEPT
from parity.tasks.point.task import POINT
from parity.tasks.task import Task
from parity.tasks.video.task import VIDEO

TASKS: dict[str, Task] = {task.name: task for task in (POINT, AMG, VIDEO, CONCEPT)}
DEFAULT_TASK = POINT.name
