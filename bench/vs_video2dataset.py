"""Our build against video2dataset 1.3.0: the same site, the same clip spans, WebDataset shards
of clip mp4s from both, with a plain transcode as the floor.

The site: --videos test-pattern videos of --seconds at 854x480 (H.264 + AAC, a keyframe every
2 s as web video has), each page with an author caption track of back-to-back synthetic
sentences of 2.2-4.6 s (benchkit.make_caption_site), served on 127.0.0.1. The caption cues are
the spans: our build finds them itself (download, transcribe, align: one clip per sentence);
video2dataset gets them in its URL list (parquet, one row per video: the page URL, `clips` =
its cues' [start, end] and `caption` = their texts, one a line; 1.3.0 writes a row's caption
into each of its clips, so clip i's sentence is line i).

For each site size (--videos, 20 and 100 by default) and each precision (--precision, both by
default), in one run:
- ours: `vlcorpus build CONFIG --root FRESH --until shard --json` (no features, Parquet shards off,
  `shards.webdataset.include_media`, clips at the source height with audio; `copy` = stream
  copy, `exact` = re-encode), on its default local cluster (2 workers, 4 downloads at once,
  unpaced like video2dataset's: no rate limit, no per-host limit); its start-up (from the
  command's start to the build's first stage: imports, Prefect's temporary server, the Dask
  cluster, the flow run) and teardown (from the end of its last stage to the command's exit)
  are printed apart from the work, from the summary's timing;
- video2dataset: its CLI with the `ClippingSubsampler` (`precision: low`, one stream copy of
  the whole video split at keyframes by ffmpeg's segment muxer, or `exact`, one re-encode of
  the whole video at ffmpeg's default libx264 preset with keyframes forced at the cuts), 2
  processes of 2 download threads, no metadata requests;
- the floor (once): `ffmpeg -c:v libx264 -preset veryfast` over every whole video at its own
  height, 2 processes at a time.
Prints each wall time, ours / video2dataset and each / the floor, the clip counts and their
seconds (saying so when the counts differ), our start-up and teardown, then one JSON line per
size and a last JSON line with every size.

video2dataset is installed once into its own virtualenv (--venv, by default under
~/.cache/vlcorpus-bench), never into ours: its pins (torch 2.1.2 with CUDA libraries,
transformers 4.37.1, numpy<2) cannot live next to ours. The extra pins it needs to install from
PyPI are V2D_PINS; the first run downloads about 3 GB (5.8 GB installed) in about 5 minutes.
Usage: python bench/vs_video2dataset.py [--videos 20 100] [--seconds 60] [--venv DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import av
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from benchkit import make_caption_site, timed

from pipeline.demo import DemoSite, serve_demo
from pipeline.transcribe.subtitles import read_cues

# video2dataset 1.3.0 pins numpy<2; pyarrow 17+ and opencv-python 4.12+ (through
# scenedetect[opencv]) need numpy 2. yt-dlp is ours, so both tools download alike.
V2D_PINS = ["video2dataset==1.3.0", "pyarrow<17", "opencv-python<4.12"]
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vlcorpus-bench" / "video2dataset-1.3.0"
PROCESSES = 2  # video2dataset processes, and floor transcodes at once: one per core
V2D_PRECISION = {"copy": "low", "exact": "exact"}


def v2d_venv(venv: Path) -> Path:
    """video2dataset's own virtualenv, made on first use; returns its `video2dataset` command."""
    marker = venv / "installed.txt"
    if not marker.exists():
        import yt_dlp

        print(f"installing video2dataset 1.3.0 into {venv} (once) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pins = V2D_PINS + [f"yt-dlp=={yt_dlp.version.__version__}"]
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--progress-bar", "off", *pins],
                       check=True)
        marker.write_text("\n".join(pins) + "\n")
    return venv / "bin" / "video2dataset"


def spans_list(site: DemoSite, base: str, path: Path) -> tuple[int, float]:
    """video2dataset's URL list: one row per video with its caption cues; returns how many
    cues there are and their seconds together."""
    rows = []
    for video in site.videos:
        cues = read_cues(site.out_dir / video.subs["en"])
        rows.append({"url": base + video.page, "clips": [[c.start_s, c.end_s] for c in cues],
                     "caption": "\n".join(c.text for c in cues)})
    pq.write_table(pa.Table.from_pylist(rows), path)
    return (sum(len(r["clips"]) for r in rows),
            sum(end - start for r in rows for start, end in r["clips"]))


def our_config(path: Path, urls: Path, precision: str) -> Path:
    config = {
        "name": f"vs-video2dataset-{precision}",
        "sources": [{"type": "list", "path": str(urls)}],
        # video2dataset paces nothing: neither do we here (our defaults are polite to YouTube:
        # 30 videos a minute, 2 at a time per host).
        "download": {"rate_limit": None, "per_host": None},
        "transcribe": {"prefer": ["manual"]},
        "shards": {"parquet": {"enabled": False},
                   "webdataset": {"include_media": True,
                                  "media": {"precision": precision, "height": None, "audio": True}}},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def v2d_config(path: Path, precision: str, videos: int) -> Path:
    config = {
        "subsampling": {"ClippingSubsampler": {"args": {"precision": V2D_PRECISION[precision]}}},
        "reading": {"yt_args": {"download_size": 360, "download_audio_rate": 44100, "yt_metadata_args": None},
                    "timeout": 60, "sampler": None},
        # Input shards are groups of videos, one process each: one shard per process.
        "storage": {"number_sample_per_shard": math.ceil(videos / PROCESSES), "oom_shard_count": 5,
                    "captions_are_subtitles": False},
        "distribution": {"processes_count": PROCESSES, "thread_count": 2, "subjob_size": 1000,
                         "distributor": "multiprocessing"},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def check(done: subprocess.CompletedProcess, log: Path) -> None:
    if done.returncode:
        raise SystemExit(f"{done.args[0]} failed ({done.returncode}):\n" + log.read_text()[-4000:])


def ours(config: Path, root: Path, log: Path) -> dict[str, float]:
    """Our build; returns its start-up, work and teardown seconds."""
    command = [str(Path(sys.executable).with_name("vlcorpus")), "build", str(config), "--root", str(root),
               "--until", "shard", "--json"]
    started = time.time()
    with open(log, "w") as errors:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=errors, text=True)
    ended = time.time()
    check(done, log)
    timing = json.loads(done.stdout.strip().splitlines()[-1])["timing"]
    return {"startup_s": round(timing["work_started_at"] - started, 2),
            "work_s": round(timing["work_ended_at"] - timing["work_started_at"], 1),
            "teardown_s": round(ended - timing["work_ended_at"], 2)}


def video2dataset(command: Path, spans: Path, config: Path, out: Path, log: Path) -> None:
    with open(log, "w") as output:
        done = subprocess.run(
            [str(command), "--url_list", str(spans), "--input_format", "parquet",
             "--output_format", "webdataset", "--output_folder", str(out), "--url_col", "url",
             "--caption_col", "caption", "--clip_col", "clips", "--encode_formats", '{"video": "mp4"}',
             "--config", str(config), "--tmp_dir", str(out.parent / f"{out.name}-tmp")],
            stdout=output, stderr=subprocess.STDOUT)
    check(done, log)


def floor(site: DemoSite, out: Path) -> None:
    """Every whole video transcoded (libx264 veryfast, audio copied), PROCESSES at a time."""
    out.mkdir()

    def transcode(media: str) -> None:
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(site.out_dir / media),
                        "-c:v", "libx264", "-preset", "veryfast", "-c:a", "copy",
                        str(out / Path(media).name)], check=True)

    with ThreadPoolExecutor(PROCESSES) as pool:
        list(pool.map(transcode, [v.media for v in site.videos]))


def clips_in(folder: Path) -> tuple[int, float]:
    """The clip mp4s in the WebDataset tars under ``folder``: how many, and their seconds
    together (a stream copy starts at a keyframe, so its clips run longer than their spans)."""
    count, seconds = 0, 0.0
    for path in folder.rglob("*.tar"):
        with tarfile.open(path) as tar:
            for member in tar:
                if member.name.endswith(".mp4"):
                    with av.open(tar.extractfile(member)) as container:
                        seconds += (container.duration or 0) / 1e6
                    count += 1
    return count, seconds


def compare(precision: str, work: Path, site: DemoSite, command: Path, videos: int) -> dict[str, float]:
    """Our build and video2dataset's at one precision, each on a fresh output: times and clips."""
    root, out = work / f"ours-{precision}", work / f"v2d-{precision}"
    config = our_config(work / f"ours-{precision}.yaml", site.out_dir / "urls.txt", precision)
    ours_s, fixed = timed(ours, config, root, work / f"ours-{precision}.log")
    v2d_s, _ = timed(video2dataset, command, work / "spans.parquet",
                     v2d_config(work / f"v2d-{precision}.yaml", precision, videos), out,
                     work / f"v2d-{precision}.log")
    (ours_n, ours_clip_s), (v2d_n, v2d_clip_s) = clips_in(root / "shards"), clips_in(out)
    print(f"{precision}: ours {ours_s:.1f} s (start-up {fixed['startup_s']:.2f} s, work {fixed['work_s']:.1f} s, "
          f"teardown {fixed['teardown_s']:.2f} s), video2dataset {v2d_s:.1f} s", flush=True)
    return {"ours_s": round(ours_s, 1), "v2d_s": round(v2d_s, 1), **fixed, "clips_ours": ours_n,
            "clips_v2d": v2d_n, "clip_s_ours": round(ours_clip_s, 1), "clip_s_v2d": round(v2d_clip_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, nargs="+", default=[20, 100], help="site sizes, one after another")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--precision", nargs="+", choices=["copy", "exact"], default=["copy", "exact"])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="video2dataset's virtualenv")
    args = parser.parse_args()
    command = v2d_venv(args.venv)
    sizes = [run_size(videos, args.seconds, command, args.precision) for videos in args.videos]
    print(json.dumps({"cpus": os.cpu_count(), "sizes": sizes}))


def run_size(videos: int, seconds: int, command: Path, precisions: list[str]) -> dict:
    """Both tools and the floor on a fresh site of ``videos`` videos; prints the table."""
    with tempfile.TemporaryDirectory(prefix="vlcorpus-vs-v2d-") as tmp:
        work = Path(tmp)
        print(f"making {videos} videos of {seconds} s ...", flush=True)
        site = make_caption_site(work / "site", videos, seconds)
        floor_s, _ = timed(floor, site, work / "floor")
        with serve_demo(site.out_dir) as base:
            spans, span_s = spans_list(site, base, work / "spans.parquet")
            print(f"{videos} videos x {seconds} s at 854x480, {spans} caption spans "
                  f"({span_s:.0f} s); floor {floor_s:.1f} s", flush=True)
            results = {p: compare(p, work, site, command, videos) for p in precisions}
    return report(videos, seconds, spans, span_s, floor_s, results)


def report(videos: int, seconds: int, spans: int, span_s: float, floor_s: float,
           results: dict[str, dict]) -> dict:
    print(f"\n{'precision':<9} {'ours s':>7} {'v2d s':>7} {'ours/v2d':>9} {'ours/floor':>11} "
          f"{'v2d/floor':>10} {'clips ours':>11} {'clips v2d':>10} {'clip s ours':>12} {'clip s v2d':>11}")
    for precision, r in results.items():
        r["ours_over_v2d"] = round(r["ours_s"] / r["v2d_s"], 2)
        r["ours_over_floor"] = round(r["ours_s"] / floor_s, 2)
        r["v2d_over_floor"] = round(r["v2d_s"] / floor_s, 2)
        print(f"{precision:<9} {r['ours_s']:>7.1f} {r['v2d_s']:>7.1f} {r['ours_over_v2d']:>8.2f}x "
              f"{r['ours_over_floor']:>10.2f}x {r['v2d_over_floor']:>9.2f}x {r['clips_ours']:>11} "
              f"{r['clips_v2d']:>10} {r['clip_s_ours']:>12.1f} {r['clip_s_v2d']:>11.1f}")
    print(f"floor: libx264 veryfast transcode of all {videos} whole videos, {PROCESSES} at a "
          f"time: {floor_s:.1f} s; caption spans: {spans}, {span_s:.1f} s")
    for precision, r in results.items():
        print(f"ours, {precision}: start-up {r['startup_s']:.2f} s + teardown {r['teardown_s']:.2f} s = "
              f"{r['startup_s'] + r['teardown_s']:.2f} s around {r['work_s']:.1f} s of work")
    for precision, r in results.items():
        if not r["clips_ours"] == r["clips_v2d"] == spans:
            print(f"NOTE {precision}: clip counts differ (ours {r['clips_ours']}, video2dataset "
                  f"{r['clips_v2d']}, caption spans {spans}): the times are not for the same output")
    size = {"videos": videos, "seconds": seconds, "spans": spans, "span_s": round(span_s, 1),
            "floor_s": round(floor_s, 1), **results}
    print(json.dumps(size), flush=True)
    return size


if __name__ == "__main__":
    main()
