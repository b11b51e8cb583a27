"""The report stage: ``report/stats.json`` and ``report/report.html`` from all tables.

The page is self-contained (plots and thumbnails inlined as data: URIs, no scripts, no
network) and every user-provided string (titles, sentences, queries, error messages) is
HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from collections import Counter
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to memory
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from pipeline.media import FrameRequest, FrameSpec, sample_frames  # noqa: E402
from pipeline.progress import log  # noqa: E402
from pipeline.runner import StageContext  # noqa: E402
from pipeline.storage import Corpus  # noqa: E402
from pipeline.summary import summarize  # noqa: E402

SAMPLE_CLIPS = 12
_VARIABLE = re.compile(r"https?://\S+|/\S+|\b[0-9a-f]{8,}\b|\d+(\.\d+)?")


def message_class(message: str) -> str:
    """An error message with URLs, paths, ids and numbers blanked, so alike errors group."""
    return _VARIABLE.sub("…", message)[:120]


def _histogram(values: list[float], bins: list[float]) -> dict[str, Any]:
    counts, edges = np.histogram(values, bins=bins) if values else (np.zeros(len(bins) - 1), bins)
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    p = np.percentile(values, [0, 50, 90, 100])
    return {"min": float(p[0]), "median": float(p[1]), "p90": float(p[2]), "max": float(p[3])}


def _column(corpus: Corpus, table: str, columns: list[str]) -> list[dict[str, Any]]:
    return corpus.read(table, columns=columns).to_pylist() if table in corpus.tables() else []


def download_runs(corpus: Corpus) -> list[dict[str, Any]]:
    """The figures each download run left in ``runs/download/`` (pipeline/download.py), oldest
    first: downloads per minute, pauses for blocks, outcomes by kind."""
    paths = sorted(corpus.fs.glob(corpus.path("runs/download/*.json")))
    return [json.loads(corpus.fs.cat(path)) for path in paths]


def compute_stats(corpus: Corpus) -> dict[str, Any]:
    summary = summarize(corpus)
    tables = summary["tables"]
    videos = _column(corpus, "videos", ["video_id", "source", "query"])
    downloads = _column(corpus, "downloads", ["video_id", "duration_s", "subtitles"])
    segments = _column(corpus, "segments", ["video_id", "words"])
    clips = _column(corpus, "clips", ["video_id", "start_s", "end_s"])
    errors = _column(corpus, "errors", ["stage", "kind", "message", "item_id"])

    stages = {
        "discover": {"out": len(videos)},
        "download": {"in": len(videos), "out": len(downloads)},
        "transcribe": {"in": len(downloads), "out": len(corpus.done("segments")),
                       "sentences": len(segments)},
        "align": {"in": len({s["video_id"] for s in segments}), "out": len(clips)},
    }
    for table in tables:
        if table.startswith("features/"):
            stages[f"featurize:{table.split('/', 1)[1]}"] = {"in": len(clips), "out": tables[table]}
    by_class: Counter = Counter(f"{e['stage']}: {message_class(e['message'])}" for e in errors)
    per_query: dict[str, dict[str, int]] = {}
    downloaded = {d["video_id"]: d for d in downloads}
    clip_videos = Counter(c["video_id"] for c in clips)
    for video in videos:
        label = f"{video['source']}: {video['query'] or '(list)'}"
        row = per_query.setdefault(label, {"videos": 0, "downloaded": 0, "with_subtitles": 0,
                                           "clips": 0})
        row["videos"] += 1
        got = downloaded.get(video["video_id"])
        if got:
            row["downloaded"] += 1
            row["with_subtitles"] += bool(got["subtitles"])
        row["clips"] += clip_videos.get(video["video_id"], 0)
    durations = [c["end_s"] - c["start_s"] for c in clips]
    words = [len(s["words"] or []) for s in segments]
    return {
        "root": corpus.url,
        "tables": tables,
        "stages": stages,
        "errors": {"by_kind": summary["errors"], "by_message": dict(by_class.most_common(30))},
        "drop_reasons": corpus.stats("clips") if "clips" in tables else {},
        "media_hours": round(sum(d["duration_s"] or 0 for d in downloads) / 3600, 4),
        "clip_duration_s": {**_percentiles(durations),
                            "histogram": _histogram(durations, [0, 1, 2, 3, 4, 5, 6, 8, 12])},
        "words_per_sentence": {**_percentiles(words),
                               "histogram": _histogram(words, [0, 3, 5, 8, 12, 16, 24, 32, 64])},
        "per_source": per_query,
        "download_runs": download_runs(corpus),
    }


def _png(figure: plt.Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _bar_plot(title: str, counts: dict[str, int]) -> str | None:
    if not counts:
        return None
    figure, axes = plt.subplots(figsize=(6, 0.4 * len(counts) + 1))
    labels = list(counts)
    axes.barh(labels, [counts[k] for k in labels], color="#4477aa")
    axes.invert_yaxis()
    axes.set_title(title)
    return _png(figure)


def _hist_plot(title: str, hist: dict[str, Any], unit: str) -> str | None:
    if not sum(hist["counts"]):
        return None
    figure, axes = plt.subplots(figsize=(6, 3))
    edges = hist["edges"]
    axes.bar(edges[:-1], hist["counts"], width=np.diff(edges), align="edge", color="#66aa55",
             edgecolor="white")
    axes.set_title(title)
    axes.set_xlabel(unit)
    return _png(figure)


def _thumbnails(corpus: Corpus, limit: int) -> list[dict[str, Any]]:
    """Middle frames of a few clips (evenly over the corpus), with their sentence."""
    if "clips" not in corpus.tables():
        return []
    clips = sorted(corpus.read("clips", columns=["clip_id", "video_id", "start_s", "end_s",
                                                 "text", "source"]).to_pylist(),
                   key=lambda c: c["clip_id"])
    step = max(1, len(clips) // limit)
    chosen = clips[::step][:limit]
    media = {d["video_id"]: d["media_path"] for d in _column(corpus, "downloads",
                                                              ["video_id", "media_path"])}
    titles = {v["video_id"]: v["title"] for v in _column(corpus, "videos", ["video_id", "title"])}
    by_video: dict[str, list[dict[str, Any]]] = {}
    for clip in chosen:
        by_video.setdefault(clip["video_id"], []).append(clip)
    cards = []
    for video, group in by_video.items():
        requests = [FrameRequest(c["clip_id"], c["start_s"], c["end_s"],
                                 FrameSpec(frames=1, short_side=128, crop=None)) for c in group]
        frames: dict[str, Any] = {}
        if video in media:
            try:
                with corpus.local_file(media[video]) as path:
                    frames = dict(sample_frames(path, requests))
            except OSError as exc:  # media moved or deleted since: the card shows no frame
                log.warning("report: no thumbnails for %s: %s", video, exc)
        for clip in group:
            image = frames.get(clip["clip_id"])
            uri = None
            if isinstance(image, np.ndarray):
                buffer = io.BytesIO()
                plt.imsave(buffer, image[0], format="png")
                uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
            cards.append({**clip, "title": titles.get(video), "image": uri})
    return cards


_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:left}th{background:#f2f2f2}.grid{display:grid;grid-template-columns:repeat(auto-fill,
minmax(220px,1fr));gap:12px}.card{border:1px solid #ddd;padding:6px;font-size:13px}
.card img{width:100%;height:auto;display:block}.muted{color:#777}img.plot{max-width:100%}
"""


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(stats: dict[str, Any], cards: list[dict[str, Any]]) -> str:
    parts = [f"<h1>Corpus report</h1><p class='muted'>{html.escape(stats['root'])} · "
             f"{stats['media_hours']:.2f} hours of media</p>"]
    parts.append("<h2>Stages</h2>" + _table(
        ["stage", "in", "out"],
        [[name, s.get("in", ""), s.get("out", "")] for name, s in stats["stages"].items()]))
    plots = [
        _hist_plot("Clip duration", stats["clip_duration_s"]["histogram"], "seconds"),
        _hist_plot("Words per sentence", stats["words_per_sentence"]["histogram"], "words"),
        _bar_plot("Drop reasons (align)", stats["drop_reasons"]),
        _bar_plot("Errors by stage and kind",
                  {f"{st}: {k}": n for st, kinds in stats["errors"]["by_kind"].items()
                   for k, n in kinds.items()}),
    ]
    parts.append("<h2>Figures</h2>" + "".join(
        f"<img class='plot' alt='figure' src='{uri}'>" for uri in plots if uri))
    parts.append("<h2>Yield per source</h2>" + _table(
        ["source", "videos", "downloaded", "with subtitles", "clips"],
        [[k, v["videos"], v["downloaded"], v["with_subtitles"], v["clips"]]
         for k, v in stats["per_source"].items()]))
    if stats["download_runs"]:
        kinds = ("blocked", "permanent", "transient", "bad_input")
        parts.append("<h2>Download runs</h2>" + _table(
            ["started", "videos", "downloaded", "per minute", "pauses for blocks",
             "seconds paused", *kinds, "left to do", "stopped"],
            [[r["started"], r["videos"], r["downloaded"], r["per_minute"], r["pauses"],
              r["paused_s"], *(r["errors"].get(k, 0) for k in kinds), r["left"],
              r["stopped"] or ""] for r in stats["download_runs"]]))
    if stats["errors"]["by_message"]:
        parts.append("<h2>Errors by message</h2>" + _table(
            ["message", "items"], [[k, v] for k, v in stats["errors"]["by_message"].items()]))
    grid = []
    for card in cards:
        image = (f"<img alt='middle frame' src='{card['image']}'>" if card["image"]
                 else "<p class='muted'>no frame</p>")
        grid.append(
            f"<div class='card'>{image}<p>{html.escape(card['text'])}</p>"
            f"<p class='muted'>{html.escape(card['title'] or card['video_id'])} · "
            f"{card['start_s']:.2f}–{card['end_s']:.2f} s · {html.escape(card['source'])}</p></div>")
    parts.append("<h2>Sample clips</h2><div class='grid'>" + "".join(grid) + "</div>")
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>Corpus report</title><style>{_STYLE}</style></head><body>"
            + "".join(parts) + "</body></html>\n")


def write_report(ctx: StageContext) -> dict[str, Any]:
    """The report stage: stats.json and report.html under ``report/``."""
    corpus = ctx.corpus
    stats = compute_stats(corpus)
    corpus.write_text("report/stats.json", json.dumps(stats, indent=1, sort_keys=True) + "\n")
    corpus.write_text("report/report.html", render_html(stats, _thumbnails(corpus, SAMPLE_CLIPS)))
    return {"stats": corpus.path("report/stats.json"), "html": corpus.path("report/report.html"),
            "clips": stats["tables"].get("clips", 0)}
