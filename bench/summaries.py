"""Corpus-wide reads at many partitions: synthetic tables (no media; the shards hold 1 KB of
random bytes a clip) of N partitions written through the project's own storage code, on a
local root or on an S3 stand-in (moto's server), then, each in a fresh process: `vlcorpus
status`'s figures, the summary (`vlcorpus stats`), the report's numbers, and a build's choice
of the partitions with work, before and after every partition's summary is stored (as the last
task of a partition's chain stores it); and `vlcorpus validate`'s full check (shards' sha256
included), which reads no summary. The corpus is a valid one (validate finds nothing): each
partition's videos hash into it, the video left undownloaded failed for good, and its one shard
is there in both formats, as the index records.

    python bench/summaries.py --partitions 2048 --s3
    python bench/summaries.py --partitions 64 --code /path/to/other/checkout   # a baseline
    python bench/summaries.py --partitions 64 --videos-per-partition 16 --s3  # validate's goal's size

``--code`` runs the reads with another checkout's pipeline/ (one without summaries: the
figures before them). Prints one JSON line: {"partitions", "videos", "root", "write_s", "validate_s",
"cold": {read: s}, "store_s", "warm": {read: s}}.
Goals (issue 36): at 2048 partitions on the S3 stand-in, status and the report within 5 min;
validate within 120 s at 1000 videos in 64 partitions.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("BENCH_CODE") or str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from pipeline.corpus import partitions  # noqa: E402
from pipeline.config import parse_config  # noqa: E402
from pipeline.runner import error_row  # noqa: E402
from pipeline.shards.index import PartitionIndex, ShardEntry  # noqa: E402
from pipeline.shards.parquet import part_name, write_part  # noqa: E402
from pipeline.shards.samples import Sample  # noqa: E402
from pipeline.shards.webdataset import tar_name, write_tar  # noqa: E402
from pipeline.corpus.storage import Corpus  # noqa: E402

CLIP_BYTES = 1024  # a clip's media in the shards: small, so that 2048 partitions fit moto's memory
CONFIG = {"name": "summaries", "sources": [{"type": "urls", "urls": ["http://x/"]}],
          "transcribe": {"prefer": ["manual"]},
          "features": {"extractors": [{"name": "resnet34", "weights": "none"}]}}


def _videos(count: int, per_partition: int) -> list[list[str]]:
    """``per_partition`` video ids of each partition, ids that hash into it (as validate checks)."""
    chosen: list[list[str]] = [[] for _ in range(count)]
    ids = (f"generic-v{i:07d}" for i in itertools.count())
    full = 0
    while full < count:
        video = next(ids)
        mine = chosen[partitions.index_of(video, count)]
        if len(mine) < per_partition:
            mine.append(video)
            full += len(mine) == per_partition
    return chosen


def _write_partition(corpus: Corpus, label: str, videos: list[str]) -> None:
    from scale import _full, _partition_tables  # bench/scale.py's synthetic rows

    tables = _partition_tables(label, videos)
    for table, data in tables.items():
        corpus.write_batch(table, _full(table, data), f"bench-{table}", label,
                           done=sorted(set(data.column("video_id").to_pylist())))
    clip_ids = tables["clips"].column("clip_id")
    corpus.write_batch("features/resnet34", _full("features", pa.table({
        "clip_id": clip_ids, "extractor": ["resnet34"] * len(clip_ids), "weights": ["none"] * len(clip_ids),
        "shape": [[1]] * len(clip_ids), "values": pa.array([[0.0]] * len(clip_ids), pa.list_(pa.float16()))})),
        "bench-features", label, done=clip_ids.to_pylist())
    # scale.py leaves the last video undownloaded: here it failed for good, so no key is lost.
    corpus.write_batch("errors", [error_row("download", videos[-1], "permanent", "HTTP Error 404", 1)],
                       "bench-errors", label)
    clips = tables["clips"].to_pylist()
    entry = ShardEntry(0, "train", len(clips))
    entry.files["webdataset"] = write_tar(corpus, tar_name("train", label, 0), [
        {"__key__": c["clip_id"], "mp4": np.random.bytes(CLIP_BYTES)} for c in clips])
    entry.files["parquet"] = write_part(corpus, part_name("train", label, 0), [
        Sample(c, {"resnet34": np.zeros(1, np.float16)}) for c in clips], ["resnet34"], 1024)
    shard = PartitionIndex(label)
    shard.add(entry, clip_ids.to_pylist())
    shard.save(corpus)


def _write_tables(root: str, count: int, per_partition: int) -> None:
    corpus = Corpus(root)
    corpus.init_partitions(count)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda label, videos: _write_partition(corpus, label, videos), corpus.labels(),
                      _videos(count, per_partition)))


def write_corpus(root: str, count: int, per_partition: int) -> float:
    started = time.perf_counter()
    if not root.startswith("s3://"):
        _write_tables(root, count, per_partition)
        return time.perf_counter() - started
    # moto lists a prefix by scanning every key of the bucket, and at thousands of partitions its
    # listings fail while writes beside them rename and delete: the tables are made on local disk
    # and uploaded as they are (what is measured is the reads).
    import fsspec

    with tempfile.TemporaryDirectory(prefix="vlc-summaries-") as local:
        _write_tables(local, count, per_partition)
        fsspec.filesystem("s3").put(f"{local}/", root.removeprefix("s3://"), recursive=True)
    return time.perf_counter() - started


def read(what: str, root: str) -> float:
    """In this (fresh) process: one corpus-wide read, its seconds (the modules imported first:
    the reads, not the imports, are measured)."""
    import pipeline.report.stats  # noqa: F401
    import pipeline.compose.stages  # noqa: F401
    import pipeline.compose.status  # noqa: F401

    cfg, corpus = parse_config(CONFIG), Corpus(root)
    started = time.perf_counter()
    if what == "status":
        from pipeline.compose.status import corpus_status

        corpus_status(corpus, cfg)
    elif what == "summary":
        from pipeline.corpus.summary import summarize

        summarize(corpus)
    elif what == "report":
        from pipeline.report.stats import compute_stats

        compute_stats(corpus)
    elif what == "idle":
        from pipeline.compose.status import idle_partitions, partition_stages

        idle_partitions(corpus, cfg, [s.name for s in partition_stages(cfg)])
    elif what == "validate":
        from pipeline.corpus.validate import validate

        problems = validate(corpus)
        if problems:  # a check that fails measures nothing
            raise SystemExit(f"{len(problems)} violations, the first: {problems[0]}")
    elif what == "store":
        from pipeline.compose.stages import context
        from pipeline.compose.summarize_partition import store_summary

        ctx = context(corpus, cfg)

        def store(label: str) -> None:
            for attempt in range(1, 4):  # a task of a build is retried too: moto fails a listing now and then
                try:
                    return store_summary(ctx, label)
                except OSError:
                    if attempt == 3:
                        raise

        with ThreadPoolExecutor(16) as pool:  # a build stores them from its tasks, in parallel
            list(pool.map(store, corpus.labels()))
    return round(time.perf_counter() - started, 3)


def _child(what: str, root: str, code: str | None) -> float:
    env = {**os.environ, **({"BENCH_CODE": code} if code else {})}
    out = subprocess.run([sys.executable, __file__, "--read", what, "--root", root], env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{what}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--videos-per-partition", type=int, default=4)
    parser.add_argument("--s3", action="store_true", help="an S3 root on moto's server")
    parser.add_argument("--code", help="another checkout whose pipeline/ does the reads")
    parser.add_argument("--skip-cold", action="store_true", help="no reads before the summaries are stored")
    parser.add_argument("--skip-validate", action="store_true", help="no validate (it reads every file)")
    parser.add_argument("--root")
    parser.add_argument("--read", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:
        print(json.dumps(read(args.read, args.root)))
        return
    server = made = None
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
        root = args.root or (made := tempfile.mkdtemp(prefix="vlc-summaries-"))
    try:
        figures = {"partitions": args.partitions, "videos": args.partitions * args.videos_per_partition, "root": root,
                   "write_s": round(write_corpus(root, args.partitions, args.videos_per_partition), 1)}
        if not args.skip_validate:
            figures["validate_s"] = _child("validate", root, args.code)
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
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


if __name__ == "__main__":
    main()
