"""What a build shows while it runs, fed by the flow as partition tasks finish: one line per
stage on the terminal (live bars for a person, plain lines at a bounded rate otherwise) and a
Prefect progress artifact per stage, so a scheduled run shows where it is in the UI."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from rich.progress import Progress, TextColumn

from pipeline.progress import COLUMNS, progress_enabled, terminal

# A build's output read by a program (CI, a scheduler's log): one line per stage at most this
# often, and when the stage ends.
PLAIN_EVERY_S = 30.0
# A stage's progress artifact is updated at most this often, and when the stage ends: each
# update is a request to the Prefect server, and a night at 2048 partitions ends a stage's
# task in each of them.
ARTIFACT_EVERY_S = 5.0


@dataclass
class StageProgress:
    partitions: int
    done: int = 0
    before: int = 0  # items done by earlier runs
    ok: int = 0
    failed: int = 0
    started: float = field(default_factory=time.monotonic)
    artifact: UUID | None = None
    printed: float = 0.0
    published: float = 0.0
    published_done: int = 0

    def line(self, stage: str) -> str:
        elapsed = time.monotonic() - self.started
        rate = f", {self.ok / elapsed:.1f}/s" if elapsed > 0 and self.ok else ""
        return (f"{stage}: {self.done}/{self.partitions} partitions, {self.ok} done, "
                f"{self.failed} failed, {self.before} done before{rate}")


class BuildProgress:
    """Per stage: partitions finished, items done and failed, rate; shown and published."""

    def __init__(self, stages: list[str], partitions: int) -> None:
        self.stages = {name: StageProgress(partitions) for name in stages}
        self._bars: Progress | None = None
        self._tasks: dict[str, Any] = {}
        if progress_enabled():
            self._bars = Progress(TextColumn("{task.fields[status]}"), *COLUMNS, console=terminal())
            for name in stages:
                self._tasks[name] = self._bars.add_task(name, total=partitions, status="")
            self._bars.start()
        for name, stage in self.stages.items():
            stage.artifact = create_progress_artifact(
                0.0, key=f"stage-{name}", description=f"{name}: 0/{partitions} partitions")

    def finished(self, result: dict[str, Any]) -> None:
        """A partition task's report (flows.partition_passes.partition_task)."""
        stage = self.stages[result["stage"]]
        stage.done += 1
        for report in result["parts"].values():
            stage.before += report["skipped_done"]
            stage.ok += report["ok"]
            stage.failed += sum(report["errors"].values())
        self._show(result["stage"], stage)

    def _show(self, name: str, stage: StageProgress) -> None:
        line = stage.line(name)
        if self._bars is not None:
            self._bars.update(self._tasks[name], completed=stage.done,
                              status=f"{stage.ok} done, {stage.failed} failed")
        elif time.monotonic() - stage.printed >= PLAIN_EVERY_S or stage.done == stage.partitions:
            terminal().print(line, markup=False, highlight=False, soft_wrap=True)
            stage.printed = time.monotonic()
        if time.monotonic() - stage.published >= ARTIFACT_EVERY_S or stage.done == stage.partitions:
            self._publish(stage, line)

    def _publish(self, stage: StageProgress, line: str) -> None:
        if stage.artifact is not None:
            update_progress_artifact(stage.artifact, 100.0 * stage.done / stage.partitions,
                                     description=line)
            stage.published, stage.published_done = time.monotonic(), stage.done

    def close(self) -> None:
        """The bars stopped; each artifact as the stage ended (a stage that stopped early)."""
        if self._bars is not None:
            self._bars.stop()
        for name, stage in self.stages.items():
            if stage.done != stage.published_done:
                self._publish(stage, stage.line(name))


_cluster_line: list[str | None] = [None]


def show_cluster(line: str | None) -> None:
    """A line on the cluster's jobs ("SLURM: 1 CPU job running, 2 GPU jobs pending
    (Resources)"), shown when it changes: a build waiting for jobs says so instead of nothing."""
    if line is None or line == _cluster_line[0]:
        return
    _cluster_line[0] = line
    terminal().print(line, markup=False, highlight=False, soft_wrap=True)


def publish_summary(summary: dict[str, Any], report_url: str | None) -> None:
    """The build's end as Prefect artifacts of its flow run: rows per table, errors by stage
    and kind, and a link to the report."""
    create_table_artifact([{"table": name, "rows": rows} for name, rows in summary["tables"].items()],
                          key="tables", description=f"Rows per table of {summary['root']}")
    errors = [{"stage": stage, "kind": kind, "items": n}
              for stage, kinds in summary["errors"].items() for kind, n in kinds.items()]
    create_table_artifact(errors or [{"stage": "-", "kind": "none", "items": 0}], key="errors",
                          description="Failed items by stage and kind (the errors table)")
    lines = [f"# Corpus {summary['root']}", ""]
    lines += [f"- **{name}**: {rows} rows" for name, rows in summary["tables"].items()]
    failed = sum(e["items"] for e in errors)
    lines += ["", f"{failed} failed items (see the errors artifact)."]
    if report_url:
        lines += ["", f"[The corpus report]({report_url}): tables, errors, figures."]
    create_markdown_artifact("\n".join(lines), key="build", description="What this build left")
