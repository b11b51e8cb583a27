"""Download throughput on the demo site at concurrency 1, 4 and 16.

Prints videos/s and MB/s for each, and the ratio against concurrency 1 (the baseline).
Usage: python bench/download.py [--pages 48] [--videos 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchkit import mirror_pages

from pipeline.download import stage as download
from pipeline.config import parse_config
from pipeline.demo import make_demo_media, serve_demo
from pipeline.discover import discover
from pipeline.runner import run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus


def run(base: str, names: list[str], concurrency: int, work: Path) -> tuple[float, int, int]:
    cfg = parse_config({
        "name": "bench",
        "sources": [{"type": "urls", "urls": [base + n for n in names]}],
        # No pacing and no per-host cap: the bench measures concurrency alone.
        "download": {"concurrency": concurrency, "per_host": None, "rate_limit": None},
        "execution": {"batch_size": max(concurrency * 4, 16)},
    })
    ctx = context(Corpus(str(work / f"c{concurrency}")), cfg)
    discover(ctx)
    start = time.perf_counter()
    report = run_stage(download.STAGE, ctx, cfg.execution.batch_size)
    elapsed = time.perf_counter() - start
    data = ctx.corpus.read("downloads", columns=["bytes"]).column("bytes").to_pylist()
    return elapsed, report.ok, sum(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pages", type=int, default=48)
    parser.add_argument("--videos", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vlcorpus-bench-") as tmp:
        work = Path(tmp)
        make_demo_media(work / "site", n_videos=args.videos, seed=0, quiet=True)
        names = mirror_pages(work / "site", args.pages)
        with serve_demo(work / "site") as base:
            results = {c: run(base, names, c, work) for c in (1, 4, 16)}
    baseline = results[1][1] / results[1][0]
    print(f"{'concurrency':>11} {'videos':>6} {'seconds':>8} {'videos/s':>9} {'MB/s':>7} "
          f"{'vs c=1':>7}")
    for c, (elapsed, ok, nbytes) in results.items():
        rate = ok / elapsed
        print(f"{c:>11} {ok:>6} {elapsed:>8.2f} {rate:>9.2f} {nbytes / elapsed / 1e6:>7.2f} "
              f"{rate / baseline:>6.2f}x")


if __name__ == "__main__":
    main()
