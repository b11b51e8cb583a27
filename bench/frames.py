"""Speed of frame sampling: one PyAV pass per video against one ffmpeg process per clip, and
against PyAV's plain decode of the same file.

150 clips (2-5 s, seeded) of a 10-minute 854x480 25 fps H.264 video (ultrafast, keyframe every
250 frames), each wanting frames at 2 fps, short side 256, centre crop 224 (the WAL setting).
Prints (a) `sample_frames` for all clips in one pass, (b) one ffmpeg process per clip (seek,
fps, scale, crop, raw RGB into numpy), (c) a plain full decode (`ffmpeg -i v.mp4 -f null -`),
(d) PyAV's plain decode of every frame (the same decoder threads as (a)), and the ratios (b)/(a)
(higher is better), (a)/(c) (the cost over decoding everything) and the decoded frames/s of (a)
against (d) (what sampling costs per decoded frame; (a) skips what no clip wants by seeking, so
it also decodes fewer frames), and (e) (a) with skip_nonref (FFmpeg's skip_frame nonref: only
frames other frames refer to are decoded; the default ultrafast video has no B-frames, so
--preset veryfast shows it). Without an ffmpeg binary, (b) and (c) are left out.
Each is the best of --repeats rounds, taken in turns (shared machines are noisy).
Usage: python bench/frames.py [--video PATH] [--clips 150] [--seconds 600] [--threads 0] [--preset ultrafast]
       [--seed 0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import av
import numpy as np
from benchkit import make_test_video, pyav_decode, timed

from pipeline.media import FrameRequest, FrameSpec, probe, sample_frames
from pipeline.media import frames as media_frames

SPEC = FrameSpec(fps=2, short_side=256, crop=224)


def make_clips(duration_s: float, count: int, seed: int) -> list[FrameRequest]:
    rng = random.Random(seed)
    clips = []
    for i in range(count):
        length = rng.uniform(2.0, 5.0)
        start = rng.uniform(0.0, duration_s - length)
        clips.append(FrameRequest(f"clip{i:03d}", start, start + length, SPEC))
    return clips


def one_pass(path: str, clips: list[FrameRequest], threads: int,
             skip_nonref: bool = False) -> tuple[int, int]:
    """(frames sampled, frames decoded) of one ``sample_frames`` pass."""
    decoded = 0
    inner = media_frames._decoded

    def counting(*args: Any) -> Iterator[tuple[float, av.VideoFrame]]:
        nonlocal decoded
        for item in inner(*args):
            decoded += 1
            yield item

    media_frames._decoded = counting
    try:
        frames = 0
        for key, result in sample_frames(path, clips, threads, skip_nonref):
            if isinstance(result, Exception):
                raise SystemExit(f"{key}: {result}")
            frames += len(result)
    finally:
        media_frames._decoded = inner
    return frames, decoded


def per_clip(path: str, clips: list[FrameRequest]) -> int:
    short, crop = SPEC.short_side, SPEC.crop
    scale = f"scale='if(lt(iw,ih),{short},-2)':'if(lt(iw,ih),-2,{short})'"
    frames = 0
    for clip in clips:
        out = subprocess.run(
            ["ffmpeg", "-nostdin", "-v", "error", "-ss", f"{clip.start_s:.3f}",
             "-t", f"{clip.end_s - clip.start_s:.3f}", "-i", path,
             "-vf", f"fps={SPEC.fps},{scale},crop={crop}:{crop}", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
            check=True, capture_output=True).stdout
        frames += len(np.frombuffer(out, np.uint8).reshape(-1, crop, crop, 3))
    return frames


def full_decode(path: str) -> None:
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-i", path, "-f", "null", "-"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--video", help="use this video instead of generating one")
    parser.add_argument("--clips", type=int, default=150)
    parser.add_argument("--seconds", type=int, default=600, help="length of the generated video")
    parser.add_argument("--threads", type=int, default=0, help="decoder threads (0: FFmpeg's choice)")
    parser.add_argument("--preset", default="ultrafast", help="x264 preset of the generated video "
                        "(ultrafast has no B-frames, for (e) use e.g. veryfast)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.video
        if path is None:
            path = os.path.join(tmp, "v.mp4")
            print(f"generating a {args.seconds} s 854x480 video ...", flush=True)
            make_test_video(path, args.seconds, preset=args.preset)
        info = probe(path)
        clips = make_clips(info.duration_s, args.clips, args.seed)
        covered = sum(c.end_s - c.start_s for c in clips)
        print(f"video {info.width}x{info.height} {info.fps:g} fps {info.duration_s:.0f}s; {len(clips)} clips "
              f"({covered:.0f}s in all), 2 fps, short side 256, crop 224; {os.cpu_count()} CPUs")
        cli = shutil.which("ffmpeg") is not None
        pyav_decode(path, args.threads)  # warm the page cache
        rounds = [(timed(one_pass, path, clips, args.threads),
                   timed(per_clip, path, clips) if cli else (0.0, 0),
                   timed(full_decode, path) if cli else (0.0, None),
                   timed(pyav_decode, path, args.threads),
                   timed(one_pass, path, clips, args.threads, True)) for _ in range(args.repeats)]
        (t_a, (n_a, decoded_a)), (t_b, n_b), (t_c, _), (t_d, n_d), (t_e, (_, decoded_e)) = (
            min(times) for times in zip(*rounds))
        print(f"best of {args.repeats} rounds:")
        print(f"(a) sample_frames, one pass       {t_a:7.2f}s  {n_a} frames sampled, {decoded_a} decoded "
              f"({decoded_a / t_a:.0f} decoded frames/s)")
        if cli:
            print(f"(b) one ffmpeg process per clip   {t_b:7.2f}s  {n_b} frames")
            print(f"(c) full decode, ffmpeg -f null   {t_c:7.2f}s")
        print(f"(d) full decode, PyAV             {t_d:7.2f}s  {n_d} frames ({n_d / t_d:.0f} decoded frames/s)")
        print(f"(e) (a) skipping non-ref frames   {t_e:7.2f}s  {decoded_e} decoded: (a)/(e) = {t_a / t_e:.2f}x "
              f"the speed (with B-frames; each time then takes the nearest decoded frame)")
        if cli:
            print(f"(b)/(a) = {t_b / t_a:.1f}x faster (goal >= 5)   (a)/(c) = {t_a / t_c:.2f} (goal <= 1.5)")
        print(f"decoded frames/s (a)/(d) = {decoded_a / t_a / (n_d / t_d):.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
