"""The report's numbers from the tables, read partition by partition with Arrow (never a whole
table): rows per stage, distributions, yield per source, and the errors grouped by stage and
kind with their commonest messages and a few examples."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.corpus import partsummary
from pipeline.graph import family_lineage
from pipeline.report.runs import build_timing, shard_listing, training_runs
from pipeline.report.scores import score_summary
from pipeline.corpus.storage import Corpus
from pipeline.corpus import summary as corpus_summary

# URLs, paths, hex ids and numbers: blanked so that alike errors group (RE2 syntax, for Arrow).
_VARIABLE = re.compile(r"https?://\S+|/\S+|\b[0-9a-f]{8,}\b|\d+(\.\d+)?")
CLASS_CHARS = 120
EXAMPLES = 3  # example rows per (stage, kind)
CLASSES = 5  # message classes shown per (stage, kind)
_CLASSES_KEPT = 1000  # per group while counting: the rarest are dropped past twice this
SCORE_BINS = 20  # histogram bins of a score table's similarity and P(aligned)
SCORE_EXAMPLES = 5  # best- and worst-scored clips shown per score table
SECTION = "report"


def message_classes(messages: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Error messages with URLs, paths, ids and numbers blanked (and cut to 120 characters)."""
    blanked = pc.replace_substring_regex(pc.fill_null(messages, ""), pattern=_VARIABLE.pattern,
                                         replacement="…")
    return pc.utf8_slice_codeunits(blanked, 0, CLASS_CHARS)


def message_class(message: str) -> str:
    """One message's class (``message_classes`` of one)."""
    return message_classes(pa.array([message], pa.string()))[0].as_py()


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

    def state(self) -> dict[str, Any]:
        """What was added, as JSON (the fine grid sparse), for a partition's summary."""
        nonzero = np.flatnonzero(self.fine)
        return {"fine": [[int(i), int(self.fine[i])] for i in nonzero], "coarse": self.coarse.tolist(),
                "low": None if not len(nonzero) else float(self.low),
                "high": None if not len(nonzero) else float(self.high)}

    def merge(self, state: dict[str, Any]) -> None:
        """Add another distribution's ``state`` (of the same grid)."""
        if state["low"] is None:
            return
        self.low, self.high = min(self.low, state["low"]), max(self.high, state["high"])
        for index, n in state["fine"]:
            self.fine[index] += n
        self.coarse += np.asarray(state["coarse"], dtype=np.int64)

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
    """The figures each download run left in ``runs/download/`` (pipeline/download/stage.py), oldest
    first: downloads per minute, pauses for blocks, outcomes by kind."""
    paths = sorted(corpus.fs.glob(corpus.path("runs/download/*.json")))
    return [json.loads(corpus.fs.cat(path)) for path in paths]


def error_groups(corpus: Corpus, by_kind: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """Per stage and kind (items as ``summarize`` counts them): the commonest message classes
    with their items, and up to ``EXAMPLES`` example rows (item id, message), of different
    classes first. Reads the errors' stage, kind, item id and message one partition at a time
    (the class counts need every message); examples stop being picked once a group has its
    share, so what is held is the class counts and a few rows per group."""
    groups = {(stage, kind): {"stage": stage, "kind": kind, "items": n, "classes": Counter(),
                              "by_class": [], "extra": []}
              for stage, kinds in by_kind.items() for kind, n in kinds.items()}
    labels = corpus.partitions_of("errors") if groups else []
    columns = ["stage", "kind", "item_id", "message"]
    # Read concurrently, a few partitions at a time (so that few are held at once), in order.
    with ThreadPoolExecutor(partsummary.WORKERS) as pool:
        for first in range(0, len(labels), partsummary.WORKERS):
            chunk = labels[first:first + partsummary.WORKERS]
            for errors in pool.map(lambda partition: _read(corpus, "errors", columns, partition), chunk):
                _add_partition(groups, errors)
    out = []
    for group in groups.values():
        rank = {name: i for i, (name, _) in enumerate(group["classes"].most_common())}
        examples = sorted(group["by_class"], key=lambda e: rank.get(e["class"], len(rank)))
        seen = {e["item_id"] for e in examples}
        examples += [e for e in group["extra"] if e["item_id"] not in seen]
        out.append({"stage": group["stage"], "kind": group["kind"], "items": group["items"],
                    "classes": [{"message": m, "items": n} for m, n in group["classes"].most_common(CLASSES)],
                    "more_classes": max(0, len(group["classes"]) - CLASSES),
                    "examples": [{"item_id": e["item_id"], "message": e["message"]}
                                 for e in examples[:EXAMPLES]]})
    return out


def _add_partition(groups: dict[tuple[str, str], dict[str, Any]], errors: pa.Table) -> None:
    """Count one partition's errors into their groups."""
    if not errors.num_rows:
        return
    errors = errors.append_column("class", message_classes(errors.column("message")))
    # Items per class (an item's errors are all in its partition, so partitions add up),
    # and the first row of each class as its candidate example.
    per_class = errors.group_by(["stage", "kind", "class"], use_threads=False).aggregate(
        [("item_id", "count_distinct"), ("item_id", "first"), ("message", "first")])
    for row in per_class.to_pylist():
        group = groups.get((row["stage"], row["kind"]))
        if group is None:  # written since summarize counted: the next report has it
            continue
        if row["class"] not in group["classes"] and len(group["by_class"]) < EXAMPLES:
            group["by_class"].append({"item_id": row["item_id_first"],
                                      "message": row["message_first"], "class": row["class"]})
        group["classes"][row["class"]] += row["item_id_count_distinct"]
    for group in groups.values():
        if len(group["extra"]) < EXAMPLES:  # more items, for groups of fewer classes
            _add_extra(group, errors)
        if len(group["classes"]) > 2 * _CLASSES_KEPT:  # bounded on wildly varied messages
            group["classes"] = Counter(dict(group["classes"].most_common(_CLASSES_KEPT)))


def _add_extra(group: dict[str, Any], errors: pa.Table) -> None:
    mask = pc.and_(pc.equal(errors.column("stage"), group["stage"]),
                   pc.equal(errors.column("kind"), group["kind"]))
    have = {e["item_id"] for e in group["extra"]}
    for row in errors.filter(mask).slice(0, 4 * EXAMPLES).to_pylist():
        if len(group["extra"]) < EXAMPLES and row["item_id"] not in have:
            have.add(row["item_id"])
            group["extra"].append(row)


def _durations() -> Distribution:
    return Distribution([0, 1, 2, 3, 4, 5, 6, 8, 12], step=0.01, top=600)


def _words() -> Distribution:
    return Distribution([0, 3, 5, 8, 12, 16, 24, 32, 64], step=1, top=10_000)


def partition_stats(corpus: Corpus, partition: str) -> dict[str, Any]:
    """One partition's share of the report's numbers (counts, media seconds, distributions,
    yield per source), as JSON: the report's section of the partition's summary."""
    videos = _read(corpus, "videos", ["video_id", "source", "query"], partition)
    downloads = _read(corpus, "downloads", ["video_id", "duration_s", "subtitles"], partition)
    segments = _read(corpus, "segments", ["video_id", "words"], partition)
    clips = _read(corpus, "clips", ["video_id", "start_s", "end_s"], partition)
    durations, words = _durations(), _words()
    lengths = pc.fill_null(pc.list_value_length(segments.column("words")), 0)
    words.add(lengths.to_numpy(zero_copy_only=False).astype(np.float64))
    durations.add(pc.subtract(clips.column("end_s"), clips.column("start_s")).to_numpy(zero_copy_only=False))
    per_query: dict[str, dict[str, int]] = {}
    _per_query(per_query, videos, downloads, clips)
    counts = {"videos": videos.num_rows, "downloads": downloads.num_rows,
              "sentences": segments.num_rows,
              "segment_videos": len(corpus.done_keys("segments", partition)),
              "aligned_videos": len(pc.unique(segments.column("video_id"))), "clips": clips.num_rows}
    return {"counts": counts, "media_s": pc.sum(downloads.column("duration_s")).as_py() or 0.0,
            "durations": durations.state(), "words": words.state(), "per_source": per_query}


def compute_stats(corpus: Corpus, write: bool = False) -> dict[str, Any]:
    """The report's numbers, from the partitions' summaries (those missing or stale rescanned
    partition by partition with Arrow, never a whole table; with ``write``, stored), with the
    newest build's timing, the shard listings, the training runs and the score tables'
    distributions and examples."""
    # The summary's section and the report's, from one listing of the partitions' files.
    found = partsummary.gather(corpus, {corpus_summary.SECTION: corpus_summary.partition_figures,
                                        SECTION: partition_stats}, labels=corpus.labels(), write=write)
    summary = corpus_summary.added_up(corpus, (sections[corpus_summary.SECTION] for sections in found.values()))
    tables = summary["tables"]
    counts = Counter()
    per_query: dict[str, dict[str, int]] = {}
    durations, words = _durations(), _words()
    media_s = 0.0
    for sections in found.values():
        part = sections[SECTION]
        counts.update(part["counts"])
        media_s += part["media_s"]
        durations.merge(part["durations"])
        words.merge(part["words"])
        for label, row in part["per_source"].items():
            mine = per_query.setdefault(label, dict.fromkeys(row, 0))
            for name, n in row.items():
                mine[name] += n
    groups = error_groups(corpus, summary["errors"])
    stages = {
        "discover": {"out": counts["videos"]},
        "download": {"in": counts["videos"], "out": counts["downloads"]},
        "transcribe": {"in": counts["downloads"], "out": counts["segment_videos"],
                       "sentences": counts["sentences"]},
        "align": {"in": counts["aligned_videos"], "out": counts["clips"]},
    }
    for table in tables:
        lineage = family_lineage(table)
        if lineage is not None:  # featurize:<extractor> and score:<model>, one row per clip
            stages[lineage[0]] = {"in": counts["clips"], "out": tables[table]}
    by_message = Counter({f"{g['stage']}: {c['message']}": c["items"] for g in groups for c in g["classes"]})
    return {
        "root": corpus.url,
        "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "tables": tables,
        "stages": stages,
        "errors": {"by_kind": summary["errors"], "groups": groups,
                   "by_message": dict(by_message.most_common(30))},
        "drop_reasons": summary["counters"].get("clips", {}),
        "media_hours": round(media_s / 3600, 4),
        "clip_duration_s": durations.summary(),
        "words_per_sentence": words.summary(),
        "per_source": dict(sorted(per_query.items())),
        "download_runs": download_runs(corpus),
        "timing": build_timing(corpus),
        "shards": shard_listing(corpus),
        "training": training_runs(corpus),
        "scores": score_summary(corpus, bins=SCORE_BINS, examples=SCORE_EXAMPLES),
    }


def _per_query(out: dict[str, dict[str, int]], videos: pa.Table, downloads: pa.Table,
               clips: pa.Table) -> None:
    """Add one partition's yield per source and query: videos, downloaded, with subtitles, clips."""
    if not videos.num_rows:
        return
    got = set(downloads.column("video_id").to_pylist())
    subtitled = {d["video_id"] for d in downloads.select(["video_id", "subtitles"]).to_pylist() if d["subtitles"]}
    per_video = Counter(clips.column("video_id").to_pylist())
    for video in videos.to_pylist():
        label = f"{video['source']}: {video['query'] or '(list)'}"
        row = out.setdefault(label, {"videos": 0, "downloaded": 0, "with_subtitles": 0, "clips": 0})
        row["videos"] += 1
        row["downloaded"] += video["video_id"] in got
        row["with_subtitles"] += video["video_id"] in subtitled
        row["clips"] += per_video.get(video["video_id"], 0)
