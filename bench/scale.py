"""Planning at scale: synthetic tables (no media) written through the project's own storage code,
then every partition stage planned over every partition in a fresh process.

    python bench/scale.py --clips 1000000            # 10k videos, 100 clips each
    python bench/scale.py --clips 10000000           # 100k videos

Most of the corpus is done (99% of the videos downloaded, transcribed and aligned, 99% of the
clips featurized and sharded), so each stage's plan is the anti-join of a full partition. The
baseline, measured in the same run, is what planning did before partitions: the whole clips
table as Python rows in one process. Prints per stage the planning time, then one JSON line:
{"clips", "plan_s": {stage: s}, "peak_rss_mb", "files": {table: n}, "task_runs", "status", ...}
("status": `vlcorpus status` of the same corpus, its seconds and peak RSS).
Goal on 2 cores: planning at 10M clips within 60 s, peak RSS at 10M at most 300 MB above 1M.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import graph  # noqa: E402
from pipeline.corpus import partitions
from pipeline.config import parse_config  # noqa: E402
from pipeline.shards.index import PartitionIndex, ShardEntry  # noqa: E402
from pipeline.corpus.storage import Corpus  # noqa: E402

CLIPS_PER_VIDEO = 100
NOW = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = {"name": "scale", "sources": [{"type": "urls", "urls": ["http://x/"]}],
          "transcribe": {"prefer": ["manual", "auto"]},
          "features": {"extractors": [{"name": "resnet34", "weights": "none"}]}}


def _partition_tables(label: str, videos: list[str]) -> dict[str, pa.Table]:
    n = len(videos)
    done = videos[: max(1, n * 99 // 100)]  # 1% of the videos left to download
    clip_ids = [f"{v}-{i * 3000}-{i * 3000 + 3000}" for v in done for i in range(CLIPS_PER_VIDEO)]
    starts = np.tile(np.arange(CLIPS_PER_VIDEO) * 3.0, len(done))
    owner = np.repeat(np.array(done, dtype=object), CLIPS_PER_VIDEO)
    return {
        "videos": pa.table({"video_id": videos, "url": [f"https://example.org/{v}" for v in videos],
                            "extractor": ["generic"] * n, "source": ["list"] * n,
                            "discovered_at": [NOW] * n}),
        "downloads": pa.table({"video_id": done, "media_path": [f"media/{v}.mp4" for v in done],
                               "status": ["ok"] * len(done), "downloaded_at": [NOW] * len(done),
                               "duration_s": [300.0] * len(done)}),
        "segments": pa.table({"video_id": owner, "index": np.tile(np.arange(CLIPS_PER_VIDEO), len(done)),
                              "start_s": starts, "end_s": starts + 3.0, "text": ["a sentence"] * len(owner),
                              "source": ["manual"] * len(owner)}),
        "clips": pa.table({"clip_id": clip_ids, "video_id": owner, "start_s": starts,
                           "end_s": starts + 3.0, "text": ["a sentence"] * len(owner),
                           "source": ["manual"] * len(owner), "policy": ["subtitle_span"] * len(owner),
                           "split": ["train"] * len(owner)}),
    }


def _full(table: str, data: pa.Table) -> pa.Table:
    from schemas.tables import schema_for

    schema = schema_for(table)
    columns = [data.column(f.name) if f.name in data.column_names
               else pa.nulls(data.num_rows, f.type) for f in schema]
    return pa.table(columns, schema=schema)


def write_corpus(root: str, clips: int) -> Corpus:
    corpus = Corpus(root)
    n_videos = clips // CLIPS_PER_VIDEO
    count = corpus.init_partitions(partitions.choose(n_videos))
    by_partition: dict[str, list[str]] = {}
    for i in range(n_videos):
        vid = f"generic-v{i:07d}"
        by_partition.setdefault(partitions.partition_of(vid, count), []).append(vid)
    for label, videos in sorted(by_partition.items()):
        tables = _partition_tables(label, sorted(videos))
        for table, data in tables.items():
            key = "video_id"
            corpus.write_batch(table, _full(table, data), f"bench-{table}", label,
                               done=sorted(set(data.column(key).to_pylist())))
        clip_ids = tables["clips"].column("clip_id")
        featured = clip_ids.slice(0, len(clip_ids) * 99 // 100)
        corpus.write_batch("features/resnet34", _full("features", pa.table({
            "clip_id": featured, "extractor": ["resnet34"] * len(featured),
            "weights": ["none"] * len(featured), "shape": [[1]] * len(featured),
            "values": pa.array([[0.0]] * len(featured), pa.list_(pa.float16()))})),
            "bench-features", label, done=featured.to_pylist())
        index = PartitionIndex(label)
        index.add(ShardEntry(0, "train", len(featured)), featured.to_pylist())
        index.save(corpus)
        corpus.write_batch("errors", [], "bench-errors", label)
    return corpus


def plan_all(root: str) -> dict:
    """In this (fresh) process: every partition stage planned over every partition."""
    from pipeline.runner import plan_partition
    from pipeline.compose.stages import context, parts

    cfg = parse_config(CONFIG)
    ctx = context(Corpus(root), cfg)
    labels = ctx.corpus.labels()
    plan_s, todo = {}, {}
    for name in graph.PARTITION_STAGES:
        started = time.perf_counter()
        todo[name] = 0
        for stage in parts(name, cfg):
            for label in labels:
                todo[name] += plan_partition(stage, ctx, label).report.todo
        plan_s[name] = round(time.perf_counter() - started, 3)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"plan_s": plan_s, "todo": todo, "peak_rss_mb": round(rss, 1)}


def status_all(root: str) -> dict:
    """In this (fresh) process: `vlcorpus status` of the corpus (every stage, every partition)."""
    from pipeline.compose.status import corpus_status

    started = time.perf_counter()
    status = corpus_status(Corpus(root), parse_config(CONFIG))
    seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": round(seconds, 3), "peak_rss_mb": round(rss, 1),
            "todo": {name: counts["todo"] for name, counts in status["stages"].items()}}


def baseline(root: str) -> dict:
    """In this (fresh) process: the clips table as Python rows, as planning did before."""
    corpus = Corpus(root)
    started = time.perf_counter()
    rows = corpus.read("clips").to_pylist()
    groups: dict[str, list] = {}
    for row in rows:
        groups.setdefault(row["clip_id"], []).append(row)
    seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": round(seconds, 3), "peak_rss_mb": round(rss, 1), "rows": len(rows)}


def _child(mode: str, root: str) -> dict:
    out = subprocess.run([sys.executable, __file__, f"--{mode}", root], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=1_000_000)
    parser.add_argument("--root", help="where to write the synthetic corpus (default: a temp dir)")
    parser.add_argument("--plan", metavar="ROOT", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", metavar="ROOT", help=argparse.SUPPRESS)
    parser.add_argument("--status", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plan or args.baseline or args.status:
        print(json.dumps(plan_all(args.plan) if args.plan else status_all(args.status) if args.status
                         else baseline(args.baseline)))
        return
    with tempfile.TemporaryDirectory(prefix="vlcorpus-scale-") as tmp:
        root = args.root or tmp
        started = time.perf_counter()
        corpus = write_corpus(root, args.clips)
        print(f"wrote {args.clips} clips of {args.clips // CLIPS_PER_VIDEO} videos in "
              f"{corpus.partitions} partitions in {time.perf_counter() - started:.0f} s", flush=True)
        planned = _child("plan", root)
        status = _child("status", root)
        old = _child("baseline", root)
        files = {t: len(corpus.table_files(t)) for t in corpus.tables()}
    for stage, seconds in planned["plan_s"].items():
        print(f"plan {stage:<10} {seconds:8.2f} s   to do: {planned['todo'][stage]}")
    total = sum(planned["plan_s"].values())
    print(f"planning every stage: {total:.1f} s, peak RSS {planned['peak_rss_mb']:.0f} MB; "
          f"baseline (the clips table as Python rows, one stage's input): {old['seconds']:.1f} s, "
          f"peak RSS {old['peak_rss_mb']:.0f} MB: RSS ratio {old['peak_rss_mb'] / planned['peak_rss_mb']:.2f}x")
    print(f"vlcorpus status (every stage, every partition): {status['seconds']:.1f} s, "
          f"peak RSS {status['peak_rss_mb']:.0f} MB")
    runs = corpus.partitions * len(graph.PARTITION_STAGES) + 4  # + discover, listing, report, train
    print(json.dumps({"clips": args.clips, "plan_s": planned["plan_s"], "peak_rss_mb": planned["peak_rss_mb"],
                      "files": files, "task_runs": runs, "partitions": corpus.partitions,
                      "status": status, "baseline": old}))


if __name__ == "__main__":
    main()
