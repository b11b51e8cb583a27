"""Corpus-wide reads at many partitions: synthetic tables (no media) of N partitions written
through the project's own storage code, on a local root or on an S3 stand-in (moto's server),
then, each in a fresh process: `vlcorpus status`'s figures, the summary (`vlcorpus stats`), the
report's numbers, and a build's choice of the partitions with work, before and after every
partition's summary is stored (as the last task of a partition's chain stores it).

    python bench/summaries.py --partitions 2048 --s3
    python bench/summaries.py --partitions 64 --code /path/to/other/checkout   # a baseline

``--code`` runs the reads with another checkout's pipeline/ (one without summaries: the
figures before them). Prints one JSON line: {"partitions", "root", "write_s",
"cold": {read: s}, "store_s", "warm": {read: s}}.
Goals (issue 36): at 2048 partitions on the S3 stand-in, status and the report within 5 min.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("BENCH_CODE") or str(REPO))

import pyarrow as pa  # noqa: E402

from pipeline.config import parse_config  # noqa: E402
from pipeline.runner import error_row  # noqa: E402
from pipeline.shards.index import PartitionIndex, ShardEntry  # noqa: E402
from pipeline.storage import Corpus  # noqa: E402

VIDEOS_PER_PARTITION = 4
CONFIG = {"name": "summaries", "sources": [{"type": "urls", "urls": ["http://x/"]}],
          "transcribe": {"prefer": ["manual"]},
          "features": {"extractors": [{"name": "resnet34", "weights": "none"}]}}


def _write_partition(corpus: Corpus, label: str, index: int) -> None:
    from scale import _full, _partition_tables  # bench/scale.py's synthetic rows

    videos = [f"generic-p{index:05d}-v{i}" for i in range(VIDEOS_PER_PARTITION)]
    tables = _partition_tables(label, videos)
    for table, data in tables.items():
        corpus.write_batch(table, _full(table, data), f"bench-{table}", label,
                           done=sorted(set(data.column("video_id").to_pylist())))
    clip_ids = tables["clips"].column("clip_id")
    corpus.write_batch("features/resnet34", _full("features", pa.table({
        "clip_id": clip_ids, "extractor": ["resnet34"] * len(clip_ids), "weights": ["none"] * len(clip_ids),
        "shape": [[1]] * len(clip_ids), "values": pa.array([[0.0]] * len(clip_ids), pa.list_(pa.float16()))})),
        "bench-features", label, done=clip_ids.to_pylist())
    shard = PartitionIndex(label)
    shard.add(ShardEntry(0, "train", len(clip_ids)), clip_ids.to_pylist())
    shard.save(corpus)
    if index % 8 == 0:  # some partitions with a failure
        corpus.write_batch("errors", [error_row("download", videos[-1], "permanent", "HTTP Error 404", 1)],
                           "bench-errors", label)


def write_corpus(root: str, count: int) -> float:
    started = time.perf_counter()
    corpus = Corpus(root)
    corpus.init_partitions(count)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: _write_partition(corpus, corpus.labels()[i], i), range(count)))
    return time.perf_counter() - started


def read(what: str, root: str) -> float:
    """In this (fresh) process: one corpus-wide read, its seconds (the modules imported first:
    the reads, not the imports, are measured)."""
    import pipeline.report.stats  # noqa: F401
    import pipeline.stages  # noqa: F401
    import pipeline.status  # noqa: F401

    cfg, corpus = parse_config(CONFIG), Corpus(root)
    started = time.perf_counter()
    if what == "status":
        from pipeline.status import corpus_status

        corpus_status(corpus, cfg)
    elif what == "summary":
        from pipeline.summary import summarize

        summarize(corpus)
    elif what == "report":
        from pipeline.report.stats import compute_stats

        compute_stats(corpus)
    elif what == "idle":
        from pipeline.status import idle_partitions, partition_stages

        idle_partitions(corpus, cfg, [s.name for s in partition_stages(cfg)])
    elif what == "store":
        from pipeline.stages import context
        from pipeline.summarize_partition import store_summary

        ctx = context(corpus, cfg)
        with ThreadPoolExecutor(16) as pool:  # a build stores them from its tasks, in parallel
            list(pool.map(lambda label: store_summary(ctx, label), corpus.labels()))
    return round(time.perf_counter() - started, 3)


def _child(what: str, root: str, code: str | None) -> float:
    env = {**os.environ, **({"BENCH_CODE": code} if code else {})}
    out = subprocess.run([sys.executable, __file__, "--read", what, "--root", root], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--s3", action="store_true", help="an S3 root on moto's server")
    parser.add_argument("--code", help="another checkout whose pipeline/ does the reads")
    parser.add_argument("--skip-cold", action="store_true", help="no reads before the summaries are stored")
    parser.add_argument("--root")
    parser.add_argument("--read", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:
        print(json.dumps(read(args.read, args.root)))
        return
    server = None
    if args.s3:
        import s3fs
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        os.environ.update({"AWS_ENDPOINT_URL": "http://{}:{}".format(*server.get_host_and_port()),
                           "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                           "AWS_DEFAULT_REGION": "us-east-1"})
        s3fs.S3FileSystem().mkdir("bench")
        root = "s3://bench/corpus"
    else:
        root = args.root or tempfile.mkdtemp(prefix="vlc-summaries-")
    try:
        figures = {"partitions": args.partitions, "root": root,
                   "write_s": round(write_corpus(root, args.partitions), 1)}
        reads = ["status", "summary", "report"] + ([] if args.code else ["idle"])
        if not args.skip_cold:
            figures["cold"] = {what: _child(what, root, args.code) for what in reads}
        if not args.code:
            figures["store_s"] = _child("store", root, None)
            figures["warm"] = {what: _child(what, root, None) for what in reads}
        print(json.dumps(figures))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
