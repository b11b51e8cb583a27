"""Whether a build was healthy, from its summary and its stages' reports (``health`` section):
the verdict an unattended build ends with, so a dead source or a broken stage raises an alert."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.config import HealthConfig
from pipeline.download.outage import network_down
from pipeline.runner.watchdog import stalled


@dataclass
class Health:
    """The build's figures that health looks at, and what fell short of the limits."""

    root: str
    problems: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.problems

    def message(self) -> str:
        """One paragraph: what fell short, then every figure health looked at."""
        figures = ", ".join(f"{key} {value}" for key, value in self.numbers.items() if key != "failed")
        failed = "; ".join(f"{stage} {n} of {tried}" for stage, (n, tried) in self.numbers.get("failed", {}).items())
        return (f"The build of {self.root} is unhealthy: {'; '.join(self.problems)}. Everything it "
                f"did is committed, and each failure is a row of the errors table (vlcorpus status "
                f"{self.root}). Figures: {figures or 'none'}; failed per stage: {failed or 'none'}. "
                f"The limits are the config's health section.")

    def as_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "problems": self.problems, "numbers": self.numbers,
                "message": None if self.healthy else self.message()}


def _tried_failed(report: Any) -> tuple[int, int] | None:
    """(tried, failed) of a stage's report: items of a partition stage, or a step (one thing
    tried, failed when its report says so); None when it tried nothing countable."""
    if not isinstance(report, dict):
        return None
    if isinstance(report.get("failed"), str):
        return 1, 1
    if "queries" in report:  # discover: a query (a search, a list file) is what it tries
        return int(report["queries"]), int(report["failed_queries"])
    if "items" in report and isinstance(report.get("errors"), dict):
        return int(report["items"]), sum(report["errors"].values())
    return None


def assess(limits: HealthConfig, summary: dict[str, Any]) -> Health:
    """The health of a build from its summary (``tables``, ``stages``: the stages' reports)."""
    health = Health(str(summary.get("root", "")))
    stages: dict[str, Any] = summary.get("stages") or {}
    discover = stages.get("discover")
    if isinstance(discover, dict) and "found" in discover:
        found, added = discover["found"], discover["added"]
        health.numbers.update(found=found, new=added)
        if found < limits.min_found_videos:
            failed = (f"; {discover['failed_queries']} of {discover['queries']} queries failed"
                      if discover["failed_queries"] else "")
            health.problems.append(f"the sources listed {found} videos (at least "
                                   f"{limits.min_found_videos} expected{failed})")
        if added < limits.min_new_videos:
            health.problems.append(f"discover added {added} new videos (at least {limits.min_new_videos} expected)")
    failed_counts: dict[str, tuple[int, int]] = {}
    for name, report in stages.items():
        # An outage fails nothing (the videos stay to do), so no fraction below shows it.
        if isinstance(report, dict) and network_down(report.get("stopped")):
            health.problems.append(f"the network was down: {name} stopped with {report.get('left', 0)} "
                                   f"items left to do for the next run")
        if isinstance(report, dict) and stalled(report.get("stopped")):
            health.problems.append(f"{report['stopped']}: the stage stopped with {report.get('left', 0)} "
                                   f"more items left to do for the next run")
        counted = _tried_failed(report)
        if counted is None or counted[0] == 0:
            continue
        tried, failed = counted
        failed_counts[name] = (failed, tried)
        limit = limits.failed_limit(name)
        if failed / tried > limit:
            why = f" ({report['failed']})" if isinstance(report.get("failed"), str) else ""
            health.problems.append(f"{name} failed {failed} of the {tried} it tried "
                                   f"({100 * failed / tried:.0f}% > {100 * limit:.0f}%){why}")
    clips = (summary.get("tables") or {}).get("clips", 0)
    health.numbers["clips"] = clips
    if clips < limits.min_clips:
        health.problems.append(f"the corpus holds {clips} clips (at least {limits.min_clips} expected)")
    if failed_counts:
        health.numbers["failed"] = failed_counts
    return health
