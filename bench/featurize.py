"""Featurize throughput: the whole stage against the model alone, on the same clips.

Prints frames/s of (a) the featurize stage (decode + preprocess + model, decode running ahead
in threads) and (b) the model alone on pre-decoded tensors of the same shapes and batch size,
and (a)/(b). Goal: at least 0.8 on CPU, 0.9 on a GPU.
Usage: python bench/featurize.py [--extractor resnet34] [--fps 2] [--videos 4] [--batch 16]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from pipeline import featurize
from pipeline.features.extract import extractor_for
from pipeline.config import parse_config
from pipeline.demo import make_demo_media
from pipeline.ids import clip_id
from pipeline.media import FrameRequest, probe, sample_frames
from pipeline.runner import run_stage
from pipeline.stages import context
from pipeline.storage import Corpus


def make_corpus(root: Path, site: Path, clip_s: float, step_s: float) -> Corpus:
    """Downloads and clips rows over the demo videos: a clip of ``clip_s`` every ``step_s``."""
    corpus = Corpus(str(root))
    now = datetime.now(UTC)
    downloads, clips = [], []
    for media in sorted((site / "media").glob("tour-*.mp4")):
        video = f"bench-{media.stem}"
        duration = probe(str(media)).duration_s
        downloads.append({"video_id": video, "media_path": str(media), "status": "ok",
                          "duration_s": duration, "downloaded_at": now})
        start = 0.0
        while start + clip_s <= duration:
            clips.append({"clip_id": clip_id(video, start, start + clip_s), "video_id": video,
                          "start_s": start, "end_s": start + clip_s, "text": "bench",
                          "source": "manual", "policy": "fixed", "split": "train"})
            start += step_s
    corpus.write_batch("downloads", downloads, "bench", done={d["video_id"]: 1 for d in downloads})
    corpus.write_batch("clips", clips, "bench",
                       done={v: sum(c["video_id"] == v for c in clips)
                             for v in {c["video_id"] for c in clips}})
    return corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--extractor", default="resnet34")
    parser.add_argument("--fps", type=float, default=2.0)
    parser.add_argument("--videos", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vlcorpus-bench-") as tmp:
        work = Path(tmp)
        make_demo_media(work / "site", n_videos=args.videos, seed=0, quiet=True)
        corpus = make_corpus(work / "corpus", work / "site", clip_s=3.0, step_s=1.5)
        cfg = parse_config({"name": "bench", "sources": [{"type": "urls", "urls": ["http://x/"]}],
                            "features": {"extractors": [{"name": args.extractor, "fps": args.fps,
                                                         "weights": "none",
                                                         "batch_size": args.batch}],
                                         "clips_per_commit": 10_000}})
        stage = featurize.stages(cfg)[0]
        extractor = extractor_for(cfg, args.extractor)
        ctx = context(corpus, cfg)
        items = list(stage.items(ctx))

        # (b) first: pre-decoded tensors, model alone (also warms the model up).
        prepared = []
        media = {i.info["media_path"] for i in items}
        for path in sorted(media):
            requests = [FrameRequest(i.key, i.rows[0]["start_s"], i.rows[0]["end_s"],
                                     extractor.spec) for i in items if i.info["media_path"] == path]
            prepared += [extractor.prepare(f) for _, f in sample_frames(path, requests)]
        frames = sum(t.shape[0] for t in prepared)
        extractor.run(prepared[: args.batch])
        start = time.perf_counter()
        for i in range(0, len(prepared), args.batch):
            extractor.run(prepared[i : i + args.batch])
        model_s = time.perf_counter() - start

        start = time.perf_counter()
        report = run_stage(stage, ctx, batch_size=stage.batch_size)
        stage_s = time.perf_counter() - start
        assert report.ok == len(items), report
    device = extractor.device
    print(f"{args.extractor} on {device} ({torch.get_num_threads()} torch threads): "
          f"{len(items)} clips, {frames} frames, batch {args.batch}")
    print(f"(a) full stage (decode + preprocess + model): {frames / stage_s:8.1f} frames/s "
          f"({stage_s:.2f} s)")
    print(f"(b) model alone on pre-decoded tensors:       {frames / model_s:8.1f} frames/s "
          f"({model_s:.2f} s)")
    print(f"(a)/(b) = {model_s / stage_s:.2f}  (goal >= 0.8 on CPU, >= 0.9 on GPU)")


if __name__ == "__main__":
    main()
