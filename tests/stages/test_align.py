"""Align: the three policies on synthetic sentences and on the demo corpus."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

from pipeline.align import stage as align
from pipeline.transcribe import stage as transcribe
from pipeline.align.stage import Span, fixed_spans, split_for, subtitle_spans, whole_span
from pipeline.config import AlignConfig, parse_config
from pipeline.runner import run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate


def spans(*times: tuple[float, float], text: str = "word") -> list[Span]:
    out = []
    for i, (start, end) in enumerate(times):
        n = max(1, round((end - start) / 0.5))
        step = (end - start) / n
        words = tuple({"text": f"{text}{i}_{k}", "start_s": start + k * step,
                       "end_s": start + (k + 1) * step} for k in range(n))
        out.append(Span(start, end, " ".join(w["text"] for w in words), i, words))
    return out


def test_subtitle_span_merges_short_and_splits_long():
    drops: Counter = Counter()
    cfg = AlignConfig(short="merge", long="split")
    result = subtitle_spans(spans((0, 3), (3.2, 4.0), (10, 11), (20, 32)), cfg, None, drops)
    lengths = [round(s.length, 2) for s in result]
    assert lengths[0] == 4.0  # 0-3 merged with the 0.8 s sentence after it
    assert all(2 <= n <= 5 for n in lengths)
    assert drops["too_short"] == 1  # 10-11 has no neighbour within max_s
    assert [s.start_s for s in result[1:]] == [20, 25, 30]  # 12 s split on word times
    assert drops["split_piece_too_short"] == 0


def test_subtitle_span_drop_trim_and_media_end():
    drops: Counter = Counter()
    cfg = AlignConfig(short="drop", long="trim")
    result = subtitle_spans(spans((0, 1), (2, 12), (14.5, 17.5)) + [Span(18, 21, "[ ]", 9)],
                            cfg, 16.0, drops)
    assert [(s.start_s, round(s.end_s, 2)) for s in result] == [(2, 7.0)]
    assert drops == {"too_short": 1, "no_text": 1, "beyond_media": 1}
    assert result[0].text.split()[-1] == result[0].words[-1]["text"]


def test_fixed_windows_and_nearest_candidates():
    drops: Counter = Counter()
    sentences = spans((0.2, 1.0), (4, 6), (6.5, 7.5), (20, 22), (29.5, 30))
    result = fixed_spans(sentences, AlignConfig(length_s=3.2, candidates=3), 30.0, drops)
    assert [round(s.length, 6) for s, _ in result] == [3.2] * 5
    first, _ = result[0]
    assert first.start_s == 0.0  # shifted right to stay inside the video
    last, _ = result[-1]
    assert last.end_s == 30.0
    span, candidates = result[1]
    assert candidates == [sentences[1].text, sentences[2].text, sentences[0].text]


def test_whole_uses_listed_span_or_video():
    drops: Counter = Counter()
    sentences = spans((0.5, 2.5), (2.6, 2.9), (4, 5))
    assert [(s.start_s, s.end_s) for s in whole_span(sentences, {}, 3.0, drops)] == [(0.0, 3.0)]
    listed = whole_span(sentences, {"listed_start_s": 3.5, "listed_end_s": 6.0}, 5.5, drops)
    assert [(s.start_s, s.end_s, s.text) for s in listed] == [(3.5, 5.5, sentences[2].text)]
    assert drops["outside_span"] == 1 + 2  # (4, 5) past a 3 s video; then two before 3.5 s


def test_splits_are_per_video_stable_and_near_ratios():
    ratios = {"train": 0.8, "val": 0.1, "test": 0.1}
    counts = Counter(split_for(f"youtube-{i}", ratios) for i in range(5000))
    assert abs(counts["train"] / 5000 - 0.8) < 0.03 and abs(counts["test"] / 5000 - 0.1) < 0.02
    assert split_for("youtube-7", ratios) == split_for("youtube-7", ratios)
    assert split_for("x", {"train": 0.0, "val": 0.0, "test": 1.0}) == "test"


def _aligned(demo_corpus, tmp_path, **align_cfg) -> Corpus:
    root, _ = demo_corpus
    copy = tmp_path / "corpus"
    shutil.copytree(root, copy)
    cfg = parse_config({"name": "t", "sources": [{"type": "urls", "urls": ["http://x/"]}],
                        "download": {"subtitle_langs": ["en", "en-auto"]},
                        "transcribe": {"prefer": ["manual"]}, "align": align_cfg})
    ctx = context(Corpus(str(copy)), cfg)
    run_stage(transcribe.STAGE, ctx, batch_size=4)
    report = run_stage(align.STAGE, ctx, batch_size=4)
    assert report.ok == 2 and not report.errors
    assert validate(ctx.corpus) == []
    return ctx.corpus


def _durations(corpus: Corpus) -> dict[str, float]:
    return {r["video_id"]: r["duration_s"] for r in corpus.read("downloads").to_pylist()}


@pytest.mark.slow
def test_demo_subtitle_span_clips(demo_corpus, tmp_path):
    corpus = _aligned(demo_corpus, tmp_path)
    clips = corpus.read("clips").to_pylist()
    durations = _durations(corpus)
    assert len(clips) >= 8
    for clip in clips:
        assert 2.0 <= clip["end_s"] - clip["start_s"] <= 5.0
        assert 0 <= clip["start_s"] and clip["end_s"] <= durations[clip["video_id"]]
        assert clip["clip_id"] == f"{clip['video_id']}-{round(clip['start_s'] * 1000)}-" \
                                  f"{round(clip['end_s'] * 1000)}"
        assert clip["policy"] == "subtitle_span" and clip["source"] == "manual"
    by_video: dict[str, set[str]] = {}
    for clip in clips:
        by_video.setdefault(clip["video_id"], set()).add(clip["split"])
    assert all(len(s) == 1 for s in by_video.values())
    segments = corpus.read("segments").num_rows
    assert len(clips) + sum(corpus.stats("clips").values()) <= segments


@pytest.mark.slow
def test_demo_fixed_and_whole(demo_corpus, tmp_path):
    fixed = _aligned(demo_corpus, tmp_path / "f", policy="fixed", length_s=3.2, candidates=3)
    clips = fixed.read("clips").to_pylist()
    assert len(clips) == fixed.read("segments").num_rows
    for clip in clips:
        assert clip["end_s"] - clip["start_s"] == pytest.approx(3.2, abs=1e-3)
        assert clip["candidates"][0] == clip["text"] and len(clip["candidates"]) == 3
    whole = _aligned(demo_corpus, tmp_path / "w", policy="whole")
    durations = _durations(whole)
    rows = whole.read("clips").to_pylist()
    assert sorted((r["video_id"], r["start_s"], r["end_s"]) for r in rows) == sorted(
        (v, 0.0, round(d, 3)) for v, d in durations.items())


@pytest.mark.slow
def test_fixed_test_list_holds_out_whole_videos(demo_corpus, tmp_path):
    first = _aligned(demo_corpus, tmp_path / "a", splits={"train": 1.0, "val": 0.0, "test": 0.0})
    chosen = first.read("clips").to_pylist()[0]
    listing = tmp_path / "test_ids.txt"
    listing.write_text(chosen["clip_id"] + "\n")
    second = _aligned(demo_corpus, tmp_path / "b", test_clip_ids=str(listing),
                      splits={"train": 1.0, "val": 0.0, "test": 0.0})
    splits = {(r["video_id"], r["split"]) for r in second.read("clips").to_pylist()}
    assert (chosen["video_id"], "test") in splits
    assert {s for v, s in splits if v != chosen["video_id"]} == {"train"}
