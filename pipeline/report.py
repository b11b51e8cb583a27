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
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

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


class Distribution:
    """A value distribution accumulated partition by partition: counts on a fine grid (for
    percentiles to within ``step``), the exact minimum and maximum, and a coarse histogram."""

    def __init__(self, bins: list[float], step: float, top: float) -> None:
        self.bins = bins
        self.step = step
        self.fine = np.zeros(int(top / step) + 2, dtype=np.int64)
        self.coarse = np.zeros(len(bins) - 1, dtype=np.int64)
        self.low, self.high = np.inf, -np.inf

    def add(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self.low, self.high = min(self.low, values.min()), max(self.high, values.max())
        index = np.clip((values / self.step).astype(np.int64), 0, len(self.fine) - 1)
        self.fine += np.bincount(index, minlength=len(self.fine))
        self.coarse += np.histogram(values, bins=self.bins)[0]

    def summary(self) -> dict[str, Any]:
        total = int(self.fine.sum())
        out: dict[str, Any] = {}
        if total:
            cumulative = np.cumsum(self.fine)
            at = {q: float(np.searchsorted(cumulative, q * total, side="left") * self.step)
                  for q in (0.5, 0.9)}
            out = {"min": float(self.low), "median": at[0.5], "p90": at[0.9], "max": float(self.high)}
        return {**out, "histogram": {"edges": [float(e) for e in self.bins],
                                     "counts": [int(c) for c in self.coarse]}}


def _read(corpus: Corpus, table: str, columns: list[str], partition: str) -> pa.Table:
    return corpus.read(table, columns=columns, partition=partition)


def download_runs(corpus: Corpus) -> list[dict[str, Any]]:
    """The figures each download run left in ``runs/download/`` (pipeline/download.py), oldest
    first: downloads per minute, pauses for blocks, outcomes by kind."""
    paths = sorted(corpus.fs.glob(corpus.path("runs/download/*.json")))
    return [json.loads(corpus.fs.cat(path)) for path in paths]


def compute_stats(corpus: Corpus) -> dict[str, Any]:
    """The report's numbers, read partition by partition with Arrow (never a whole table)."""
    summary = summarize(corpus)
    tables = summary["tables"]
    present = set(tables)
    counts = Counter()
    by_class: Counter = Counter()
    per_query: dict[str, dict[str, int]] = {}
    durations = Distribution([0, 1, 2, 3, 4, 5, 6, 8, 12], step=0.01, top=600)
    words = Distribution([0, 3, 5, 8, 12, 16, 24, 32, 64], step=1, top=10_000)
    media_s = 0.0
    for partition in corpus.labels():
        videos = _read(corpus, "videos", ["video_id", "source", "query"], partition) \
            if "videos" in present else pa.table({"video_id": pa.array([], pa.string())})
        downloads = _read(corpus, "downloads", ["video_id", "duration_s", "subtitles"], partition) \
            if "downloads" in present else None
        segments = _read(corpus, "segments", ["video_id", "words"], partition) \
            if "segments" in present else None
        clips = _read(corpus, "clips", ["video_id", "start_s", "end_s"], partition) \
            if "clips" in present else None
        counts["videos"] += videos.num_rows
        if downloads is not None:
            counts["downloads"] += downloads.num_rows
            media_s += pc.sum(downloads.column("duration_s")).as_py() or 0.0
        if segments is not None:
            counts["sentences"] += segments.num_rows
            counts["segment_videos"] += len(corpus.done_keys("segments", partition))
            counts["aligned_videos"] += len(pc.unique(segments.column("video_id")))
            lengths = pc.fill_null(pc.list_value_length(segments.column("words")), 0)
            words.add(lengths.to_numpy(zero_copy_only=False).astype(np.float64))
        if clips is not None:
            counts["clips"] += clips.num_rows
            durations.add(pc.subtract(clips.column("end_s"), clips.column("start_s"))
                          .to_numpy(zero_copy_only=False))
        _per_query(per_query, videos, downloads, clips)
    for partition in corpus.partitions_of("errors") if "errors" in present else []:
        errors = _read(corpus, "errors", ["stage", "message"], partition)
        by_class.update(f"{e['stage']}: {message_class(e['message'])}" for e in errors.to_pylist())
    stages = {
        "discover": {"out": counts["videos"]},
        "download": {"in": counts["videos"], "out": counts["downloads"]},
        "transcribe": {"in": counts["downloads"], "out": counts["segment_videos"],
                       "sentences": counts["sentences"]},
        "align": {"in": counts["aligned_videos"], "out": counts["clips"]},
    }
    for table in tables:
        if table.startswith("features/"):
            stages[f"featurize:{table.split('/', 1)[1]}"] = {"in": counts["clips"], "out": tables[table]}
    return {
        "root": corpus.url,
        "tables": tables,
        "stages": stages,
        "errors": {"by_kind": summary["errors"], "by_message": dict(by_class.most_common(30))},
        "drop_reasons": corpus.stats("clips") if "clips" in present else {},
        "media_hours": round(media_s / 3600, 4),
        "clip_duration_s": durations.summary(),
        "words_per_sentence": words.summary(),
        "per_source": dict(sorted(per_query.items())),
        "download_runs": download_runs(corpus),
    }


def _per_query(out: dict[str, dict[str, int]], videos: pa.Table, downloads: pa.Table | None,
               clips: pa.Table | None) -> None:
    """Add one partition's yield per source and query: videos, downloaded, with subtitles, clips."""
    if not videos.num_rows:
        return
    got = set() if downloads is None else set(downloads.column("video_id").to_pylist())
    subtitled = set() if downloads is None else {
        d["video_id"] for d in downloads.select(["video_id", "subtitles"]).to_pylist() if d["subtitles"]}
    per_video = Counter() if clips is None else Counter(clips.column("video_id").to_pylist())
    for video in videos.to_pylist():
        label = f"{video['source']}: {video['query'] or '(list)'}"
        row = out.setdefault(label, {"videos": 0, "downloaded": 0, "with_subtitles": 0, "clips": 0})
        row["videos"] += 1
        row["downloaded"] += video["video_id"] in got
        row["with_subtitles"] += video["video_id"] in subtitled
        row["clips"] += per_video.get(video["video_id"], 0)


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


def _sample_clips(corpus: Corpus, limit: int) -> list[dict[str, Any]]:
    """A few clips spread over the corpus: the middle clip of the first ``limit`` partitions
    that have clips (more from each when there are fewer partitions)."""
    labels = corpus.partitions_of("clips")
    if not labels:
        return []
    per_partition = max(1, -(-limit // len(labels)))
    chosen: list[dict[str, Any]] = []
    columns = ["clip_id", "video_id", "start_s", "end_s", "text", "source"]
    for partition in labels:
        clips = corpus.read("clips", columns=columns, partition=partition).sort_by("clip_id")
        step = max(1, clips.num_rows // per_partition)
        rows = list(range(step // 2, clips.num_rows, step))[:per_partition]
        chosen += clips.take(pa.array(rows, pa.int64())).to_pylist()
        if len(chosen) >= limit:
            break
    return chosen[:limit]


def _thumbnails(corpus: Corpus, limit: int) -> list[dict[str, Any]]:
    """Middle frames of a few clips (spread over the corpus), with their sentence."""
    chosen = _sample_clips(corpus, limit)
    by_video: dict[str, list[dict[str, Any]]] = {}
    for clip in chosen:
        by_video.setdefault(clip["video_id"], []).append(clip)
    cards = []
    for video, group in by_video.items():
        partition = corpus.partition_of(video)
        download = corpus.read("downloads", columns=["media_path", "released_at"],
                               filter=pc.field("video_id") == video, partition=partition).to_pylist()
        title = corpus.read("videos", columns=["title"], filter=pc.field("video_id") == video,
                            partition=partition).to_pylist()
        requests = [FrameRequest(c["clip_id"], c["start_s"], c["end_s"],
                                 FrameSpec(frames=1, short_side=128, crop=None)) for c in group]
        frames: dict[str, Any] = {}
        if download and download[0]["media_path"] and download[0]["released_at"] is None:
            try:
                with corpus.local_file(download[0]["media_path"]) as path:
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
            cards.append({**clip, "title": title[0]["title"] if title else None, "image": uri})
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
