"""Speed of clip cutting: one ffmpeg process per video (`cut_clips`) against one per clip.

~40 clips (2-5 s, seeded) of a 3-minute 854x480 25 fps H.264 video with a sine audio track
(ultrafast, keyframe every 250 frames), cut with the same settings both ways, for `copy`
(stream copy) and `exact` (re-encode, libx264 veryfast, scaled to --height). Prints the times
and the ratio per-clip / per-video (higher is better), each the best of --repeats rounds taken
in turns (shared machines are noisy).
Usage: python bench/cut.py [--video PATH] [--clips 40] [--seconds 180] [--height 360] [--no-audio]
       [--seed 0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import tempfile

from benchkit import make_test_video, timed

from pipeline.media import ClipCut, cut_clips, probe


def make_cuts(duration_s: float, count: int, seed: int, folder: str) -> list[ClipCut]:
    rng = random.Random(seed)
    cuts = []
    for i in range(count):
        length = rng.uniform(2.0, 5.0)
        start = rng.uniform(0.0, duration_s - length)
        cuts.append(ClipCut(f"clip{i:03d}", start, start + length, os.path.join(folder, f"clip{i:03d}.mp4")))
    return cuts


def per_clip(path: str, cuts: list[ClipCut], precision: str, height: int, audio: bool) -> None:
    """The naive way: seek in the input, cut one clip, once per clip."""
    if precision == "copy":
        encode = ["-c", "copy"]
    else:
        encode = ["-vf", f"scale=-2:{height}", "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"]
    streams = ["-map", "0:v:0"] + (["-map", "0:a:0"] if audio else [])
    for cut in cuts:
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-ss", f"{cut.start_s:.3f}",
                        "-t", f"{cut.end_s - cut.start_s:.3f}", "-i", path, *streams, *encode,
                        "-movflags", "+faststart", cut.out_path], check=True)


def per_video(path: str, cuts: list[ClipCut], precision: str, height: int, audio: bool) -> None:
    # One process at a time, as the per-clip way runs: the ratio is the per-video grouping's.
    results = cut_clips(path, cuts, precision=precision, height=height if precision == "exact" else None,
                        audio=audio, processes=1)
    failed = {key: str(value) for key, value in results.items() if not isinstance(value, str)}
    if failed:
        raise SystemExit(f"cut_clips failed: {failed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--video", help="use this video instead of generating one")
    parser.add_argument("--clips", type=int, default=40)
    parser.add_argument("--seconds", type=int, default=180, help="length of the generated video")
    parser.add_argument("--height", type=int, default=360)
    parser.add_argument("--no-audio", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    audio = not args.no_audio
    with tempfile.TemporaryDirectory() as tmp:
        path = args.video
        if path is None:
            path = os.path.join(tmp, "v.mp4")
            print(f"generating a {args.seconds} s 854x480 video ...", flush=True)
            make_test_video(path, args.seconds, audio=True)
        info = probe(path)
        print(f"video {info.width}x{info.height} {info.fps:g} fps {info.duration_s:.0f}s; {args.clips} clips; "
              f"audio {'on' if audio else 'off'}; exact: libx264 veryfast, height {args.height}; "
              f"{os.cpu_count()} CPUs")
        for precision in ("copy", "exact"):
            times: dict[str, float] = {}
            for round_ in range(args.repeats):
                for name, fn in (("per clip", per_clip), ("per video", per_video)):
                    folder = os.path.join(tmp, f"{precision}-{name.replace(' ', '-')}-{round_}")
                    cuts = make_cuts(info.duration_s, args.clips, args.seed, folder)
                    os.makedirs(folder)
                    spent, _ = timed(fn, path, cuts, precision, args.height, audio)
                    times[name] = min(times.get(name, spent), spent)
            print(f"{precision:5s}  one process per clip {times['per clip']:6.2f}s   one per video "
                  f"{times['per video']:6.2f}s   ratio {times['per clip'] / times['per video']:.1f}x (goal >= 3)")


if __name__ == "__main__":
    main()
