"""End-to-end build throughput and the flow process's peak memory at 20 and 80 videos.

Each size runs `build_corpus` (Prefect + a local Dask cluster, all stages up to the report)
in a fresh process on mirrored demo pages, and prints clips/s and the flow process's peak RSS.
Memory should not grow with the number of videos: tables are read and written in batches.
Usage: python bench/build.py [--sizes 20 80] [--demo-videos 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit import mirror_pages

from pipeline.demo import make_demo_media, serve_demo


def child(site: Path, root: Path, videos: int) -> dict:
    from flows.build import run_build
    from pipeline.config import parse_config

    names = mirror_pages(site, videos)
    with serve_demo(site) as base:
        urls = root.parent / f"urls-{videos}.txt"
        urls.write_text("".join(f"{base}{n}\n" for n in names))
        cfg = parse_config({
            "name": "bench", "sources": [{"type": "list", "path": str(urls)}],
            "transcribe": {"prefer": ["manual"]},
            "features": {"extractors": [{"name": "resnet34", "fps": 1, "weights": "none"}]},
            "execution": {"batch_size": 8},
        })
        start = time.perf_counter()
        summary = run_build(cfg, root=str(root), until="report")
        elapsed = time.perf_counter() - start
    return {"videos": videos, "clips": summary["tables"].get("clips", 0), "seconds": elapsed,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 80])
    parser.add_argument("--demo-videos", type=int, default=8, help="distinct demo videos the pages mirror")
    parser.add_argument("--child", nargs=3, metavar=("SITE", "ROOT", "VIDEOS"))
    args = parser.parse_args()
    if args.child:
        site, root, videos = args.child
        print(json.dumps(child(Path(site), Path(root), int(videos))))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="vlcorpus-bench-") as tmp:
        work = Path(tmp)
        make_demo_media(work / "site", n_videos=args.demo_videos, seed=0, quiet=True)
        for size in args.sizes:
            out = subprocess.run([sys.executable, __file__, "--child", str(work / "site"),
                                  str(work / f"corpus-{size}"), str(size)],
                                 capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"the build of {size} videos failed ({out.returncode}):\n{out.stderr[-4000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'videos':>6} {'clips':>6} {'seconds':>8} {'clips/s':>8} {'flow peak RSS MB':>17}")
    for row in rows:
        print(f"{row['videos']:>6} {row['clips']:>6} {row['seconds']:>8.1f} "
              f"{row['clips'] / row['seconds']:>8.2f} {row['peak_rss_mb']:>17.0f}")
    if len(rows) > 1:
        print(f"memory ratio {rows[-1]['peak_rss_mb'] / rows[0]['peak_rss_mb']:.2f} for "
              f"{rows[-1]['videos'] / rows[0]['videos']:.0f}x the videos")


if __name__ == "__main__":
    main()
