"""Download details: options that pass through to yt-dlp, partial downloads of known spans,
secrets kept out of errors and logs, remote corpus roots."""

from __future__ import annotations

import logging

import pytest

from pipeline import download
from pipeline.config import parse_config
from pipeline.demo import serve_demo
from pipeline.discover import discover
from pipeline.media import probe
from pipeline.runner import run_stage
from pipeline.stages import context
from pipeline.storage import Corpus
from pipeline.ytdlp import base_options, classify_message

SECRET = "s3cret-pa55"


def _cfg(sources: list[dict], **download_cfg):
    return parse_config({"name": "t", "sources": sources, "download": download_cfg,
                         "execution": {"retries": 0, "retry_backoff_s": 0}})


def test_options_pass_through():
    cfg = _cfg([{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
               proxy=f"http://user:{SECRET}@127.0.0.1:3128", cookies_file="/secure/cookies.txt",
               rate_limit="2M", sleep_interval_s=1, max_sleep_interval_s=3,
               user_agent="vlcorpus-test", max_filesize_mb=10)
    opts = base_options(cfg.download)
    assert opts["proxy"].endswith(f"{SECRET}@127.0.0.1:3128")
    assert opts["cookiefile"] == "/secure/cookies.txt"
    assert opts["ratelimit"] == 2 * 1024 * 1024
    assert (opts["sleep_interval"], opts["max_sleep_interval"]) == (1, 3)
    assert opts["http_headers"] == {"User-Agent": "vlcorpus-test"}
    assert opts["max_filesize"] == 10 * 1024 * 1024
    assert SECRET not in repr(cfg) and SECRET not in cfg.model_dump_json()


@pytest.mark.parametrize("message,kind", [
    ("HTTP Error 429: Too Many Requests", "transient"),
    ("Unable to download webpage: HTTP Error 503: Service Unavailable", "transient"),
    ("[youtube] abc: Private video. Sign in if you've been granted access", "permanent"),
    ("[youtube] abc: Video unavailable. This video has been removed by the uploader",
     "permanent"),
    ("The uploader has not made this video available in your country", "permanent"),
    ("unable to download video data: HTTP Error 404: Not Found", "permanent"),
    ("Unsupported URL: http://127.0.0.1/notavideo", "bad_input"),
    ("[html5] x: Requested format is not available", "bad_input"),
])
def test_yt_dlp_messages_are_classified(message, kind):
    assert classify_message(message).value == kind


def test_secrets_stay_out_of_errors_and_logs(tmp_path, caplog):
    cfg = _cfg([{"type": "urls", "urls": ["http://127.0.0.1:9/page.html"]}],
               proxy=f"http://user:{SECRET}@127.0.0.1:9")
    ctx = context(Corpus(str(tmp_path)), cfg)
    discover(ctx)
    with caplog.at_level(logging.DEBUG, logger="vlcorpus"):
        report = run_stage(download.STAGE, ctx, batch_size=4)
    assert report.errors == {"transient": 1}
    messages = " ".join(ctx.corpus.read("errors").column("message").to_pylist())
    assert "proxy" in messages.lower() or "connect" in messages.lower()
    assert SECRET not in messages and SECRET not in caplog.text


@pytest.mark.slow
def test_partial_download_of_a_known_span(demo_corpus, tmp_path):
    _, site = demo_corpus
    with serve_demo(site) as base:
        listing = tmp_path / "spans.csv"
        listing.write_text(f"url,start,end\n{base}pages/tour-0.html,6,9\n")
        cfg = _cfg([{"type": "list", "path": str(listing), "start_column": "start",
                     "end_column": "end"}], partial=True, section_padding_s=1.0,
                   subtitle_langs=["en"])
        ctx = context(Corpus(str(tmp_path / "corpus")), cfg)
        discover(ctx)
        report = run_stage(download.STAGE, ctx, batch_size=4)
    assert report.ok == 1, ctx.corpus.read("errors").to_pylist()
    row = ctx.corpus.read("downloads").to_pylist()[0]
    assert row["status"] == "partial"
    duration = probe(str(tmp_path / "corpus" / row["media_path"])).duration_s
    assert 4.0 <= duration <= 6.5  # 3 s span + 1 s padding each side, keyframe slack


@pytest.mark.slow
def test_remote_root_gets_files_uploaded(demo_corpus, memory_root):
    _, site = demo_corpus
    with serve_demo(site) as base:
        cfg = _cfg([{"type": "urls", "urls": [f"{base}pages/tour-1.html"]}],
                   subtitle_langs=["en"])
        ctx = context(Corpus(memory_root), cfg)
        discover(ctx)
        assert run_stage(download.STAGE, ctx, batch_size=4).ok == 1
    row = ctx.corpus.read("downloads").to_pylist()[0]
    assert ctx.corpus.fs.size(ctx.corpus.path(row["media_path"])) == row["bytes"]
    assert ctx.corpus.fs.cat(ctx.corpus.path(row["subtitles"][0]["path"])).startswith(b"WEBVTT")


@pytest.mark.slow
def test_folder_media_is_checked_in_place_with_sidecars(demo_corpus, tmp_path):
    _, site = demo_corpus
    folder = tmp_path / "on-disk"
    folder.mkdir()
    (folder / "tour.mp4").write_bytes((site / "media" / "tour-0.mp4").read_bytes())
    (folder / "tour.en.vtt").write_bytes((site / "subs" / "tour-0.en.vtt").read_bytes())
    (folder / "cut.mp4").write_bytes((site / "media" / "broken.mp4").read_bytes())
    cfg = _cfg([{"type": "folder", "path": str(folder)}])
    ctx = context(Corpus(str(tmp_path / "corpus")), cfg)
    discover(ctx)
    report = run_stage(download.STAGE, ctx, batch_size=4)
    assert (report.ok, report.errors) == (1, {"bad_input": 1})
    row = ctx.corpus.read("downloads").to_pylist()[0]
    assert row["media_path"] == str(folder / "tour.mp4")  # referenced, not copied
    assert row["subtitles"] == [{"lang": "en", "kind": "manual",
                                 "path": str(folder / "tour.en.vtt")}]
    assert (folder / "cut.mp4").exists()  # the user's own files are never deleted
