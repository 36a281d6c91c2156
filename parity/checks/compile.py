"""Catch graph breaks and recompiles of torch.compile'd code, with the reason and the user's line.

    with watch() as seen:
        model(x); model(x)
    seen.assert_clean()

Two sources, because neither alone is enough:

* the TORCH_LOGS artifacts ``graph_breaks`` and ``recompiles`` carry the user frame
  (file:line) and the guard that failed; we read them with a handler on dynamo's artifact loggers;
* dynamo's ``counters`` (``counters["graph_break"]``, ``counters["stats"]``) count what happened
  even where a log line is de-duplicated or worded differently; a before/after difference of
  them backs up the logs, so a break the log parser does not recognise still fails the check.

We never call ``torch._logging.set_logs``: it replaces every setting at once (clobbering the
user's) and is ignored entirely when TORCH_LOGS is set. Instead we switch on only the two
artifacts, on only their own loggers, and put back exactly what we found on exit. Unless the user
asked for those artifacts themselves, their lines stay out of stderr.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

_ARTIFACTS = {"graph_breaks": ("graph_breaks",), "recompiles": ("recompiles", "recompiles_verbose")}


@dataclass(frozen=True)
class Event:
    """One graph break or recompile: why, and where in the user's code (file:line, or None)."""

    reason: str
    user_frame: str | None = None

    def __str__(self) -> str:
        return f"{self.reason}  [at {self.user_frame or 'unknown frame'}]"


@dataclass
class CompileWatch:
    """What torch.compile did inside a ``watch()`` block; filled in when the block exits."""

    graph_breaks: list[Event] = field(default_factory=list)
    recompiles: list[Event] = field(default_factory=list)
    graphs_compiled: int = 0

    @property
    def clean(self) -> bool:
        return not self.graph_breaks and not self.recompiles

    def assert_clean(self) -> None:
        if self.clean:
            return
        lines = [
            f"torch.compile was not clean: {len(self.graph_breaks)} graph break(s), "
            f"{len(self.recompiles)} recompile(s) ({self.graphs_compiled} graph(s) compiled)."
        ]
        lines += [f"  graph break: {e}" for e in self.graph_breaks]
        lines += [f"  recompile:   {e}" for e in self.recompiles]
        lines.append('Reproduce with TORCH_LOGS="graph_breaks,recompiles".')
        raise AssertionError("\n".join(lines))


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[tuple[str, str]] = []  # (artifact, message)

    def emit(self, record: logging.LogRecord) -> None:
        artifact = getattr(logging.getLogger(record.name), "artifact_name", "")
        self.records.append((artifact, record.getMessage()))


_BREAK_AT = re.compile(r"in user code at (.+?):(\d+)")
_FILE_LINE = re.compile(r'File "(.+?)", line (\d+)')
_RECOMPILE_AT = re.compile(r"Recompiling function (\S+) in (.+?):(\d+)")
_NOISE = ("Hint:", "Developer debug context", "For more details")


def _gist(text: str) -> str:
    """The first two telling lines of a graph-break reason, without hints and links."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(_NOISE)]
    if len(lines) > 1 and lines[0].startswith("Encountered graph break"):
        lines = lines[1:]  # generic preamble; the next lines say what actually broke
    return " | ".join(lines[:2]) or "graph break"


def _parse_graph_break(message: str) -> Event:
    # "Graph Break Reason:" runs until the traceback.
    body = message.split("Graph Break Reason:", 1)[-1].split("User code traceback:", 1)[0]
    frame = None
    if m := _BREAK_AT.search(message):
        frame = f"{m.group(1)}:{m.group(2)}"
    elif found := _FILE_LINE.findall(message):  # "skip frame" form: a formatted traceback
        frame = f"{found[-1][0]}:{found[-1][1]}"
    return Event(reason=_gist(body), user_frame=frame)


def _parse_recompile(message: str) -> Event:
    m = _RECOMPILE_AT.search(message)
    failures = [ln.strip().lstrip("- ").strip() for ln in message.splitlines()[1:] if ln.strip()]
    failures = [f for f in failures if not f.startswith("triggered by")]
    reason = "; ".join(failures) or message.strip()
    if m:
        reason = f"{m.group(1)}: {reason}"
    return Event(reason=reason, user_frame=f"{m.group(2)}:{m.group(3)}" if m else None)


def _artifact_loggers(artifact: str) -> list[logging.Logger]:
    from torch._logging._internal import log_registry

    loggers = (logging.getLogger(q) for q in sorted(log_registry.get_artifact_log_qnames()))
    return [lg for lg in loggers if getattr(lg, "artifact_name", None) == artifact]


def _counter_snapshot() -> tuple[Counter, int]:
    from torch._dynamo.utils import counters

    # unique_graphs, not frames["ok"]: a fullgraph=True compile (samfast's) counts no frames.
    return Counter(counters["graph_break"]), counters["stats"]["unique_graphs"]


@contextlib.contextmanager
def watch() -> Iterator[CompileWatch]:
    """Record graph breaks, recompiles and compiled graphs of everything run inside the block."""
    import torch._dynamo  # noqa: F401  (imports the modules that register the artifact loggers)
    from torch._logging._internal import log_state

    result = CompileWatch()
    collector = _Collector()
    added_artifacts = set()
    saved: list[tuple[logging.Logger, int, bool]] = []
    for primary, names in _ARTIFACTS.items():
        # dynamo gates the recompile message on log_state, not only on the logger's level.
        user_asked = log_state.is_artifact_enabled(primary)
        if not user_asked:
            log_state.enable_artifact(primary)
            added_artifacts.add(primary)
        for name in names:
            for lg in _artifact_loggers(name):
                saved.append((lg, lg.level, lg.propagate))
                lg.addHandler(collector)
                if not log_state.is_artifact_enabled(name) or name in added_artifacts:
                    lg.setLevel(logging.DEBUG)
                    lg.propagate = False  # the user did not ask to see these: keep stderr quiet
    breaks_before, graphs_before = _counter_snapshot()
    try:
        yield result
    finally:
        breaks_after, graphs_after = _counter_snapshot()
        for lg, level, propagate in saved:
            lg.removeHandler(collector)
            lg.setLevel(level)
            lg.propagate = propagate
        log_state.artifact_names.difference_update(added_artifacts)

        for artifact, message in collector.records:
            if artifact == "graph_breaks":
                result.graph_breaks.append(_parse_graph_break(message))
            else:
                result.recompiles.append(_parse_recompile(message))
        # Counters catch breaks whose log line we did not see (worded or routed differently).
        logged = Counter(e.reason for e in result.graph_breaks)
        for reason, n in (breaks_after - breaks_before).items():
            unseen = n - logged[_gist(reason)]
            result.graph_breaks += [Event(reason=_gist(reason))] * max(unseen, 0)
        result.graphs_compiled = graphs_after - graphs_before
