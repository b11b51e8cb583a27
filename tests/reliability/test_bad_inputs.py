"""Bad inputs never crash a run and never vanish (issue #10).

Each bad input goes through the real stage functions (``run_stage`` with the stages' context,
``discover`` for lists) and must end as a row of its stage's output table or of ``errors``
(bad_input or permanent, with a message that says what is wrong) while the inputs next to it
carry on. Media and subtitles are made with ffmpeg; downloads run yt-dlp against a server on
127.0.0.1 that misbehaves on purpose.

Every case counts into the session's "bad inputs" tally, printed at the end of the run as
"bad inputs tried: N, crashes: 0, items lost: 0": a crash is an exception out of a stage (or,
in the property test, out of the subtitle parser or the aligner), a lost item an input that is
neither in its stage's output table nor in ``errors``.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import require_binaries
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.align import stage as align
from pipeline.featurize import stage as featurize
from pipeline.transcribe import stage as transcribe
from pipeline.download import stage as download
from pipeline.config import parse_config
from pipeline.discover import discover, id_for_url
from pipeline.errors import BadInputError
from pipeline.ids import video_id
from pipeline.media import FrameRequest, FrameSpec, frame_times
from pipeline.runner import Item, Stage, StageReport, run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
from pipeline.transcribe.subtitles import MAX_SUBTITLE_BYTES, subtitle_sentences

FINAL = ("bad_input", "permanent")
VTT = ("WEBVTT\n\n00:00:00.200 --> 00:00:01.400\nHere is the kitchen.\n\n"
       "00:00:01.400 --> 00:00:02.600\nAnd this is the sink.\n")


@pytest.fixture(scope="module")
def bad(tally):
    return tally("bad inputs", "tried", "crashes", "items lost")


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", *args], check=True)


def _errors(corpus: Corpus, stage: str | None = None) -> dict[str, dict]:
    return {r["item_id"]: r for r in corpus.read("errors").to_pylist()
            if stage is None or r["stage"] == stage}


def _run(bad, stage: Stage, ctx, batch_size: int = 8) -> StageReport:
    """Run a real stage: an exception out of it is a crash; an input item neither in the
    output table nor in errors is lost."""
    keys = ctx.corpus.distinct(stage.source, stage.key) if stage.source in ctx.corpus.tables() else []
    try:
        report = run_stage(stage, ctx, batch_size=batch_size)
    except Exception:
        bad.add("crashes")
        raise
    lost = set(keys) - set(ctx.corpus.done(stage.output)) - set(_errors(ctx.corpus, stage.name))
    bad.add("items lost", len(lost))
    assert not lost, f"{stage.name} lost {sorted(lost)}"
    return report


def _discover(bad, ctx):
    try:
        return discover(ctx)
    except Exception:
        bad.add("crashes")
        raise


def _assert_error(corpus: Corpus, stage: str, item: str, says: str, kinds=FINAL) -> dict:
    row = _errors(corpus, stage).get(item)
    assert row is not None, f"{item}: no {stage} error; errors: {_errors(corpus)}"
    assert row["kind"] in kinds and says in row["message"], row
    return row


def _config(sources: list[dict], **sections) -> dict:
    return {"name": "bad-inputs", "sources": sources,
            "execution": {"retries": 0, "retry_backoff_s": 0}, **sections}


# ------------------------------------------------------------------ media, through every stage

# A name that is long, not ASCII, and holds glob and shell characters (well under 255 bytes).
LONG_NAME = ("Квартира [公寓] 🏠 tour (2019) — ünïcødé 'n' \"quotes\" & more; " * 2).strip() + ".mp4"
# Ids are ASCII: these two names differ only in characters the id replaces.
SAME_ID = ("厨房.mp4", "客厅.mp4")

# case: (file, where it ends: "features", "no clip" (its only sentences are past its end), or
# (stage, what the error says))
MEDIA: dict[str, tuple[str, object]] = {
    "zero_bytes": ("zero.mp4", ("download", "unreadable media")),
    "truncated_mp4": ("truncated.mp4", ("download", "truncated or corrupt media")),
    "html_named_mp4": ("page.mp4", ("download", "unreadable media")),
    "webm_named_mp4": ("webm.mp4", "features"),
    "audio_only": ("audio.mp4", ("download", "no video stream")),
    "video_only_for_asr": ("silent.mp4", ("transcribe", "no audio stream")),
    "zero_seconds": ("empty.mp4", ("download", "no video stream")),
    "one_frame": ("frame.mp4", "no clip"),
    "duration_nan": ("nan.mkv", "features"),
    "duration_1e9_s": ("huge.mkv", "features"),
    "variable_frame_rate": ("vfr.mp4", "features"),
    "rotated": ("rotated.mp4", "features"),
    "non_ascii_long_title": (LONG_NAME, "features"),
    "non_ascii_same_id_a": (SAME_ID[0], "features"),
    "non_ascii_same_id_b": (SAME_ID[1], "features"),
}
FPS = 2


def _mkv_claiming(source: Path, out: Path, seconds: float) -> None:
    """A copy of a Matroska file whose Duration element says ``seconds`` (NaN, 1e9): an 8-byte
    float in the segment's timecode unit (milliseconds, as ffmpeg writes it)."""
    data = source.read_bytes()
    at = data.find(b"\x44\x89\x88")
    assert at > 0, "no 8-byte Duration element"
    out.write_bytes(data[: at + 3] + struct.pack(">d", seconds * 1000) + data[at + 11:])


def _make_media(folder: Path, work: Path) -> None:
    good = folder / "good.mp4"
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=10:duration=3", "-f", "lavfi", "-i",
            "sine=duration=3", "-c:v", "libx264", "-g", "10", "-pix_fmt", "yuv420p", "-c:a", "aac",
            "-movflags", "+faststart", str(good))
    data = good.read_bytes()
    (folder / "zero.mp4").write_bytes(b"")
    (folder / "truncated.mp4").write_bytes(data[: len(data) * 4 // 10])
    (folder / "page.mp4").write_text("<!DOCTYPE html><html><body>not a video</body></html>")
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=10:duration=3", "-c:v", "libvpx",
            "-f", "webm", str(folder / "webm.mp4"))
    _ffmpeg("-f", "lavfi", "-i", "sine=duration=3", "-c:a", "aac", str(folder / "audio.mp4"))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=10:duration=3", "-c:v", "libx264",
            "-pix_fmt", "yuv420p", str(folder / "silent.mp4"))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=10", "-t", "0", "-c:v", "libx264",
            str(folder / "empty.mp4"))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=10", "-frames:v", "1", "-c:v",
            "libx264", "-pix_fmt", "yuv420p", str(folder / "frame.mp4"))
    mkv = work / "two_seconds.mkv"
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=10:duration=2", "-f", "lavfi", "-i",
            "sine=duration=2", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac", str(mkv))
    _mkv_claiming(mkv, folder / "nan.mkv", float("nan"))
    _mkv_claiming(mkv, folder / "huge.mkv", 1e9)
    # From 1 s on only every 10th frame is kept.
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=25:duration=3", "-vf",
            "select='lt(n,25)+not(mod(n,10))'", "-fps_mode", "vfr", "-c:v", "libx264",
            "-pix_fmt", "yuv420p", str(folder / "vfr.mp4"))
    _ffmpeg("-i", str(good), "-c", "copy", "-metadata:s:v:0", "rotate=90", str(folder / "rotated.mp4"))
    for name in (LONG_NAME, *SAME_ID):
        shutil.copyfile(good, folder / name)
    for media in folder.iterdir():
        if media.name != "silent.mp4":  # ASR is its only text source
            (folder / f"{media.stem}.en.vtt").write_text(VTT)


@pytest.fixture(scope="module")
def media_run(tmp_path_factory, bad):
    """The bad media in one folder next to a good video, through discover, download,
    transcribe, align (whole videos) and featurize (resnet34, random weights, tiny frames)."""
    require_binaries("ffmpeg", "ffprobe")
    base = tmp_path_factory.mktemp("bad-media")
    folder = base / "videos"
    folder.mkdir()
    _make_media(folder, base)
    cfg = parse_config(_config(
        [{"type": "folder", "path": str(folder)}],
        transcribe={"prefer": ["manual", "asr"]},
        align={"policy": "whole"},
        features={"extractors": [{"name": "resnet34", "fps": FPS, "weights": "none",
                                  "batch_size": 16, "short_side": 64, "crop": 48}],
                  "device": "cpu", "clips_per_commit": 64}))
    ctx = context(Corpus(str(base / "corpus")), cfg)
    _discover(bad, ctx)
    for stage in (download.STAGE, transcribe.STAGE, align.STAGE, *featurize.stages(cfg)):
        _run(bad, stage, ctx)
    ids = {Path(r["url"].removeprefix("file://")).name: r["video_id"]
           for r in ctx.corpus.read("videos").to_pylist()}
    return ctx.corpus, ids


@pytest.mark.slow
def test_the_good_video_next_to_them_gets_its_features(media_run):
    corpus, ids = media_run
    clips = [c for c in corpus.read("clips").to_pylist() if c["video_id"] == ids["good.mp4"]]
    assert [(c["start_s"], c["end_s"]) for c in clips] == [(0.0, 3.0)]
    assert corpus.done("features/resnet34").get(clips[0]["clip_id"]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("case", list(MEDIA))
def test_bad_media(media_run, bad, case):
    bad.add("tried")
    corpus, ids = media_run
    name, outcome = MEDIA[case]
    assert name in ids, f"{name} was not discovered: {sorted(ids)}"
    vid = ids[name]
    downloads = {r["video_id"]: r for r in corpus.read("downloads").to_pylist()}
    clips = [c for c in corpus.read("clips").to_pylist() if c["video_id"] == vid]
    if isinstance(outcome, tuple):
        stage, says = outcome
        _assert_error(corpus, stage, vid, says)
        assert not clips
        return
    row = downloads[vid]
    if outcome == "no clip":
        assert row["duration_s"] < 0.5 and not clips
        assert corpus.done("clips")[vid] == 0  # done, with nothing in it: not lost
        return
    # Whole-video clips that stay inside the media, each with features.
    assert len(clips) == 1 and 0 < clips[0]["end_s"] <= row["duration_s"] + 1e-3
    features = {r["clip_id"]: r for r in corpus.read("features/resnet34").to_pylist()}
    feature = features[clips[0]["clip_id"]]
    request = FrameRequest("c", clips[0]["start_s"], clips[0]["end_s"], FrameSpec(fps=FPS))
    assert feature["shape"] == [len(frame_times(request)), 512]
    if case.startswith("duration_"):
        # The metadata said NaN or 1e9 s; the stream says 2 s.
        assert row["duration_s"] == pytest.approx(2.0, abs=0.1)
    if case.startswith("non_ascii"):
        assert vid.isascii() and len(vid) <= 130 and "/" not in vid
        assert row["subtitles"], "its sidecar subtitles were not found"
        title = next(r["title"] for r in corpus.read("videos").to_pylist() if r["video_id"] == vid)
        assert title == name
    if case == "non_ascii_same_id_b":
        assert ids[SAME_ID[0]] != ids[SAME_ID[1]]


# ------------------------------------------------------------------ a very long video

LONG_S = 7200
MEMORY_PROBE = textwrap.dedent("""
    import json, os, resource, sys, tempfile
    from pipeline.media import FrameRequest, FrameSpec, extract_audio, sample_frames

    def peak_mb(who=resource.RUSAGE_SELF):
        return resource.getrusage(who).ru_maxrss / 1024  # KiB on Linux

    path, n = sys.argv[1], int(sys.argv[2])
    requests = [FrameRequest(f"c{i}", i * 30.0, i * 30.0 + 3.0, FrameSpec(fps=2)) for i in range(n)]
    before = peak_mb()
    served = 0
    for key, frames in sample_frames(path, requests):
        served += frames.shape[0] if hasattr(frames, "shape") else 0
    after = peak_mb()
    with tempfile.TemporaryDirectory() as tmp:
        wav = os.path.join(tmp, "audio.wav")
        seconds = extract_audio(path, wav)
        wav_mb = os.path.getsize(wav) / 2**20
    print(json.dumps({"before_mb": before, "after_mb": after, "frames": served,
                      "ffmpeg_mb": peak_mb(resource.RUSAGE_CHILDREN), "audio_s": seconds,
                      "wav_mb": wav_mb}))
""")


@pytest.mark.slow
def test_very_long_video_streams_in_bounded_memory(tmp_path, bad):
    """Two hours (1 fps, 320x180, 8 kHz audio): accepted by the download stage, and sampling
    240 clips over all of it or extracting its audio keeps memory flat: holding its decoded
    frames would take 600 MB, its 16 kHz WAV is 220 MB."""
    require_binaries("ffmpeg", "ffprobe")
    bad.add("tried")
    folder = tmp_path / "videos"
    folder.mkdir()
    long_video = folder / "two_hours.mkv"
    _ffmpeg("-f", "lavfi", "-i", f"color=c=gray:size=320x180:rate=1:duration={LONG_S}",
            "-f", "lavfi", "-i", f"sine=frequency=300:sample_rate=8000:duration={LONG_S}",
            "-c:v", "libx264", "-preset", "ultrafast", "-g", "60", "-pix_fmt", "yuv420p",
            "-c:a", "pcm_alaw", str(long_video))
    ctx = context(Corpus(str(tmp_path / "corpus")), parse_config(
        _config([{"type": "folder", "path": str(folder)}])))
    _discover(bad, ctx)
    assert _run(bad, download.STAGE, ctx).ok == 1
    [row] = ctx.corpus.read("downloads").to_pylist()
    assert row["duration_s"] == pytest.approx(LONG_S, abs=1)

    n = LONG_S // 30
    result = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(long_video), str(n)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["frames"] == n * 6  # 3 s at 2 fps for each clip
    assert probe["after_mb"] - probe["before_mb"] < 150, probe
    assert probe["audio_s"] == pytest.approx(LONG_S, abs=1) and probe["wav_mb"] > 200
    assert probe["ffmpeg_mb"] < 150, probe  # the WAV went to disk as it was decoded


# ------------------------------------------------------------------ downloads over HTTP

MAX_MB = 0.5  # download.max_filesize_mb in these tests
TIMEOUT_S = 3  # download.timeout_s
TRICKLE_BYTES = 400 * 1024
ENDLESS_BYTES = int(32 * MAX_MB * 2**20)


class _Site:
    """An HTTP server on 127.0.0.1 answering each path of ``routes`` with its function;
    functions that stall wait on ``stop``, which is set when the server closes."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.routes: dict[str, Callable[[BaseHTTPRequestHandler], None]] = {}
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                route = routes.get(self.path.split("?")[0])
                try:
                    if route is None:
                        self.send_error(404)
                    else:
                        route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # yt-dlp hung up (a cap stopped it): what these tests want

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _send(handler, body: bytes, ctype: str = "video/mp4", length: bool = True,
          code: int = 200, headers: dict[str, str] | None = None) -> None:
    handler.send_response(code)
    handler.send_header("Content-Type", ctype)
    if length:
        handler.send_header("Content-Length", str(len(body)))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(body)


def _page(media: str, title: str = "a video", track: str | None = None) -> Callable:
    track_tag = f"<track kind='captions' src='{track}' srclang='en'>" if track else ""
    html = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
            f"<body><video controls><source src='{media}' type='video/mp4'>{track_tag}"
            f"</video></body></html>").encode()
    return lambda h: _send(h, html, "text/html; charset=utf-8")


def _routes(site: _Site, good: bytes) -> dict[str, Callable]:
    # The stalls last until the server closes: only the client's timeout ends them.
    def stall_after_headers(h):
        _send(h, b"", length=False, headers={"Content-Length": str(len(good))})
        h.wfile.write(good[:1000])
        h.wfile.flush()
        site.stop.wait()

    def stall_before_headers(h):
        site.stop.wait()

    def endless(h):  # no Content-Length, 32 times the cap (bounded: a broken cap fills no disk)
        _send(h, good, length=False)
        for _ in range(ENDLESS_BYTES // (64 * 1024)):
            if site.stop.is_set():
                return
            h.wfile.write(bytes(64 * 1024))

    def trickle(h):  # TRICKLE_BYTES (under the size cap) at 10 KB/s: 40 s
        body = good + bytes(TRICKLE_BYTES - len(good))
        _send(h, b"", length=False, headers={"Content-Length": str(len(body))})
        for at in range(0, len(body), 512):
            if site.stop.wait(0.05):
                return
            h.wfile.write(body[at:at + 512])
            h.wfile.flush()

    return {
        "/p/good.html": _page("/m/good.mp4", track="/s/good.vtt"),
        "/m/good.mp4": lambda h: _send(h, good),
        "/s/good.vtt": lambda h: _send(h, VTT.encode(), "text/vtt"),
        "/p/zero.html": _page("/m/zero.mp4"),
        "/m/zero.mp4": lambda h: _send(h, b""),
        "/p/html.html": _page("/m/html.mp4"),
        "/m/html.mp4": lambda h: _send(h, b"<html><body>gone</body></html>"),
        "/p/oversize.html": _page("/m/oversize.mp4"),
        "/m/oversize.mp4": lambda h: _send(h, good + bytes(int(2 * MAX_MB * 2**20))),
        "/p/endless.html": _page("/m/endless.mp4"),
        "/m/endless.mp4": endless,
        "/p/stall.html": _page("/m/stall.mp4"),
        "/m/stall.mp4": stall_after_headers,
        "/p/stall-page.html": stall_before_headers,
        "/p/trickle.html": _page("/m/trickle.mp4"),
        "/m/trickle.mp4": trickle,
        "/p/redirect.html": lambda h: _send(h, b"", "text/html", code=302,
                                            headers={"Location": "file:///etc/hostname"}),
        "/p/file-media.html": _page("file:///etc/hostname"),
        "/p/title.html": _page("/m/good.mp4", title="Квартира 公寓 🏠 <b>tour</b> &amp; " * 500),
    }


# page: (expected kinds, what the error says); None: downloaded.
HTTP_CASES: dict[str, tuple[tuple[str, ...], str] | None] = {
    "zero": (FINAL, "Did not get any data"),
    "html": (FINAL, "unreadable media"),
    "oversize": (("bad_input",), "larger than max-filesize"),
    "endless": (("bad_input",), "larger than download.max_filesize_mb"),
    # Silence: yt-dlp's socket timeout; a transient error (retried with backoff, and next run).
    "stall": (("transient",), "timed out"),
    "stall-page": (("transient",), "timed out"),
    "trickle": (("permanent",), "longer than download.timeout_s"),
    "redirect": (("bad_input",), "file:///etc/hostname"),
    "file-media": (("bad_input",), "file:// URLs are disabled"),
    "title": None,
}


@pytest.fixture(scope="module")
def good_mp4(tmp_path_factory) -> bytes:
    require_binaries("ffmpeg", "ffprobe")
    path = tmp_path_factory.mktemp("good") / "good.mp4"
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=10:duration=3", "-c:v", "libx264",
            "-pix_fmt", "yuv420p", "-movflags", "+faststart", str(path))
    return path.read_bytes()


@pytest.fixture
def site(good_mp4):
    site = _Site()
    site.routes.update(_routes(site, good_mp4))
    yield site
    site.close()


def test_bad_downloads_are_capped_and_recorded_quickly(site, tmp_path, bad):
    bad.add("tried", len(HTTP_CASES))
    urls = {name: f"{site.url}/p/{name}.html" for name in [*HTTP_CASES, "good"]}
    cfg = parse_config(_config(
        [{"type": "urls", "urls": list(urls.values())}],
        download={"max_filesize_mb": MAX_MB, "timeout_s": TIMEOUT_S, "retries": 0,
                  "concurrency": len(urls), "subtitle_langs": ["en"]}))
    ctx = context(Corpus(str(tmp_path / "corpus")), cfg)
    _discover(bad, ctx)
    # Unbounded, the stalls would hold the stage until the server closes (after this test).
    report = _run(bad, download.STAGE, ctx, batch_size=len(urls))
    ids = {name: video_id(*id_for_url(url)) for name, url in urls.items()}
    downloads = {r["video_id"]: r for r in ctx.corpus.read("downloads").to_pylist()}
    for name, expected in HTTP_CASES.items():
        if expected is None:
            continue
        kinds, says = expected
        _assert_error(ctx.corpus, "download", ids[name], says, kinds)
    # The caps cut each short: yt-dlp read with download.timeout_s, the trickle and the
    # endless body were stopped before their ends.
    errors = _errors(ctx.corpus, "download")
    assert f"(read timeout={float(TIMEOUT_S)})" in errors[ids["stall-page"]]["message"]
    for name, sent in (("trickle", TRICKLE_BYTES), ("endless", ENDLESS_BYTES)):
        stopped = re.search(r"stopped after (\d+) bytes", errors[ids[name]]["message"])
        assert stopped and int(stopped.group(1)) < sent, errors[ids[name]]
    assert report.ok == 2
    for name in ("good", "title"):
        row = downloads[ids[name]]
        assert row["media_path"] == f"media/{ids[name]}.mp4" and row["duration_s"] == 3.0
    assert downloads[ids["good"]]["subtitles"][0]["lang"] == "en"
    # Nothing half-downloaded is left behind, and no local file was fetched.
    media = sorted(p.name for p in (tmp_path / "corpus" / "media").iterdir())
    assert media == sorted(f"{ids[n]}.mp4" for n in ("good", "title"))
    hostname = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else None
    for path in (tmp_path / "corpus").rglob("*"):
        assert not path.is_file() or hostname is None or path.read_bytes() != hostname


def test_file_urls_are_refused_at_download_unless_allowed(tmp_path, bad, good_mp4):
    """A videos row with a file:// URL (found under a config that allowed it, say) is refused
    by the download stage; allowed, the listed local file downloads like any other."""
    bad.add("tried", 3)
    media = tmp_path / "local.mp4"
    media.write_bytes(good_mp4)
    urls = [f"file://{media}", "ftp://127.0.0.1/v.mp4", "data:video/mp4;base64,AAAA"]
    refused = Corpus(str(tmp_path / "refused"))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [{"video_id": f"list-{i}", "url": url, "extractor": "generic", "source": "list",
             "discovered_at": now} for i, url in enumerate(urls)]
    refused.init_partitions(2)
    refused.write_partitioned("videos", rows, "all", done=[r["video_id"] for r in rows])
    ctx = context(refused, parse_config(_config([{"type": "urls", "urls": ["http://x/"]}])))
    assert _run(bad, download.STAGE, ctx).errors == {"bad_input": 3}
    for i, scheme in enumerate(("file", "ftp", "data")):
        _assert_error(refused, "download", f"list-{i}", f"scheme {scheme!r} is not allowed")

    listing = tmp_path / "local.txt"
    listing.write_text(f"file://{media}\n")
    allowed = context(Corpus(str(tmp_path / "allowed")), parse_config(_config(
        [{"type": "list", "path": str(listing)}],
        download={"allowed_schemes": ["http", "https", "file"]})))
    _discover(bad, allowed)
    assert _run(bad, download.STAGE, allowed).ok == 1
    [row] = allowed.corpus.read("downloads").to_pylist()
    assert row["duration_s"] == 3.0 and row["bytes"] == len(good_mp4)


# ------------------------------------------------------------------ subtitles, through transcribe and align

def _cues(*cues: tuple[float, float, str]) -> str:
    def ts(s: float) -> str:
        return f"{int(s // 3600):02d}:{int(s % 3600 // 60):02d}:{s % 60:06.3f}"
    return "WEBVTT\n\n" + "".join(f"{ts(a)} --> {ts(b)}\n{text}\n\n" for a, b, text in cues)


SPEECH = [(1.0, 3.0, "Here is the kitchen."), (3.5, 5.5, "The oven is new."),
          (6.0, 8.0, "And this is the window.")]
DURATION_S = 10.0


def _subtitle_cases(folder: Path) -> dict[str, str]:
    """Subtitle files (as written into subs/) by case name."""
    rng = random.Random(0)
    files = {
        "utf16_bom": _cues(*SPEECH).encode("utf-16"),
        "latin1": _cues((1.0, 3.0, "Voilà le café."), (3.5, 5.5, "Très joli.")).encode("latin-1"),
        "garbage_bytes": bytes(rng.randrange(256) for _ in range(5000)),
        "out_of_order": _cues(*reversed(SPEECH)).encode(),
        "end_before_start": _cues(SPEECH[0], (5.5, 3.5, "Backwards."), SPEECH[2]).encode(),
        "beyond_media": _cues(*SPEECH, (20.0, 22.0, "Said after the end."),
                              (40.0, 45.0, "Long after.")).encode(),
        "html_script": _cues(
            (1.0, 3.0, '<script>alert("pwned")</script>Here is the kitchen.'),
            (3.5, 5.5, '<img src=x onerror=alert(1)>The oven is <b onclick="evil()">new</b>.'),
            (6.0, 8.0, "&lt;script&gt;document.cookie&lt;/script&gt;And the "
                       '<a href="javascript:alert(1)">window</a>.'),
            (8.0, 9.5, "<style>p{}</style><!-- a comment --> A <iframe src='http://x'></iframe>sofa."),
        ).encode(),
        "no_cues": b"WEBVTT\nKind: captions\n\nNOTE nothing is said\n",
    }
    for name, data in files.items():
        (folder / f"{name}.en.vtt").write_bytes(data)
    # 50 MB, written in blocks.
    block = _cues(*SPEECH).encode()[len("WEBVTT\n\n"):] * 1000
    with open(folder / "huge_50mb.en.vtt", "wb") as handle:
        handle.write(b"WEBVTT\n\n")
        while handle.tell() < 50 * 2**20:
            handle.write(block)
    return {name: f"subs/{name}.en.vtt" for name in [*files, "huge_50mb"]}


EXPECTED_TEXT = {
    "utf16_bom": [s[2] for s in SPEECH],
    "latin1": ["Voilà le café.", "Très joli."],
    "out_of_order": [s[2] for s in SPEECH],
    "end_before_start": [SPEECH[0][2], SPEECH[2][2]],
    "beyond_media": [s[2] for s in SPEECH] + ["Said after the end.", "Long after."],
    "html_script": ["Here is the kitchen.", "The oven is new.", "And the window.", "A sofa."],
    "no_cues": [],
}
SUBTITLE_ERRORS = {"garbage_bytes": "not a subtitle file",
                   "huge_50mb": f"over the {MAX_SUBTITLE_BYTES // 2**20} MB limit"}


def test_bad_subtitles(tmp_path, bad, monkeypatch):
    root = tmp_path / "corpus"
    (root / "subs").mkdir(parents=True)
    paths = _subtitle_cases(root / "subs")
    bad.add("tried", len(paths))
    corpus = Corpus(str(root))
    corpus.init_partitions(2)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [{"video_id": f"demo-{name}", "media_path": f"media/demo-{name}.mp4",
             "subtitles": [{"lang": "en", "kind": "manual", "path": path}], "duration_s": DURATION_S,
             "has_audio": False, "status": "ok", "downloaded_at": now}
            for name, path in paths.items()]
    corpus.write_partitioned("downloads", rows, "subs", done=[r["video_id"] for r in rows])
    ctx = context(corpus, parse_config(_config(
        [{"type": "urls", "urls": ["http://x/"]}], transcribe={"prefer": ["manual"]},
        align={"policy": "fixed", "length_s": 3.2, "candidates": 2})))
    parsed: list[int] = []  # the size of each file the stage hands the parser

    def parse(data, *args, **kwargs):
        parsed.append(len(data))
        return subtitle_sentences(data, *args, **kwargs)

    monkeypatch.setattr(transcribe, "subtitle_sentences", parse)
    _run(bad, transcribe.STAGE, ctx)
    # The 50 MB file is refused by its size: never read whole, never parsed.
    assert len(parsed) == len(paths) - 1 and max(parsed) <= MAX_SUBTITLE_BYTES, parsed
    _run(bad, align.STAGE, ctx)

    for name, says in SUBTITLE_ERRORS.items():
        row = _assert_error(corpus, "transcribe", f"demo-{name}", says, ("bad_input",))
        assert "subtitles en (manual)" in row["message"]
    segments: dict[str, list[dict]] = {}
    for row in sorted(corpus.read("segments").to_pylist(), key=lambda r: r["index"]):
        segments.setdefault(row["video_id"], []).append(row)
    for name, texts in EXPECTED_TEXT.items():
        got = segments.get(f"demo-{name}", [])
        assert [s["text"] for s in got] == texts, name
        starts = [s["start_s"] for s in got]
        assert starts == sorted(starts) and all(s["end_s"] > s["start_s"] for s in got), name
        assert not any(c in s["text"] for s in got for c in "<>"), name
    assert corpus.done("segments")["demo-no_cues"] == 0
    clips = corpus.read("clips").to_pylist()
    assert clips
    for clip in clips:
        assert 0 <= clip["start_s"] < clip["end_s"] <= DURATION_S, clip
    # Narrations past the media's end get no clip (and are counted as dropped).
    beyond = [c["text"] for c in clips if c["video_id"] == "demo-beyond_media"]
    assert beyond == [s[2] for s in SPEECH]
    assert corpus.stats("clips").get("dropped:beyond_media") == 2


# ------------------------------------------------------------------ lists and URL schemes

def test_bad_lists_duplicates_and_schemes(tmp_path, bad):
    lists = tmp_path / "lists"
    lists.mkdir()
    ok = "http://127.0.0.1:9/p/{}.html"
    refused = ["file:///etc/passwd", "FILE:///etc/passwd", "ftp://127.0.0.1/v.mp4",
               "data:video/mp4;base64,AAAA", "javascript:alert(1)", " file:///etc/shadow ",
               "not a url"]
    files = {
        # An unclosed quote: read leniently it would swallow the records after it.
        "unclosed.csv": f'url\n"{ok.format("a")}\n{ok.format("b")}\n'.encode(),
        "junk.csv": bytes(range(256)) * 8,
        "latin1.csv": f"url\n{ok.format('café')}\n".encode("latin-1"),
        "no_url_column.csv": f"link\n{ok.format('c')}\n".encode(),
        # Records: a span, no URL, a NUL inside, spans of inf/nan and -1/1e400, a repeat.
        "cells.csv": (f"url,start,end\n{ok.format('d')},1,2\n,3,4\n"
                      f"{ok.format('n')}\x00{ok.format('e')},,\n{ok.format('f')},inf,nan\n"
                      f"{ok.format('g')},-1,1e400\n{ok.format('d')},5,6\n").encode(),
        "schemes.txt": "".join(f"{url}\n" for url in [*refused, ok.format("h")]).encode(),
        "junk.parquet": b"PAR1" + bytes(range(256)) + b"PAR1",
    }
    for name, data in files.items():
        (lists / name).write_bytes(data)
    # Ids: a null, an empty and a blank one, a repeat; URLs that are numbers; a repeated URL.
    pq.write_table(pa.table({"vid": ["AAAAAAAAAAA", None, "", " ", "AAAAAAAAAAA", "BBBBBBBBBBB"]}),
                   lists / "ids.parquet")
    pq.write_table(pa.table({"url": [1, 2]}), lists / "ints.parquet")
    pq.write_table(pa.table({"url": [ok.format("dup"), ok.format("dup")]}), lists / "dups.parquet")
    sources = [{"type": "list", "path": str(lists / name)} for name in files if name != "cells.csv"]
    sources += [
        {"type": "list", "path": str(lists / "cells.csv"), "start_column": "start",
         "end_column": "end"},
        {"type": "list", "path": str(lists / "ids.parquet"), "id_column": "vid",
         "url_template": "https://www.youtube.com/watch?v={id}"},
        {"type": "list", "path": str(lists / "ints.parquet")},
        {"type": "list", "path": str(lists / "dups.parquet")},
        {"type": "urls", "urls": [ok.format("dup"), "https://youtu.be/AAAAAAAAAAA"]},
    ]
    ctx = context(Corpus(str(tmp_path / "corpus")), parse_config(_config(sources)))
    report = _discover(bad, ctx)
    errors = _errors(ctx.corpus, "discover")
    videos = {r["video_id"]: r for r in ctx.corpus.read("videos").to_pylist()}

    # Every input, and where it must be: (errors item, what it says) or a video's URL.
    whole_lists = {"unclosed.csv": "malformed csv", "junk.csv": "not UTF-8",
                   "latin1.csv": "not UTF-8", "no_url_column.csv": "no column(s) url",
                   "junk.parquet": "unreadable parquet"}
    expected: list[tuple[str, str]] = [(f"list:{lists / n}", says) for n, says in whole_lists.items()]
    expected += [(f"list:{lists / 'cells.csv'}#2", "has no url"),
                 (f"list:{lists / 'cells.csv'}#3", "control characters")]
    expected += [(f"list:{lists / 'ids.parquet'}#{n}", "has no vid") for n in (2, 3, 4)]
    expected += [(url.strip(), "is not allowed") for url in [*refused, "1", "2"]]
    bad.add("tried", len(expected) + 6)  # + 2 nonsense spans, 4 repeats (d, ids, dup, youtu.be)
    found = [ok.format(n) for n in ("d", "d", "f", "g", "h", "dup", "dup", "dup")]
    found += ["https://www.youtube.com/watch?v=AAAAAAAAAAA"] * 2 + ["https://youtu.be/AAAAAAAAAAA",
                                                                  "https://www.youtube.com/watch?v=BBBBBBBBBBB"]
    lost = [item for item, _ in expected if item not in errors]
    lost += [url for url in found if video_id(*id_for_url(url)) not in videos]
    bad.add("items lost", len(lost))
    assert not lost, lost
    for item, says in expected:
        assert errors[item]["kind"] == "bad_input" and says in errors[item]["message"], errors[item]
    by_url = {r["url"]: r for r in videos.values()}
    assert (by_url[ok.format("d")]["start_s"], by_url[ok.format("d")]["end_s"]) == (1.0, 2.0)
    for name in ("f", "g"):  # nonsense spans are dropped, the videos kept
        assert (by_url[ok.format(name)]["start_s"], by_url[ok.format(name)]["end_s"]) == (None, None)
    assert len(videos) == report.added == 7 and report.duplicates == 5
    assert len(errors) == len(expected)
    # A rerun finds the same, adds nothing and replaces its error rows.
    again = _discover(bad, ctx)
    assert again.added == 0 and len(_errors(ctx.corpus, "discover")) == len(errors)


# ------------------------------------------------------------------ property: parser and aligner

_WORDS = ["the", "kitchen", "is", "here.", "Look!", "a", "sofa,", "[Music]", "(APPLAUSE)", ">>",
          "JOHN:", "<b>bold</b>", "<i>", "&amp;", "♪", "é", "公寓", "-", "...", "?", "e.g.",
          "<script>x</script>", "<!--", "-->", "<00:00:01.000><c>", "</c>", "\u200b"]


def _ts(ms: int) -> str:
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


cue_lists = st.lists(
    st.tuples(st.integers(0, 900_000), st.integers(-5_000, 30_000),
              st.lists(st.sampled_from(_WORDS), max_size=12).map(" ".join),
              st.booleans()),
    max_size=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cues=cue_lists,
       duration=st.one_of(st.none(), st.just(float("nan")), st.floats(0.001, 1000.0)),
       policy=st.sampled_from(["subtitle_span", "fixed", "whole"]),
       min_s=st.floats(0.05, 4.0), extra_s=st.floats(0.01, 6.0), length_s=st.floats(0.001, 10.0),
       listed=st.one_of(st.none(), st.tuples(st.floats(0.0, 1200.0), st.floats(0.0, 1200.0))),
       srt=st.booleans())
def test_random_cue_lists_never_crash_or_leave_the_media(bad, cues, duration, policy, min_s,
                                                          extra_s, length_s, listed, srt):
    """Random cues (out of order, overlapping, backwards, past the media, tags, rolling-caption
    word timestamps, SRT or VTT) through the subtitle parser, the transcribe stage's rows and
    the aligner: no crash, and every clip has 0 <= start < end <= the media's duration."""
    bad.add("tried")
    sep = "," if srt else "."
    blocks = []
    for n, (start, delta, text, blank_line) in enumerate(cues, start=1):
        end = max(0, start + delta)
        timing = f"{_ts(start)} --> {_ts(end)}".replace(".", sep)
        blocks.append((f"{n}\n" if srt else "") + f"{timing}\n{text}\n" + ("\n" if blank_line else ""))
    text = ("" if srt else "WEBVTT\n\n") + "".join(blocks)
    cfg = parse_config(_config([{"type": "urls", "urls": ["http://x/"]}], align={
        "policy": policy, "min_s": min_s, "max_s": min_s + extra_s, "length_s": length_s}))
    try:
        sentences, _ = subtitle_sentences(text, cfg.transcribe.sentences)
    except BadInputError:
        return  # the transcribe stage makes it an errors row
    except Exception:
        bad.add("crashes")
        raise
    rows = transcribe.segment_rows("demo-v", sentences, "manual", "en")
    if not rows:
        return  # done with no segments: the align stage has no item for it
    try:
        info = {"duration_s": duration}
        if listed is not None:
            info |= {"start_s": listed[0], "end_s": listed[1]}
        outcome = align.align_one(Item("demo-v", tuple(rows), info=info),
                                  context(Corpus("memory://unused"), cfg))
    except Exception:
        bad.add("crashes")
        raise
    assert outcome.ok
    previous_end = 0.0
    for row in rows:
        assert row["end_s"] > row["start_s"] >= previous_end - 1e-9
        previous_end = row["end_s"]
    known = duration is not None and not math.isnan(duration)
    for clip in outcome.rows:
        assert 0 <= clip["start_s"] < clip["end_s"], clip
        if known:
            assert clip["end_s"] <= duration + 1e-9, (clip, duration)
    assert len({c["clip_id"] for c in outcome.rows}) == len(outcome.rows)
