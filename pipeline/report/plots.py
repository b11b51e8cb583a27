"""The report's figures, drawn with matplotlib into PNG data: URIs (the page loads nothing)."""

from __future__ import annotations

import base64
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to memory
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

BLUE, LIGHT, GREEN, ORANGE, GREY = "#4477aa", "#a9c4e0", "#66aa55", "#ee8833", "#555555"


def png_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _png(figure: plt.Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return png_uri(buffer.getvalue())


def _axes(width: float, height: float) -> tuple[plt.Figure, Any]:
    figure, axes = plt.subplots(figsize=(width, height))
    axes.spines[["top", "right"]].set_visible(False)
    return figure, axes


def bar_plot(title: str, counts: dict[str, int], color: str = BLUE) -> str | None:
    if not counts:
        return None
    figure, axes = _axes(6, 0.4 * len(counts) + 1)
    labels = list(counts)
    axes.barh(labels, [counts[k] for k in labels], color=color)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.invert_yaxis()
    axes.set_title(title)
    return _png(figure)


def hist_plot(title: str, hist: dict[str, Any], unit: str, marks: dict[str, float] | None = None) -> str | None:
    """A histogram; ``marks`` (label: value) as dashed vertical lines."""
    if not sum(hist["counts"]):
        return None
    figure, axes = _axes(6, 3)
    edges = hist["edges"]
    axes.bar(edges[:-1], hist["counts"], width=np.diff(edges), align="edge", color=GREEN,
             edgecolor="white")
    for (label, value), color in zip((marks or {}).items(), (ORANGE, GREY, BLUE)):
        axes.axvline(value, color=color, linestyle="dashed", linewidth=1, label=label)
    if marks:
        axes.legend(frameon=False, fontsize=8)
    axes.set_title(title)
    axes.set_xlabel(unit)
    return _png(figure)


def score_plots(table: str, summary: dict[str, Any]) -> dict[str, str | None]:
    """A score table's histograms of similarity and P(aligned), with the 10th, 50th and 90th
    percentiles marked: what a ``shards.min_score`` there would leave out."""
    plots = {}
    for name, label in (("similarity", "Similarity of clip and sentence"), ("p_aligned", "P(aligned)")):
        values = summary[name]
        plots[name] = None if values is None else hist_plot(
            f"{label}: {table}", values["histogram"], name,
            {f"{float(q):.0%} of clips below": x for q, x in values["quantiles"].items()})
    return plots


def timing_plot(rows: list[dict[str, Any]]) -> str | None:
    """Wall seconds per stage (first task to last) beside its task seconds (summed); one bar
    for featurize however many extractors share its tasks."""
    stages: dict[str, dict[str, Any]] = {}
    for row in rows:
        stages.setdefault(row["stage"] if row["shared"] else row["part"], row)
    rows = [{**row, "part": label} for label, row in stages.items()]
    if not rows or not any(r["wall_s"] or r["task_s"] for r in rows):
        return None
    figure, axes = _axes(6, 0.55 * len(rows) + 1.2)
    y = np.arange(len(rows))
    axes.barh(y - 0.2, [r["wall_s"] for r in rows], height=0.4, color=BLUE, label="wall")
    axes.barh(y + 0.2, [r["task_s"] for r in rows], height=0.4, color=LIGHT, label="task (summed)")
    axes.set_yticks(y, [r["part"] for r in rows])
    axes.invert_yaxis()
    axes.set_xlabel("seconds")
    axes.set_title("Time per stage")
    axes.legend(frameon=False, loc="lower right")
    return _png(figure)


def recall_plot(run: dict[str, Any]) -> str | None:
    """R@1/5/10 per direction as bars, with the chance level as a black tick over each."""
    directions = [d for d in run["directions"] if d.get("R@1") is not None]
    if not directions:
        return None
    ks = [k for k in ("R@1", "R@5", "R@10") if all(d.get(k) is not None for d in directions)]
    figure, axes = _axes(5, 3)
    x = np.arange(len(ks))
    width = 0.8 / len(directions)
    for i, (direction, color) in enumerate(zip(directions, (BLUE, ORANGE))):
        offset = (i - (len(directions) - 1) / 2) * width
        axes.bar(x + offset, [direction[k] for k in ks], width=width, color=color, label=direction["label"])
    if run["chance"]:
        axes.hlines([run["chance"][k] for k in ks], x - 0.4, x + 0.4, colors="black", linestyles="dashed",
                    label="chance")
    axes.set_xticks(x, ks)
    axes.set_ylim(0, 100)
    axes.set_ylabel("%")
    axes.set_title(f"Retrieval on the {run['split'] or 'test'} split")
    axes.legend(frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    return _png(figure)


def curve_plot(run: dict[str, Any]) -> str | None:
    """Training loss per epoch and, where training selected on the val split, the val score;
    the selected epoch dashed."""
    curve = [p for p in run["curve"] if p["loss"] is not None]
    if not curve:
        return None
    figure, axes = _axes(6, 3.2)
    axes.plot([p["epoch"] for p in curve], [p["loss"] for p in curve], marker="o", ms=3, color=BLUE,
              label="training loss")
    axes.set_xlabel("epoch")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("loss", color=BLUE)
    handles, labels = axes.get_legend_handles_labels()
    val = [(p["epoch"], p["val"]) for p in curve if p["val"] is not None]
    if val:
        by = run["selected"]["by"]
        second = axes.twinx()
        second.spines[["top"]].set_visible(False)
        if by == "val_loss":  # recorded as minus the loss, so that higher is better
            points, name = [(e, -v) for e, v in val], "val loss"
        else:
            points, name = val, "val mean R@1/5/10 (%)"
        line, = second.plot(*zip(*points), marker="s", ms=3, color=ORANGE, label=name)
        second.set_ylabel(name, color=ORANGE)
        handles, labels = handles + [line], labels + [name]
    if run["selected"]["epoch"] is not None:
        handles.append(axes.axvline(run["selected"]["epoch"], color=GREY, linestyle="dashed", linewidth=1))
        labels.append(f"selected (epoch {run['selected']['epoch']})")
    axes.legend(handles, labels, frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                ncol=len(handles))
    axes.set_title(f"Training curve: {run['model']}")
    return _png(figure)


def figures(stats: dict[str, Any]) -> dict[str, Any]:
    """Every figure of the page, None where there is nothing to draw."""
    errors = {f"{g['stage']}: {g['kind']}": g["items"] for g in stats["errors"]["groups"]}
    timing = stats["timing"]
    return {
        "clip_duration": hist_plot("Clip duration", stats["clip_duration_s"]["histogram"], "seconds"),
        "words": hist_plot("Words per sentence", stats["words_per_sentence"]["histogram"], "words"),
        "drop_reasons": bar_plot("Sentences dropped by align, by reason", stats["drop_reasons"]),
        "errors": bar_plot("Failed items by stage and kind", errors, color=ORANGE),
        "timing": timing_plot(timing["stages"]) if timing else None,
        "training": [{"recall": recall_plot(run), "curve": curve_plot(run)} if not run["problem"]
                     else {"recall": None, "curve": None} for run in stats["training"]],
        "scores": {table: score_plots(table, summary) for table, summary in stats["scores"].items()},
    }
