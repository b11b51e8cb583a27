"""The report page: the figures and the gathered numbers through a Jinja template
(``templates/report.html.j2``) with autoescaping, so user text is always escaped."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import jinja2

from pipeline.report.plots import figures

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: int | float) -> str:
    """1536 -> '1.5 KiB'."""
    value, unit = float(n), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    return f"{int(value)} B" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"


def human_seconds(s: float | None) -> str:
    """0.042 -> '0.04 s', 12.34 -> '12.3 s', 245 -> '4 min 05 s', 7380 -> '2 h 03 min'."""
    if s is None:
        return "–"
    if s < 1:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def number(value: Any, digits: int = 1) -> str:
    """Thousands separated; floats to ``digits`` decimals; None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def when(stamp: str | None) -> str:
    """A build stamp (20260102T030405Z) or an ISO time, as '2026-01-02 03:04:05 UTC'; other
    text as it is."""
    if not stamp:
        return "–"
    for parse in (lambda s: datetime.strptime(s, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC),
                  datetime.fromisoformat):
        try:
            moment = parse(stamp)
        except ValueError:
            continue
        if moment.tzinfo is not None:
            return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return moment.strftime("%Y-%m-%d %H:%M:%S")
    return stamp


def workers(names: list[str]) -> str:
    """Dask worker names; a local cluster's are numbers, shown as '#0'."""
    return ", ".join(f"#{n}" if str(n).isdigit() else str(n) for n in names) or "–"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("pipeline.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(bytes=human_bytes, seconds=human_seconds, number=number, when=when,
                       workers=workers)
    return env


def render_html(stats: dict[str, Any], cards: list[dict[str, Any]]) -> str:
    """The page for ``compute_stats``'s numbers and ``thumbnails``'s cards."""
    return environment().get_template("report.html.j2").render(
        stats=stats, cards=cards, fig=figures(stats),
        error_kinds=("blocked", "permanent", "transient", "bad_input", "internal"))
