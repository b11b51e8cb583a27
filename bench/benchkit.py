"""What several benchmarks share: a generated test video, a captioned site of them, a timer,
and mirrored demo pages."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import av
from av.video.frame import PictureType

from pipeline.demo import DemoSite, DemoVideo, Scene, Sentence, author_vtt
from pipeline.demo.pages import index_html, page_html, write_text

FPS = 25
# Synthetic caption sentences last this long: inside align's default 2-5 s, with room for
# rounding, so every cue is one clip for every tool.
SENTENCE_S = (2.2, 4.6)
_SUBJECTS = ["The kitchen", "This room", "The hallway", "Our balcony", "The bedroom", "The view"]
_VERBS = ["has", "shows", "gets", "keeps", "opens onto", "leads to"]
_OBJECTS = ["a wide window", "a red sofa", "two lamps", "the morning light", "a small desk",
            "a tiled floor", "the old fireplace", "a green plant"]


def make_test_video(path: str, seconds: int, audio: bool = False, keyframe_s: float = 10,
                    size: str = "854x480", preset: str = "ultrafast") -> None:
    """A 25 fps H.264 test pattern (FFmpeg's testsrc2) of ``size`` (x264 ``preset``: ultrafast
    makes no B-frames, the others do; a keyframe every ``keyframe_s``), with a sine tone (AAC)
    if ``audio``. Made with PyAV, so it needs no ffmpeg binary (the GPU machines have none)."""
    width, height = (int(n) for n in size.split("x"))
    with av.open(path, "w") as out:
        video = out.add_stream("libx264", rate=FPS, options={"preset": preset, "crf": "23"})
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.codec_context.gop_size = round(keyframe_s * FPS)
        tone = out.add_stream("aac", rate=44100) if audio else None
        for frame in _lavfi("testsrc2", f"s={size}:r={FPS}:d={seconds}"):
            frame = frame.reformat(format="yuv420p")
            frame.pict_type = PictureType.NONE  # the source marks every frame a keyframe
            out.mux(video.encode(frame))
        out.mux(video.encode())
        if tone is not None:
            for frame in _lavfi("sine", f"frequency=440:duration={seconds}:sample_rate=44100"):
                frame.pts = None  # the encoder counts samples itself
                out.mux(tone.encode(frame))
            out.mux(tone.encode())


def _lavfi(source: str, args: str) -> Iterator[av.VideoFrame | av.AudioFrame]:
    """The frames of one of FFmpeg's source filters (testsrc2, sine)."""
    graph = av.filter.Graph()
    src = graph.add(source, args)
    src.link_to(graph.add("abuffersink" if source == "sine" else "buffersink"))
    graph.configure()
    while True:
        try:
            yield graph.pull()
        except (av.error.EOFError, av.error.BlockingIOError):
            return


def pyav_decode(path: str, threads: int) -> int:
    """Every frame of ``path`` decoded by PyAV (``threads`` decoder threads, 0: FFmpeg's choice)
    and nothing else done with it; returns how many."""
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = threads
        return sum(1 for _ in container.decode(stream))


def _sentences(rng: random.Random, seconds: float) -> list[Sentence]:
    """Back-to-back sentences from 0 s that end at least 0.5 s before the video does (the
    last caption stays up 0.3 s longer)."""
    out: list[Sentence] = []
    start = 0.0
    while True:
        end = round(start + rng.uniform(*SENTENCE_S), 3)
        if end > seconds - 0.5:
            return out
        text = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."
        out.append(Sentence(text, start, end, []))
        start = end


def _caption_video(site: Path, index: int, seconds: int, rng: random.Random) -> DemoVideo:
    vid = f"video-{index:03d}"
    video = DemoVideo(id=vid, title=f"Test video {index}", page=f"pages/{vid}.html",
                      media=f"media/{vid}.mp4", subs={"en": f"subs/{vid}.en.vtt"},
                      duration_s=float(seconds), music_s=0.0,
                      scenes=[Scene(0, 0.0, float(seconds), "studio", "test pattern", "white",
                                    "pattern", _sentences(rng, seconds))])
    write_text(site / video.subs["en"], author_vtt(video, split_sentence=-1))
    write_text(site / video.page, page_html(video.title, video.media, [("en", video.subs["en"], "English")]))
    return video


def make_caption_site(site: Path, videos: int, seconds: int, seed: int = 0,
                      keyframe_s: float = 2, size: str = "854x480") -> DemoSite:
    """A site in the demo's layout (so ``pipeline.demo.serve_demo`` serves it): ``videos``
    test-pattern videos of ``seconds`` (``size`` H.264 + AAC, a keyframe every ``keyframe_s``,
    as web video has), each with an author caption track of synthetic back-to-back sentences,
    one a cue; made on every core."""
    rng = random.Random(f"vlcorpus-bench-site:{seed}")
    made = [_caption_video(site, i, seconds, rng) for i in range(videos)]
    (site / "media").mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(lambda v: make_test_video(str(site / v.media), seconds, audio=True,
                                                keyframe_s=keyframe_s, size=size), made))
    demo = DemoSite(out_dir=site, seed=seed, videos=made)
    write_text(site / "index.html", index_html(demo))
    write_text(site / "manifest.json", json.dumps(demo.manifest(), indent=2) + "\n")
    return demo


def timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """(seconds ``fn(*args)`` took, its result)."""
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def mirror_pages(site: Path, pages: int) -> list[str]:
    """Copies of the demo site's good pages under new names, so there are ``pages`` distinct
    videos; returns their paths relative to the site."""
    good = sorted(p for p in (site / "pages").glob("tour-*.html"))
    names = []
    for i in range(pages):
        name = f"bench-{i:04d}.html"
        shutil.copy(good[i % len(good)], site / "pages" / name)
        names.append(f"pages/{name}")
    return names


def vlcorpus(args: list[str], log: Path) -> subprocess.CompletedProcess:
    """``vlcorpus ARGS`` from this interpreter's environment, as a user runs it, with its output
    in ``log``."""
    with open(log, "w") as out:
        return subprocess.run([str(Path(sys.executable).with_name("vlcorpus")), *args],
                              stdout=out, stderr=subprocess.STDOUT)
