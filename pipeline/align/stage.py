"""The align stage: timed sentences in, clip–sentence pairs (``clips``) out.

Three policies (``align.policy``):
- ``subtitle_span`` (ApartmentTour / WAL): one clip per sentence over its own time; spans under
  ``min_s`` are merged with a neighbour or dropped, spans over ``max_s`` are trimmed or split
  on word times; text-free sentences are dropped.
- ``fixed`` (HowTo100M / MIL-NCE): a ``length_s`` window centred on each narration, shifted
  to stay inside the video; the ``candidates`` nearest narrations in time (its own included)
  go with it as positive candidates.
- ``whole`` (S-MiT): one clip per short video (or per listed start/end span) with its text.
Every dropped sentence is counted under a reason, kept with the batch (``Corpus.stats``).
Splits are per video, by a hash of its id, so no video has clips on two sides.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import fsspec
import pyarrow as pa

from pipeline.config import AlignConfig, Config
from pipeline.ids import clip_id
from pipeline.runner import Item, Outcome, Stage, StageContext, attach, per_item, rows_of

_HAS_TEXT = re.compile(r"\w")


@dataclass(frozen=True)
class Span:
    """A candidate clip: its time, its text, and the sentence it came from."""

    start_s: float
    end_s: float
    text: str
    index: int
    words: tuple[dict[str, Any], ...] = ()

    @property
    def length(self) -> float:
        return self.end_s - self.start_s


def split_for(video: str, ratios: dict[str, float]) -> str:
    """train/val/test for a video, from a hash of its id: stable across runs and machines."""
    point = int(hashlib.sha1(video.encode()).hexdigest()[:12], 16) / 16**12
    total = 0.0
    for name in ("train", "val", "test"):
        total += ratios.get(name, 0.0)
        if point < total:
            return name
    return "train" if ratios.get("train") else max(ratios, key=ratios.__getitem__)


@cache
def _held_out(path: str) -> frozenset[str]:
    with fsspec.open(path, "rt") as handle:
        return frozenset(line.strip() for line in handle if line.strip())


def _span(row: dict[str, Any]) -> Span:
    return Span(row["start_s"], row["end_s"], row["text"], row["index"],
                tuple(row.get("words") or ()))


def _merge(a: Span, b: Span) -> Span:
    return Span(a.start_s, max(a.end_s, b.end_s), f"{a.text} {b.text}", a.index,
                a.words + b.words)


def _merge_short(spans: list[Span], cfg: AlignConfig, drops: Counter) -> list[Span]:
    """Join spans under min_s with the next (else previous) one while the result fits max_s."""
    out: list[Span] = []
    pending: Span | None = None
    for span in spans:
        if pending is not None:
            joined = _merge(pending, span)
            if joined.length <= cfg.max_s:
                span = joined
            else:
                drops["too_short"] += 1
            pending = None
        if span.length < cfg.min_s:
            if out and _merge(out[-1], span).length <= cfg.max_s:
                out[-1] = _merge(out[-1], span)
                continue
            pending = span
            continue
        out.append(span)
    if pending is not None:
        if out and _merge(out[-1], pending).length <= cfg.max_s:
            out[-1] = _merge(out[-1], pending)
        else:
            drops["too_short"] += 1
    return out


def _cut_on_words(span: Span, cfg: AlignConfig) -> Iterator[Span]:
    """Pieces of a long span, each ending on a word end and at most max_s long."""
    words = [w for w in span.words if w["end_s"] > w["start_s"]]
    if not words:
        yield Span(span.start_s, span.start_s + cfg.max_s, span.text, span.index)
        return
    piece: list[dict[str, Any]] = []
    for word in words:
        if piece and word["end_s"] - piece[0]["start_s"] > cfg.max_s:
            yield _from_words(piece, span.index)
            piece = []
        piece.append(word)
    if piece:
        yield _from_words(piece, span.index)


def _from_words(words: list[dict[str, Any]], index: int) -> Span:
    return Span(words[0]["start_s"], words[-1]["end_s"], " ".join(w["text"] for w in words),
                index, tuple(words))


def _bound_long(spans: list[Span], cfg: AlignConfig, drops: Counter) -> list[Span]:
    out: list[Span] = []
    for span in spans:
        if span.length <= cfg.max_s:
            out.append(span)
        elif cfg.long == "drop":
            drops["too_long"] += 1
        elif cfg.long == "trim":
            out.append(next(_cut_on_words(span, cfg)))
        else:
            for piece in _cut_on_words(span, cfg):
                if piece.length >= cfg.min_s:
                    out.append(piece)
                else:
                    drops["split_piece_too_short"] += 1
    return out


def subtitle_spans(sentences: list[Span], cfg: AlignConfig, duration: float | None,
                   drops: Counter) -> list[Span]:
    spans = []
    for span in sentences:
        if not _HAS_TEXT.search(span.text):
            drops["no_text"] += 1
        else:
            spans.append(span)
    if cfg.short == "merge":
        spans = _merge_short(spans, cfg, drops)
    else:
        kept = [s for s in spans if s.length >= cfg.min_s]
        drops["too_short"] += len(spans) - len(kept)
        spans = kept
    spans = _bound_long(spans, cfg, drops)
    out = []
    for span in spans:
        end = min(span.end_s, duration) if duration else span.end_s
        # A too-short result after trimming can only come from the clamp or a trim to words.
        if end - span.start_s < cfg.min_s:
            drops["beyond_media" if duration and span.end_s > duration else "too_short"] += 1
            continue
        out.append(Span(span.start_s, end, span.text, span.index, span.words))
    return out


def fixed_spans(sentences: list[Span], cfg: AlignConfig, duration: float | None,
                drops: Counter) -> list[tuple[Span, list[str]]]:
    """Windows of length_s centred on each narration, and each one's nearest narrations."""
    narrations = [s for s in sentences if _HAS_TEXT.search(s.text)]
    drops["no_text"] += len(sentences) - len(narrations)
    if duration:
        # A narration after the end (captions longer than the media) has no video to show.
        inside = [s for s in narrations if s.start_s < duration]
        drops["beyond_media"] += len(narrations) - len(inside)
        narrations = inside
    out = []
    for span in narrations:
        centre = (span.start_s + span.end_s) / 2
        start = max(0.0, centre - cfg.length_s / 2)
        end = start + cfg.length_s
        if duration and end > duration:
            # Shift left to stay inside the video; a video shorter than the window is used
            # whole (the featurizer pads it symmetrically, as MIL-NCE does).
            end = duration
            start = max(0.0, end - cfg.length_s)
        nearest = sorted(narrations, key=lambda s: (abs((s.start_s + s.end_s) / 2 - centre),
                                                   s.index))
        candidates = [s.text for s in nearest[: cfg.candidates]]
        out.append((Span(start, end, span.text, span.index), candidates))
    return out


def whole_span(sentences: list[Span], video: dict[str, Any], duration: float | None,
               drops: Counter) -> list[Span]:
    start = video.get("listed_start_s") or 0.0
    end = video.get("listed_end_s") or duration
    if end is None:
        drops["unknown_duration"] += len(sentences)
        return []
    if duration:
        end = min(end, duration)
    if end <= start:  # a listed span that starts after the media ends
        drops["outside_span"] += len(sentences)
        return []
    inside = [s for s in sentences if s.end_s > start and s.start_s < end and _HAS_TEXT.search(s.text)]
    drops["outside_span"] += len(sentences) - len(inside)
    text = " ".join(s.text for s in inside)
    if not text:
        return []
    return [Span(start, end, text, inside[0].index)]


def _milliseconds(pairs: list[tuple[Span, list[str]]], duration: float | None,
                  drops: Counter) -> list[tuple[Span, list[str]]]:
    """Spans in millisecond times, rounding the length rather than the end so that a 3.2 s
    window stays exactly 3.2 s; one that rounding would end past the media moves back (by
    under a millisecond), and one that rounds to nothing is dropped."""
    last_ms = math.floor(duration * 1000 + 1e-6) / 1000 if duration else None
    out = []
    for span, candidates in pairs:
        start = round(span.start_s, 3)
        end = round(start + round(span.length, 3), 3)
        if last_ms is not None and end > last_ms:
            start, end = round(max(0.0, start - (end - last_ms)), 3), last_ms
        if end <= start:
            drops["too_short"] += 1
            continue
        out.append((Span(start, end, span.text, span.index), candidates))
    return out


def align_one(item: Item, ctx: StageContext) -> Outcome:
    cfg: Config = ctx.config
    acfg = cfg.align
    video = item.key
    sentences = sorted((_span(r) for r in item.rows), key=lambda s: (s.start_s, s.index))
    source = item.rows[0]["source"]
    duration = item.info.get("duration_s")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        duration = None  # unknown, as when the download stage did not say
    info = dict(item.info)
    start, end = info.get("listed_start_s"), info.get("listed_end_s")
    if info.get("download_status") == "partial" and start is not None and end is not None:
        # A partial download's media starts at its section's start, and so do the times of its
        # sentences (ASR on that media): the listed span, in the video's time, moves onto the
        # media's timeline, else no sentence fell inside it and every moment was dropped.
        offset = cfg.download.section(start, end)[0]
        info["listed_start_s"], info["listed_end_s"] = start - offset, end - offset
    drops: Counter = Counter()
    if acfg.policy == "fixed":
        pairs = fixed_spans(sentences, acfg, duration, drops)
    elif acfg.policy == "whole":
        pairs = [(s, []) for s in whole_span(sentences, info, duration, drops)]
    else:
        pairs = [(s, []) for s in subtitle_spans(sentences, acfg, duration, drops)]
    held_out = _held_out(acfg.test_clip_ids) if acfg.test_clip_ids else frozenset()
    pairs = _milliseconds(pairs, duration, drops)
    ids = [clip_id(video, s.start_s, s.end_s) for s, _ in pairs]
    # A video with any clip in the fixed test list goes to test whole: no video on two sides.
    split = "test" if held_out & set(ids) else split_for(video, acfg.splits)
    rows, seen = [], set()
    for cid, (span, candidates) in zip(ids, pairs):
        if cid in seen:
            drops["duplicate_span"] += 1
            continue
        seen.add(cid)
        rows.append({
            "clip_id": cid, "video_id": video, "start_s": span.start_s,
            "end_s": span.end_s, "text": span.text, "source": source,
            "policy": acfg.policy, "segment_index": span.index,
            "candidates": candidates if acfg.policy == "fixed" else None, "split": split,
        })
    return Outcome(video, rows=rows, stats={f"dropped:{k}": v for k, v in drops.items()})


def align_inputs(ctx: StageContext, partition: str, videos: pa.Array) -> pa.Table:
    """Sentences of ``videos``, each with its video's duration and any listed span."""
    segments = rows_of(ctx, "segments", partition, "video_id", videos)
    durations = rows_of(ctx, "downloads", partition, "video_id", videos,
                        ["video_id", "duration_s", "status"]).rename_columns(
        ["video_id", "duration_s", "download_status"])
    listed = rows_of(ctx, "videos", partition, "video_id", videos,
                     ["video_id", "start_s", "end_s"]).rename_columns(
        ["video_id", "listed_start_s", "listed_end_s"])
    return attach(attach(segments, durations, "video_id"), listed, "video_id")


STAGE = Stage(name="align", output="clips", source="segments", inputs=align_inputs,
              process=per_item(align_one),
              info=("duration_s", "download_status", "listed_start_s", "listed_end_s"))
