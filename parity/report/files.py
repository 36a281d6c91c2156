"""Every task's report files, written the same way: report.md, report.json, junit.xml, report.png, report.html,
and the pictures of failed or near-failing stages beside them.

    paths = write_report_files(folder, header, results, markdown=render_markdown(header, results),
                               plot=lambda path: plot(results, path), layout=html_layout(header), task="amg",
                               picture_name=lambda result, key: picture_name(result.stage, key))
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from parity.compare.gates import StageResult
from parity.report.html import PageLayout, render_html
from parity.report.verdicts import REPORT_FILES, render_junit, report_payload


def write_report_files(folder: Path, header: dict, results: list[StageResult], *, markdown: str,
                       plot: Callable[[Path], None], layout: PageLayout, task: str | None = None,
                       picture_name: Callable[[StageResult, int], str] | None = None) -> dict[str, Path]:
    """The report files in `folder`, by name. task: the report.json's "task" (the point task's has none);
    picture_name(result, key): the file of result.pictures[key] (a task without pictures passes None)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / name for name in REPORT_FILES}
    paths["report.md"].write_text(markdown)
    payload = {**({"task": task} if task else {}), **report_payload(header, results)}
    paths["report.json"].write_text(json.dumps(payload, indent=2, default=str) + "\n")
    paths["junit.xml"].write_text(render_junit(results))
    plot(paths["report.png"])
    paths["report.html"].write_text(render_html(header, results, paths["report.png"].read_bytes(), layout))
    for result in results if picture_name else ():
        for key, png in result.pictures.items():
            (folder / picture_name(result, key)).write_bytes(png)
    return paths
