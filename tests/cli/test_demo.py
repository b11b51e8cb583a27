"""The offline demo site: media, captions faithful to the audio, determinism, HTTP serving."""

from __future__ import annotations

import array
import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
import webvtt
import yt_dlp

from pipeline import demo
from pipeline.demo import BadPage, DemoSite, Word, auto_vtt, make_demo_media, serve_demo
from pipeline.demo.pictures import frame_ppm

HEADER = "WEBVTT\nKind: captions\nLanguage: en\n\n"
TIMING = re.compile(r"^(\S+) --> (\S+)(.*)$")
INLINE = re.compile(r"<(\d\d:\d\d:\d\d\.\d{3})><c> ([^<]+)</c>")


def secs(stamp: str) -> float:
    h, m, s = stamp.split(":")
    return round(int(h) * 3600 + int(m) * 60 + float(s), 3)


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def cues(path: Path) -> list[tuple[float, float, str, list[str]]]:
    """(start, end, settings, lines) of each cue, read straight from the file."""
    blocks = path.read_text(encoding="utf-8").split("\n\n")[1:]
    out = []
    for block in filter(None, blocks):
        timing, *lines = block.split("\n")
        start, end, settings = TIMING.match(timing).groups()
        out.append((secs(start), secs(end), settings.strip(), lines))
    return out


def sentences(video: demo.DemoVideo) -> list[demo.Sentence]:
    return [s for scene in video.scenes for s in scene.sentences]


def peak(samples: array.array, rate: int, t0: float, t1: float) -> int:
    return max((abs(x) for x in samples[max(int(t0 * rate), 0) : int(t1 * rate)]), default=0)


# ---------------------------------------------------------------- fast unit tests


def test_auto_vtt_rolling_layout_from_words():
    words = [Word("[Music]", 0.0, 1.5)] + [
        Word(w, 2.0 + 0.3 * i, 2.25 + 0.3 * i) for i, w in enumerate("here is the red sofa".split())
    ] + [Word("bye", 6.0, 6.4)]
    text = auto_vtt(words, 8.0, [12] * len(words))
    assert text.startswith(HEADER)
    blocks = text[len(HEADER) :].strip("\n").split("\n\n")
    assert blocks == [
        "00:00:00.000 --> 00:00:01.990 align:start position:0%\n \n[Music]",
        "00:00:01.990 --> 00:00:02.000 align:start position:0%\n[Music]\n ",
        "00:00:02.000 --> 00:00:02.890 align:start position:0%\n[Music]\n"
        "here<00:00:02.300><c> is</c><00:00:02.600><c> the</c>",
        "00:00:02.890 --> 00:00:02.900 align:start position:0%\nhere is the\n ",
        "00:00:02.900 --> 00:00:05.990 align:start position:0%\nhere is the\nred<00:00:03.200><c> sofa</c>",
        # 2.25 s of silence before "bye": the screen is cleared.
        "00:00:05.990 --> 00:00:06.000 align:start position:0%\n \n ",
        "00:00:06.000 --> 00:00:06.900 align:start position:0%\n \nbye",
    ]


def test_missing_tool_names_binary_and_install(monkeypatch):
    monkeypatch.setattr("pipeline.demo.site.shutil.which", lambda name: None if name == "espeak-ng" else "/bin/x")
    with pytest.raises(RuntimeError, match=r"espeak-ng.*apt-get install -y ffmpeg espeak-ng"):
        make_demo_media(Path("/nonexistent"), n_videos=1)


def test_shapes_are_distinct_and_big():
    frames = {shape: frame_ppm(shape, (255, 0, 0)) for shape in set(demo.OBJECT_SHAPES.values())}
    assert len(set(frames.values())) == len(frames)
    for shape, frame in frames.items():
        red = frame.count(b"\xff\x00\x00")
        assert red > 0.08 * demo.WIDTH * demo.HEIGHT, shape


def test_page_urls_include_bad_pages():
    video = demo.DemoVideo("tour-0", "t", "pages/tour-0.html", "media/tour-0.mp4", {}, 20.0, 0.0, [])
    site = DemoSite(Path("x"), 0, [video], [BadPage("pages/gone.html", "media/gone.mp4", "missing")])
    assert site.page_urls("http://127.0.0.1:8000/") == [
        "http://127.0.0.1:8000/pages/tour-0.html",
        "http://127.0.0.1:8000/pages/gone.html",
    ]


# ---------------------------------------------------------------- generated site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> DemoSite:
    made = make_demo_media(tmp_path_factory.mktemp("demo"), n_videos=2, seed=0, quiet=True)
    assert len(made.videos) == 2  # each test checks every video: none would pass them all
    return made


@pytest.mark.slow
def test_layout_and_manifest(site):
    root = site.out_dir
    for name in ["index.html", "manifest.json", "pages/broken.html", "pages/gone.html", "media/broken.mp4"]:
        assert (root / name).is_file(), name
    assert not (root / "media/gone.mp4").exists()
    assert DemoSite.load(root) == site
    for video in site.videos:
        assert 15 <= video.duration_s <= 30
        assert 3 <= len(video.scenes) <= 6
        page = (root / video.page).read_text()
        assert f'<source src="../{video.media}" type="video/mp4">' in page
        assert f'<track kind="captions" src="../{video.subs["en"]}" srclang="en" label="English">' in page
        for scene in video.scenes:
            assert scene.end_s - scene.start_s >= 2.5
            assert demo.OBJECT_SHAPES[scene.object] == scene.shape
            spoken = " ".join(s.text for s in scene.sentences).lower()
            assert f"{scene.colour} {scene.object}" in spoken
            for sentence in scene.sentences:
                assert scene.start_s < sentence.start_s < sentence.end_s < scene.end_s
                assert normalise(sentence.text) == " ".join(w.text.lower() for w in sentence.words)


@pytest.mark.slow
def test_media_streams_match_manifest(site):
    for video in site.videos:
        probe = subprocess.run(
            ["ffprobe", "-v", "error", "-show_streams", "-show_format", "-of", "json", str(site.out_dir / video.media)],
            capture_output=True, text=True, check=True,
        )
        info = json.loads(probe.stdout)
        streams = {s["codec_type"]: s for s in info["streams"]}
        assert streams["video"]["codec_name"] == "h264"
        assert (streams["video"]["width"], streams["video"]["height"]) == (320, 240)
        assert streams["video"]["r_frame_rate"] == "25/1"
        assert streams["audio"]["codec_name"] == "aac"
        for entry in (info["format"], streams["video"], streams["audio"]):
            assert float(entry["duration"]) == pytest.approx(video.duration_s, abs=0.05)


@pytest.mark.slow
def test_word_timings_match_the_audio(site):
    rate = 16000
    for video in site.videos:
        pcm = subprocess.run(
            ["ffmpeg", "-v", "error", "-i", str(site.out_dir / video.media), "-f", "s16le",
             "-ac", "1", "-ar", str(rate), "-"],
            capture_output=True, check=True,
        ).stdout
        audio = array.array("h", pcm)
        for sentence in sentences(video):
            start, end = sentence.start_s, sentence.end_s
            assert peak(audio, rate, start - 0.12, start - 0.03) < 300, sentence.text
            assert peak(audio, rate, end + 0.03, end + 0.12) < 300, sentence.text
            assert peak(audio, rate, start, start + 0.06) > 1000, sentence.text
            assert peak(audio, rate, end - 0.06, end) > 1000, sentence.text
            for word in sentence.words:
                assert peak(audio, rate, word.start_s, word.end_s) > 1000, (sentence.text, word)
        if video.music_s:
            assert peak(audio, rate, 0.2, video.music_s - 0.2) > 1000


@pytest.mark.slow
def test_author_vtt_matches_manifest(site):
    for video in site.videos:
        path = site.out_dir / video.subs["en"]
        assert path.read_text(encoding="utf-8").startswith(HEADER)
        captions = webvtt.read(str(path)).captions
        texts = [c.text for c in captions]
        if video.music_s:
            assert texts[0] == "[Music]" and secs(captions[0].end) == video.music_s
            captions, texts = captions[1:], texts[1:]
        spoken = sentences(video)
        assert spoken  # so there are two cues or more to pair below
        assert normalise(" ".join(texts)) == normalise(" ".join(s.text for s in spoken))
        assert len(texts) == len(spoken) + 1  # one sentence is split across two cues
        assert all(secs(a.end) <= secs(b.start) for a, b in zip(captions, captions[1:]))
        starts = {w.start_s for s in spoken for w in s.words}
        assert all(secs(c.start) in starts for c in captions)


@pytest.mark.slow
def test_auto_vtt_has_youtube_rolling_layout(site):
    for video in site.videos:
        path = site.out_dir / video.subs["en-auto"]
        assert path.read_text(encoding="utf-8").startswith(HEADER)
        assert len(webvtt.read(str(path)).captions) == len(cues(path))
        parsed = cues(path)
        assert all(settings == "align:start position:0%" for _, _, settings, _ in parsed)
        assert all(a[1] == b[0] for a, b in zip(parsed, parsed[1:])), "cues are contiguous"
        word_cues, snapshots = parsed[0::2], parsed[1::2]
        assert all(round(end - start, 3) == 0.01 for start, end, _, _ in snapshots)
        above, timeline = " ", []
        for i, (start, _, _, (first, second)) in enumerate(word_cues):
            assert first == above
            head, *tagged = re.split(r"(?=<\d\d:)", second)
            assert all(INLINE.fullmatch(t) for t in tagged), second
            timeline.append((head, start))
            timeline += [(w, secs(ts)) for ts, w in (INLINE.fullmatch(t).groups() for t in tagged)]
            if i < len(snapshots):
                shown, blank = snapshots[i][3]
                assert blank == " " and shown in (" ", " ".join([head] + [INLINE.fullmatch(t)[2] for t in tagged]))
                above = shown
        assert any(s[3] == [" ", " "] for s in snapshots), "at least one screen clear"
        expected = [("[Music]", 0.0)] if video.music_s else []
        expected += [(normalise(w.text), w.start_s) for s in sentences(video) for w in s.words]
        assert timeline == expected


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_differs(site, tmp_path):
    again = make_demo_media(tmp_path / "again", n_videos=2, seed=0, quiet=True)
    for path in sorted(p for p in site.out_dir.rglob("*") if p.is_file() and p.name != "urls.txt"):
        relative = path.relative_to(site.out_dir)
        assert (again.out_dir / relative).read_bytes() == path.read_bytes(), relative
    other = make_demo_media(tmp_path / "other", n_videos=1, seed=1, quiet=True)
    for name in ["subs/tour-0.en.vtt", "subs/tour-0.auto.en.vtt"]:
        assert (other.out_dir / name).read_bytes() != (site.out_dir / name).read_bytes()
    assert other.videos[0].scenes != site.videos[0].scenes


@pytest.mark.slow
def test_served_pages_download_with_yt_dlp(site, tmp_path, capfd):
    out = tmp_path / "dl"
    options = {
        "quiet": True, "no_warnings": True, "noprogress": True,
        "skip_download": False, "writesubtitles": True, "subtitleslangs": ["en"],
        "outtmpl": str(out / "%(id)s.%(ext)s"),
    }
    with serve_demo(site.out_dir) as base_url:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", base_url)
        urls = (site.out_dir / "urls.txt").read_text().splitlines()
        assert urls == site.page_urls(base_url)
        with urllib.request.urlopen(base_url + "index.html") as response:
            assert b"pages/tour-0.html" in response.read()

        with yt_dlp.YoutubeDL(options) as ydl:
            info = ydl.extract_info(base_url + "pages/tour-0.html")
        assert set(info["subtitles"]) == {"en", "en-auto"}
        media = out / f"{info['id']}.mp4"
        assert media.read_bytes() == (site.out_dir / "media/tour-0.mp4").read_bytes()
        assert (out / f"{info['id']}.en.vtt").read_bytes() == (site.out_dir / "subs/tour-0.en.vtt").read_bytes()
        assert not list(out.glob("*.en-auto.vtt")), "only the requested language is fetched"

        with pytest.raises(yt_dlp.utils.DownloadError, match="404"), yt_dlp.YoutubeDL(options) as ydl:
            ydl.download([base_url + "pages/gone.html"])
    assert "GET /" not in capfd.readouterr().err, "the server does not log requests"


@pytest.mark.slow
def test_broken_media_is_unreadable(site):
    broken = site.out_dir / "media/broken.mp4"
    whole = (site.out_dir / "media/tour-0.mp4").stat().st_size
    assert 0.2 * whole < broken.stat().st_size < 0.4 * whole
    probe = subprocess.run(["ffprobe", "-v", "error", str(broken)], capture_output=True, text=True)
    assert probe.returncode != 0 and "moov atom not found" in probe.stderr
