"""The transcribe stage on downloaded demo videos: source policy, ASR, quality checks,
failures, and `vlcorpus transcript`."""

from __future__ import annotations

import json
import re
import shutil
from datetime import UTC, datetime

import pytest
from speech import tiny_model_path, wer

from conftest import TESTS, vlcorpus
from pipeline.transcribe import stage as transcribe
from pipeline.config import parse_config
from pipeline.demo import DemoSite
from pipeline.runner import run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

pytestmark = pytest.mark.slow
DATA = TESTS / "data" / "subtitles"


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def _run(demo_corpus, tmp_path, **transcribe_cfg):
    root, site = demo_corpus
    copy = tmp_path / "corpus"
    shutil.copytree(root, copy)
    cfg = parse_config({"name": "t", "sources": [{"type": "urls", "urls": ["http://x/"]}],
                        "download": {"subtitle_langs": ["en", "en-auto"]},
                        "transcribe": transcribe_cfg, "execution": {"retry_backoff_s": 0}})
    ctx = context(Corpus(str(copy)), cfg)
    report = run_stage(transcribe.STAGE, ctx, batch_size=4)
    return ctx.corpus, report, DemoSite.load(site)


def _truth(corpus: Corpus, site: DemoSite) -> dict[str, list]:
    """Manifest sentences per video_id (videos are matched by their page URL)."""
    pages = {v.page: v for v in site.videos}
    truth = {}
    for row in corpus.read("videos").to_pylist():
        page = "pages/" + row["url"].rsplit("/pages/", 1)[-1]
        if page in pages:
            truth[row["video_id"]] = [s for sc in pages[page].scenes for s in sc.sentences]
    # Every narrated video of the site, each with something said: the tests loop over these.
    assert len(truth) == len(site.videos) > 0 and all(truth.values()), truth
    return truth


def _segments(corpus: Corpus) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in sorted(corpus.read("segments").to_pylist(), key=lambda r: r["index"]):
        out.setdefault(row["video_id"], []).append(row)
    return out


def test_manual_subtitles_win_and_match_what_is_said(demo_corpus, tmp_path):
    corpus, report, site = _run(demo_corpus, tmp_path)
    assert report.ok == 2 and not report.errors
    segments, truth = _segments(corpus), _truth(corpus, site)
    assert set(segments) == set(truth)
    for vid, said in truth.items():
        rows = segments[vid]
        assert {(r["source"], r["lang"]) for r in rows} == {("manual", "en")}
        assert [_norm(r["text"]) for r in rows] == [_norm(s.text) for s in said]
        for row, sentence in zip(rows, said):
            assert abs(row["start_s"] - sentence.start_s) < 0.3
            assert row["end_s"] - row["start_s"] > 0.3
            assert [w["text"] for w in row["words"]] == row["text"].split()
    assert validate(corpus) == []


def test_auto_captions_give_every_spoken_word_once(demo_corpus, tmp_path):
    corpus, report, site = _run(demo_corpus, tmp_path, prefer=["auto"])
    segments, truth = _segments(corpus), _truth(corpus, site)
    for vid, said in truth.items():
        rows = segments[vid]
        assert {(r["source"], r["lang"]) for r in rows} == {("auto", "en-auto")}
        words = [w["text"] for r in rows for w in r["words"]]
        assert words == [_norm(w.text) for s in said for w in s.words]
        starts = [w["start_s"] for r in rows for w in r["words"]]
        assert starts == sorted(starts)


def test_asr_with_tiny_en(demo_corpus, tmp_path):
    model = tiny_model_path()
    corpus, report, site = _run(demo_corpus, tmp_path, prefer=["asr"],
                                asr={"model": model, "beam_size": 1})
    assert report.ok == 2, report
    segments, truth = _segments(corpus), _truth(corpus, site)
    for vid, said in truth.items():
        rows = segments[vid]
        assert {r["source"] for r in rows} == {"asr:faster-whisper"}
        assert all(r["confidence"] is not None and 0 < r["confidence"] <= 1 for r in rows)
        heard = " ".join(r["text"] for r in rows)
        assert wer(" ".join(s.text for s in said), heard) < 0.15
        starts = [r["start_s"] for r in rows]
        close = [s for s in said if min(abs(s.start_s - t) for t in starts) < 0.5]
        assert len(close) >= 0.8 * len(said)


def test_quality_checks_drop_short_text(demo_corpus, tmp_path):
    corpus, report, _ = _run(demo_corpus, tmp_path, prefer=["manual", "auto"],
                             quality={"min_words": 100})
    assert report.ok == 2 and report.rows == 0  # done, with nothing kept
    assert validate(corpus) == []


def test_quality_checks_unit():
    from pipeline.config import QualityConfig
    from pipeline.transcribe.segment import Sentence, Word

    def sentence(text: str, start: float) -> Sentence:
        return Sentence([Word(w, start + i * 0.4, start + i * 0.4 + 0.3)
                         for i, w in enumerate(text.split())])

    said = [sentence("a red sofa here now", 0), sentence("A red sofa, here now!", 3),
            sentence("too short", 6), sentence("the blue lamp is bright", 8)]
    kept = transcribe.apply_quality(said, QualityConfig(min_words=5, unique_text=True))
    assert [s.text for s in kept] == ["a red sofa here now", "the blue lamp is bright"]
    assert transcribe.apply_quality(said, QualityConfig(min_speech_s=10)) == []


def test_missing_asr_model_stops_the_run_instead_of_failing_items(demo_corpus, tmp_path):
    from pipeline.transcribe.asr import AsrSetupError

    with pytest.raises(AsrSetupError, match="no-such-model"):
        _run(demo_corpus, tmp_path, prefer=["asr"], asr={"model": "no-such-model"})


def _fake_download(corpus: Corpus, vid: str, subs: list[dict], has_audio: bool) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    corpus.write_partitioned("downloads", [{"video_id": vid, "media_path": None, "subtitles": subs,
                                            "has_audio": has_audio, "status": "ok",
                                            "downloaded_at": now}], f"fake-{vid}", done=[vid])


def test_unusable_text_sources_are_errors_and_sound_only_is_empty(tmp_path):
    root = tmp_path / "corpus"
    (root / "subs").mkdir(parents=True)
    (root / "subs" / "junk.en.vtt").write_bytes(bytes(range(256)) * 4)
    (root / "subs" / "music.en.vtt").write_text(
        "WEBVTT\n\n00:00:01.000 --> 00:00:04.000\n[Music]\n\n"
        "00:00:05.000 --> 00:00:07.000\n(APPLAUSE)\n")
    corpus = Corpus(str(root))
    corpus.init_partitions(2)
    _fake_download(corpus, "demo-junk", [{"lang": "en", "kind": "manual",
                                          "path": "subs/junk.en.vtt"}], has_audio=False)
    _fake_download(corpus, "demo-music", [{"lang": "en", "kind": "manual",
                                           "path": "subs/music.en.vtt"}], has_audio=False)
    _fake_download(corpus, "demo-nothing", [], has_audio=True)
    cfg = parse_config({"name": "t", "sources": [{"type": "urls", "urls": ["http://x/"]}],
                        "transcribe": {"prefer": ["manual", "auto"]}})
    report = run_stage(transcribe.STAGE, context(corpus, cfg), batch_size=4)
    errors = {r["item_id"]: r for r in corpus.read("errors").to_pylist()}
    assert set(errors) == {"demo-junk", "demo-nothing"}
    assert errors["demo-junk"]["kind"] == "bad_input"
    assert "subtitles en (manual)" in errors["demo-junk"]["message"]
    assert "no text source" in errors["demo-nothing"]["message"]
    assert corpus.done("segments") == {"demo-music": 0}
    assert report.ok == 1


def test_transcript_command_on_subtitles_and_media(demo_corpus):
    result = vlcorpus("transcript", str(DATA / "c04_crlf_hoursless_multiline_bold_libwebvtt.vtt"))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines and all(set(r) == {"start", "end", "text", "source"} for r in lines)
    assert lines[0]["start"] == 11.0 and "<b>" not in lines[0]["text"]

    root, _ = demo_corpus
    media = sorted((root / "media").glob("*.mp4"))[0]
    result = vlcorpus("transcript", str(media), "--model", tiny_model_path())
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows and {r["source"] for r in rows} == {"asr:faster-whisper"}

    missing = vlcorpus("transcript", str(media), "--model", "no-such-model")
    assert missing.returncode == 1 and "no-such-model" in missing.stderr
