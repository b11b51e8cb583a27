"""Download details: options that pass through to yt-dlp, partial downloads of known spans,
secrets kept out of errors and logs, remote corpus roots."""

from __future__ import annotations

import logging

import pytest

from pipeline.download import stage as download
from pipeline.config import ConfigError, parse_config
from pipeline.demo import serve_demo
from pipeline.discover import discover
from pipeline.media import probe
from pipeline.runner import run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
from pipeline.download.ytdlp import base_options, classify_message

SECRET = "s3cret-pa55"


def _cfg(sources: list[dict], **download_cfg):
    return parse_config({"name": "t", "sources": sources, "download": download_cfg,
                         "execution": {"retries": 0, "retry_backoff_s": 0}})


def test_options_pass_through():
    cfg = _cfg([{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
               proxy=f"http://user:{SECRET}@127.0.0.1:3128", cookies_file="/secure/cookies.txt",
               cookies_from_browser="firefox", max_bandwidth="2M", sleep_interval_s=1,
               max_sleep_interval_s=3, user_agent="vlcorpus-test", max_filesize_mb=10,
               extractor_args=["youtube:player_client=web;po_token=web.gvs+TOKEN",
                               "youtubepot-bgutilhttp:base_url=http://127.0.0.1:4416"])
    opts = base_options(cfg.download)
    assert opts["proxy"].endswith(f"{SECRET}@127.0.0.1:3128")
    assert opts["cookiefile"] == "/secure/cookies.txt"
    assert opts["cookiesfrombrowser"] == ("firefox", None, None, None)
    assert opts["ratelimit"] == 2 * 1024 * 1024
    assert (opts["sleep_interval"], opts["max_sleep_interval"]) == (1, 3)
    assert opts["http_headers"] == {"User-Agent": "vlcorpus-test"}
    assert opts["max_filesize"] == 10 * 1024 * 1024
    assert opts["extractor_args"] == {
        "youtube": {"player_client": ["web"], "po_token": ["web.gvs+TOKEN"]},
        "youtubepot-bgutilhttp": {"base_url": ["http://127.0.0.1:4416"]}}
    assert SECRET not in repr(cfg) and SECRET not in cfg.model_dump_json()


def test_sleep_preset_is_yt_dlps_own_and_given_keys_win():
    urls = [{"type": "urls", "urls": ["http://127.0.0.1/x"]}]
    opts = base_options(_cfg(urls, preset="sleep").download)
    assert {k: opts[k] for k in ("sleep_interval_requests", "sleep_interval",
                                 "max_sleep_interval", "sleep_interval_subtitles")} == {
        "sleep_interval_requests": 0.75, "sleep_interval": 10, "max_sleep_interval": 20,
        "sleep_interval_subtitles": 5}
    assert base_options(_cfg(urls, preset="sleep", sleep_interval_s=3,
                             max_sleep_interval_s=4).download)["sleep_interval"] == 3


@pytest.mark.parametrize("key,value,says", [
    ("rate_limit", "2M", "max_bandwidth"),
    ("extractor_args", ["player_client=web"], "IE_KEY:ARGS"),
    ("cookies_from_browser", "netscape", "unsupported browser"),
    ("proxies", ["http://a:1"], "not both"),
])
def test_download_options_yt_dlp_would_refuse_stop_the_config(key, value, says):
    extra = {"proxy": "http://b:2"} if key == "proxies" else {}
    with pytest.raises(ConfigError, match=says):
        _cfg([{"type": "urls", "urls": ["http://127.0.0.1/x"]}], **{key: value}, **extra)


# The messages as yt-dlp 2026.10 raises them: YouTube's reason with the text yt-dlp adds
# (yt_dlp/extractor/youtube/_video.py `_real_extract`; the cookies hint of `_youtube_login_hint`).
_HINT = ("Use --cookies-from-browser or --cookies for the authentication. See  https://github.com/"
         "yt-dlp/yt-dlp/wiki/FAQ#how-do-i-pass-cookies-to-yt-dlp  for how to manually pass "
         "cookies. Also see  https://github.com/yt-dlp/yt-dlp/wiki/Extractors#exporting-youtube-"
         "cookies  for tips on effectively exporting YouTube cookies")
_RATE_LIMITED = ("has been rate-limited by YouTube for up to an hour. It is recommended to use "
                 "`-t sleep` to add a delay between video requests to avoid exceeding the rate "
                 "limit. For more information, refer to  https://github.com/yt-dlp/yt-dlp/wiki/"
                 "Extractors#this-content-isnt-available-try-again-later")


@pytest.mark.parametrize("message,kind", [
    # Session-wide refusals.
    (f"[youtube] dQw4w9WgXcQ: Sign in to confirm you\u2019re not a bot. {_HINT}", "blocked"),
    (f"[youtube] dQw4w9WgXcQ: Sign in to confirm you're not a bot. {_HINT}", "blocked"),
    ("[youtube] 2OoFSHhI4Vk: Video unavailable. This content isn't available, try again later. "
     f"The current session {_RATE_LIMITED}", "blocked"),
    ("[youtube] 2OoFSHhI4Vk: This content isn't available, try again later. Your account "
     f"{_RATE_LIMITED}", "blocked"),
    ("[youtube] abc: All player responses are invalid. Your IP is likely being blocked by "
     "Youtube", "blocked"),
    ("[youtube] abc: Video unavailable. YouTube is requiring a captcha challenge before "
     "playback", "blocked"),
    ("HTTP Error 429: Too Many Requests", "blocked"),
    ("[youtube] abc: Unable to download API page: HTTP Error 429: Too Many Requests", "blocked"),
    # Retried within the run.
    ("Unable to download webpage: HTTP Error 503: Service Unavailable", "transient"),
    # The network or the machine, never the video: name resolution, refused and unreachable
    # connections, TLS, proxies (yt-dlp's own words, as an offline machine gets them).
    ("[youtube] dQw4w9WgXcQ: Unable to download API page: HTTPSConnection(host='www.youtube.com', "
     "port=443): Failed to resolve 'www.youtube.com' ([Errno -2] Name or service not known) (caused by "
     "TransportError(\"...\"))", "transient"),
    ("[generic] page: Unable to download webpage: <urlopen error [Errno -3] Temporary failure in name "
     "resolution>", "transient"),
    ("[generic] x: Unable to download webpage: HTTPConnection(host='127.0.0.1', port=9): Failed to "
     "establish a new connection: [Errno 111] Connection refused", "transient"),
    ("[generic] x: Unable to download webpage: [Errno 101] Network is unreachable", "transient"),
    ("[generic] x: Unable to download webpage: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
     "failed: unable to get local issuer certificate (_ssl.c:1006)", "transient"),
    ("[generic] x: Unable to download webpage: ('Unable to connect to proxy', OSError('Tunnel "
     "connection failed: 407 Proxy Authentication Required'))", "transient"),
    # The video's own, although yt-dlp gives them the same cookies hint as the bot check.
    (f"[youtube] abc: Private video. Sign in if you've been granted access to this video. "
     f"{_HINT}", "permanent"),
    (f"[youtube] abc: Sign in to confirm your age. This video may be inappropriate for some "
     f"users. {_HINT}", "permanent"),
    ("[youtube] abc: Join this channel to get access to members-only content like this video, "
     "and other exclusive perks.", "permanent"),
    ("[youtube] abc: This video is available to this channel's members on level: Tomato (or any "
     "higher level). Join this channel to get access to members-only content and other "
     "exclusive perks.", "permanent"),
    ("[youtube] abc: The uploader has not made this video available in your country",
     "permanent"),
    ("This video is not available from your location due to geo restriction", "permanent"),
    ("[youtube] abc: Video unavailable. This video contains content from SME, who has blocked "
     "it on copyright grounds", "permanent"),
    ("[youtube] abc: Video unavailable. This video has been removed by the uploader",
     "permanent"),
    ("[youtube] abc: Video unavailable. This video is no longer available because the YouTube "
     "account associated with this video has been terminated.", "permanent"),
    ("unable to download video data: HTTP Error 404: Not Found", "permanent"),
    # A 403 alone is the video's; download weighs it against other videos (test_download_blocks).
    ("unable to download video data: HTTP Error 403: Forbidden", "permanent"),
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


def test_a_name_that_does_not_resolve_is_no_verdict_on_the_video(tmp_path):
    """Real yt-dlp on a machine where names do not resolve (``.invalid`` never does, as every
    name during a DNS outage): the video is transient, to do again, never judged lost."""
    cfg = _cfg([{"type": "urls", "urls": ["http://vlcorpus-test.invalid/page.html"]}])
    ctx = context(Corpus(str(tmp_path)), cfg)
    discover(ctx)
    report = run_stage(download.STAGE, ctx, batch_size=4)
    assert report.errors == {"transient": 1}
    (message,) = ctx.corpus.read("errors").column("message").to_pylist()
    assert "Failed to resolve 'vlcorpus-test.invalid'" in message
    again = run_stage(download.STAGE, ctx, batch_size=4)  # no --retry-failed
    assert (again.skipped_failed, again.items, again.errors) == (0, 1, {"transient": 1})


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


@pytest.mark.slow
def test_concurrent_downloads_leave_a_read_only_cookies_file_as_it_was(demo_corpus, tmp_path):
    """8 downloads at once with one cookies file: each reads a private copy (yt-dlp writes its
    jar back when it closes), so the file keeps its every byte, and an immutable one (as a
    mounted secret is) works."""
    import shutil
    import subprocess

    _, site = demo_corpus
    cookies = tmp_path / "cookies.txt"
    # Not the layout yt-dlp writes (its header, tabs, a trailing newline): any rewrite shows.
    cookies.write_bytes(b"# Netscape HTTP Cookie File\n127.0.0.1\tFALSE\t/\tFALSE\t0\tsession\tabc123")
    before = cookies.read_bytes()
    immutable = shutil.which("chattr") and subprocess.run(["chattr", "+i", str(cookies)]).returncode == 0
    try:
        with serve_demo(site) as base:
            urls = [f"{base}pages/tour-{i % 2}.html?copy={i}" for i in range(8)]
            cfg = _cfg([{"type": "urls", "urls": urls}], subtitle_langs=["en"], concurrency=8,
                       cookies_file=str(cookies), rate_limit=None, per_host=None)
            ctx = context(Corpus(str(tmp_path / "corpus")), cfg)
            discover(ctx)
            report = run_stage(download.STAGE, ctx, batch_size=8)
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(cookies)], check=True)
    assert report.ok == 8, ctx.corpus.read("errors").to_pylist()
    assert cookies.read_bytes() == before
