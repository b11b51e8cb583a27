"""Peak memory of one training epoch on a large corpus: synthetic clips and features tables of N
clips (no media), streamed by the trainer (`pipeline.train.stream`), one epoch, then its peak
RSS and clips/s.

The features have the shapes of configs/howto100m.yaml's extractors by default: s3d [1024] per
clip and text:s3d_howto100m's word vectors [K, 300] (K = 12 here), float16 as featurize writes
them; so 1M clips take about 9 GB of disk. Each partition's table is one Parquet file sorted by
clip_id, in row groups of 8192 clips, as compaction leaves a built corpus. Writing runs in
a child process, so the peak RSS printed is the trainer's alone (its imports included).

    python bench/train_memory.py --clips 10000000          # the issue's target: under 4 GB
    python bench/train_memory.py --clips 1000000 --keep /tmp/corpus   # reuse the tables
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import StreamConfig, TrainConfig
from pipeline.corpus.storage import Corpus
from pipeline.corpus.tablefile import schema_for
from pipeline.train.loop import train
from pipeline.train.stream import PairStream

ROWS = 8_192  # clips generated at once: one row group of each file


def write_corpus(root: str, clips: int, per_video: int, partitions: int, visual: tuple[int, ...],
                 text: tuple[int, ...], test_share: float) -> None:
    """Clips and features tables of `clips` clips, `per_video` per video: per partition one file
    per table in clip_id order, as compaction leaves them, written a row group at a time."""
    corpus = Corpus(root)
    corpus.init_partitions(partitions)
    rng = np.random.default_rng(0)
    videos = -(-clips // per_video)
    part = np.array([int(corpus.partition_of(f"syn-{v:09d}")) for v in range(videos)])
    names = {"clips": None, "features/s3d": visual, "features/text_s3d_howto100m": text}
    for label in corpus.labels():
        clip_index = (np.flatnonzero(part == int(label))[:, None] * per_video + np.arange(per_video)).reshape(-1)
        clip_index = clip_index[clip_index < clips]
        with contextlib.ExitStack() as files:
            writers = {table: pq.ParquetWriter(files.enter_context(corpus.atomic_file(
                f"{table}/partition={label}/all.parquet")), schema_for(table), compression="zstd")
                for table in names}
            for start in range(0, len(clip_index), ROWS):
                index = clip_index[start:start + ROWS]
                for table, shape in names.items():
                    writers[table].write_table(_rows(table, index, per_video, shape, test_share, rng))
            for writer in writers.values():
                writer.close()


def _rows(table: str, index: np.ndarray, per_video: int, shape: tuple[int, ...] | None, test_share: float,
          rng: np.random.Generator) -> pa.Table:
    n = len(index)
    videos = [f"syn-{i // per_video:09d}" for i in index]
    ids = [f"{v}-{(i % per_video) * 3000:07d}-{(i % per_video) * 3000 + 3000:07d}" for v, i in zip(videos, index)]
    if shape is None:
        test = (index // per_video) % round(1 / test_share) == 0  # whole videos held out, as align does
        return pa.table({
            "clip_id": ids, "video_id": videos, "start_s": np.zeros(n), "end_s": np.full(n, 3.0),
            "text": [f"sentence {c}" for c in ids], "source": ["manual"] * n, "policy": ["fixed"] * n,
            "segment_index": np.zeros(n, np.int32), "candidates": pa.nulls(n, pa.list_(pa.string())),
            "split": np.where(test, "test", "train")}, schema=schema_for(table))
    size = int(np.prod(shape))
    values = rng.standard_normal((n, size), dtype=np.float32).astype(np.float16)
    return pa.table({
        "clip_id": ids, "extractor": [table] * n, "weights": ["none"] * n,
        "fps": pa.nulls(n, pa.float32()), "frames": pa.nulls(n, pa.int32()),
        "shape": pa.array([list(shape)] * n, pa.list_(pa.int32())),
        "values": pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * size, size, dtype=np.int32)),
                                           pa.array(values.reshape(-1)))}, schema=schema_for(table))


def one_epoch(root: str, args: argparse.Namespace) -> dict:
    cfg = TrainConfig(model="nce", visual="s3d", text="text:s3d_howto100m", epochs=1, finetune=False,
                      select="last", batch_size=args.batch_size, embed_dim=args.embed_dim,
                      stream=StreamConfig(above=0, held_out=args.held_out))
    stream = PairStream(Corpus(root), cfg.visual, cfg.text, cfg.stream)
    start = time.perf_counter()
    result = train(stream, cfg, Path(root) / "train", device="cpu", resume=False)
    seconds = time.perf_counter() - start
    return {"clips": args.clips, "pairs": result["data"]["pairs"], "epoch_s": round(seconds, 1),
            "clips_per_s": round(args.clips / seconds), "t2v_R@1": result["t2v"]["R@1"],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=10_000_000)
    parser.add_argument("--per-video", type=int, default=10, help="clips per video (HowTo100M: about 110)")
    parser.add_argument("--partitions", type=int, default=256)
    parser.add_argument("--visual-shape", default="1024", help="s3d: one 1024-d vector per clip")
    parser.add_argument("--text-shape", default="12,300", help="word2vec vectors of a narration's words")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--embed-dim", type=int, default=256)
    parser.add_argument("--held-out", type=int, default=2000, help="test pairs scored after the epoch")
    parser.add_argument("--keep", default=None, help="write the tables here and keep them (reused if present)")
    args = parser.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="train_memory_")
    shape = lambda text: tuple(int(d) for d in text.split(","))  # noqa: E731
    try:
        if not (Path(root) / "clips").exists():
            start = time.perf_counter()
            writer = multiprocessing.get_context("fork").Process(target=write_corpus, args=(
                root, args.clips, args.per_video, args.partitions, shape(args.visual_shape),
                shape(args.text_shape), 0.05))
            writer.start()
            writer.join()
            if writer.exitcode:
                raise SystemExit(f"writing the tables failed (exit {writer.exitcode})")
            print(f"wrote {args.clips} clips in {time.perf_counter() - start:.0f} s", flush=True)
        print(json.dumps(one_epoch(root, args)))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
