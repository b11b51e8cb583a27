"""make_demo_media: the whole demo site, each video built from (seed, index) alone."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.demo.captions import author_vtt, auto_vtt, auto_words
from pipeline.demo.encode import encode_video, write_broken
from pipeline.demo.model import BadPage, DemoSite, DemoVideo
from pipeline.demo.pages import index_html, page_html, write_text
from pipeline.demo.scenes import candidate_scenes, lay_out, scene_count
from pipeline.demo.sound import MUSIC_NOTE_MS, MUSIC_NOTES_HZ, timed_speech
from pipeline.demo.speech import INSTALL_HINT, espeak_library, synthesize_fresh
from pipeline.progress import terminal


def check_tools() -> None:
    """Fail early, naming the missing binary and how to install it."""
    for binary in ("ffmpeg", "ffprobe", "espeak-ng"):
        if shutil.which(binary) is None:
            raise RuntimeError(f"{binary} not found on PATH; {INSTALL_HINT}")
    espeak_library()


def _build_video(out_dir: Path, index: int, seed: int) -> DemoVideo:
    """Plan, narrate and write one video; its content depends only on (seed, index)."""
    rng = random.Random(f"vlcorpus-demo:{seed}:{index}")
    music_ms = len(MUSIC_NOTES_HZ) * MUSIC_NOTE_MS if index % 2 == 0 else 0
    plans = candidate_scenes(rng)
    texts = [text for plan in plans for text in plan.texts]
    spoken = iter(synthesize_fresh(texts))
    for plan in plans:
        plan.speeches = [timed_speech(text, *next(spoken)) for text in plan.texts]
    scenes, audio = lay_out(plans[: scene_count(rng, plans, music_ms)], music_ms)
    video_id = f"tour-{index}"
    rooms = [s.room for s in scenes]
    video = DemoVideo(
        id=video_id,
        title=f"Apartment tour {index + 1}: the {', '.join(rooms[:-1])} and {rooms[-1]}",
        page=f"pages/{video_id}.html",
        media=f"media/{video_id}.mp4",
        subs={"en": f"subs/{video_id}.en.vtt", "en-auto": f"subs/{video_id}.auto.en.vtt"},
        duration_s=scenes[-1].end_s,
        music_s=music_ms / 1000,
        scenes=scenes,
    )
    split_sentence = rng.randrange(sum(len(s.sentences) for s in scenes))
    words = auto_words(video)
    max_chars = [rng.randint(28, 40) for _ in words]  # a length limit for each possible line
    write_text(out_dir / video.subs["en"], author_vtt(video, split_sentence))
    write_text(out_dir / video.subs["en-auto"], auto_vtt(words, video.duration_s, max_chars))
    tracks = [("en", video.subs["en"], "English"), ("en-auto", video.subs["en-auto"], "English (auto-generated)")]
    write_text(out_dir / video.page, page_html(video.title, video.media, tracks))
    (out_dir / "media").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vlcorpus-demo-") as work:
        encode_video(video, audio, out_dir / video.media, Path(work))
    return video


def make_demo_media(out_dir: Path, n_videos: int = 4, seed: int = 0, quiet: bool = False) -> DemoSite:
    """Write the demo site (media, captions, pages, manifest) into out_dir; see the package doc."""
    check_tools()
    if n_videos < 1:
        raise ValueError("n_videos must be at least 1")
    out_dir = Path(out_dir)
    workers = min(n_videos, os.cpu_count() or 1)
    # Threads suffice: the work happens in child processes (speech, then ffmpeg).
    columns = [TextColumn("demo videos"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, disable=quiet, console=terminal()) as progress, ThreadPoolExecutor(workers) as pool:
        task = progress.add_task("demo", total=n_videos)
        futures = [pool.submit(_build_video, out_dir, i, seed) for i in range(n_videos)]
        videos = []
        for future in futures:
            videos.append(future.result())
            progress.advance(task)
    site = DemoSite(
        out_dir=out_dir,
        seed=seed,
        videos=videos,
        bad_pages=[
            BadPage(page="pages/broken.html", media="media/broken.mp4", kind="truncated"),
            BadPage(page="pages/gone.html", media="media/gone.mp4", kind="missing"),
        ],
    )
    with tempfile.TemporaryDirectory(prefix="vlcorpus-demo-") as work:
        write_broken(out_dir / site.videos[0].media, out_dir / "media/broken.mp4", Path(work))
    (out_dir / "media/gone.mp4").unlink(missing_ok=True)
    for bad in site.bad_pages:
        write_text(out_dir / bad.page, page_html(f"Demo page ({bad.kind} media)", bad.media, []))
    write_text(out_dir / "index.html", index_html(site))
    write_text(out_dir / "manifest.json", json.dumps(site.manifest(), indent=2) + "\n")
    return site
