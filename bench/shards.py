"""Shard write throughput against plain writes of the same bytes.

Builds a synthetic corpus (clips with a [T, 512] frame feature and a [384] text feature), then
prints MB/s of (a) the shard stage writing WebDataset alone against a plain ``tarfile`` write of
the same members, and (b) the shard stage writing Parquet alone against one
``pyarrow.parquet.write_table`` of the same table.
Usage: python bench/shards.py [--clips 4000]
"""

from __future__ import annotations

import argparse
import io
import shutil
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.config import Config, parse_config
from pipeline.ids import clip_id
from pipeline.shards.samples import batch_samples, feature_tables
from pipeline.shards.stage import write_shards
from pipeline.shards.webdataset import encode
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def make_corpus(root: Path, n: int) -> Corpus:
    corpus = Corpus(str(root))
    corpus.init_partitions(1)
    rng = np.random.default_rng(0)
    clips, frame_rows, text_rows = [], [], []
    for i in range(n):
        video = f"bench-v{i // 50:04d}"
        start = (i % 50) * 4.0
        cid = clip_id(video, start, start + 3.0)
        clips.append({"clip_id": cid, "video_id": video, "start_s": start, "end_s": start + 3.0,
                      "text": f"sentence number {i} about a room", "source": "manual",
                      "policy": "subtitle_span", "split": "train"})
        frames = rng.standard_normal((6, 512)).astype(np.float16)
        frame_rows.append({"clip_id": cid, "extractor": "resnet34", "weights": "none", "fps": 2.0,
                           "frames": 6, "shape": [6, 512], "values": frames.reshape(-1)})
        text = rng.standard_normal(384).astype(np.float16)
        text_rows.append({"clip_id": cid, "extractor": "text:minilm", "weights": "none",
                          "shape": [384], "values": text})
    videos = sorted({c["video_id"] for c in clips})
    corpus.write_partitioned("downloads", [{"video_id": v, "media_path": f"media/{v}.mp4", "status": "ok",
                                            "duration_s": 200.0, "downloaded_at": NOW} for v in videos],
                             "bench", done=videos)
    corpus.write_partitioned("clips", clips, "bench", done=videos)
    corpus.write_partitioned("features/resnet34", frame_rows, "bench", done=[r["clip_id"] for r in frame_rows])
    corpus.write_partitioned("features/text_minilm", text_rows, "bench", done=[r["clip_id"] for r in text_rows])
    return corpus


def config(webdataset: bool, parquet: bool) -> Config:
    return parse_config({"name": "bench", "sources": [{"type": "urls", "urls": ["http://x/"]}],
                         "shards": {"samples_per_shard": 1000, "webdataset": {"enabled": webdataset},
                                    "parquet": {"enabled": parquet}}})


def ours(corpus: Corpus, fmt: str) -> tuple[float, int]:
    """Seconds of the shard stage writing ``fmt`` alone (reading the tables included), bytes written."""
    shutil.rmtree(Path(corpus.url) / "shards", ignore_errors=True)
    ctx = context(corpus, config(fmt == "webdataset", fmt == "parquet"))
    start = time.perf_counter()
    write_shards(ctx)
    seconds = time.perf_counter() - start
    suffix = "tar" if fmt == "webdataset" else "parquet"
    return seconds, sum(p.stat().st_size for p in (Path(corpus.url) / "shards" / fmt).rglob(f"*.{suffix}"))


def plain_tar(corpus: Corpus, path: Path) -> float:
    """The same members written with nothing but tarfile (samples read beforehand)."""
    [partition] = corpus.labels()
    clips = corpus.read("clips", partition=partition).to_pylist()
    records = [encode(s, None) for s in batch_samples(corpus, partition, clips, feature_tables(corpus))]
    start = time.perf_counter()
    with tarfile.open(path, "w") as tar:
        for record in records:
            for ext, data in sorted(record.items()):
                if ext.startswith("__"):
                    continue
                info = tarfile.TarInfo(f"{record['__key__']}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return time.perf_counter() - start


def plain_parquet(corpus: Corpus, path: Path) -> float:
    """Our Parquet shards' table written again by one ``pyarrow.parquet.write_table``."""
    table = pq.read_table(sorted((Path(corpus.url) / "shards" / "parquet").rglob("*.parquet"))[0])
    start = time.perf_counter()
    pq.write_table(table, path, compression="zstd")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clips", type=int, default=4000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vlcorpus-bench-") as tmp:
        work = Path(tmp)
        corpus = make_corpus(work / "corpus", args.clips)
        ours_tar, tar_bytes = ours(corpus, "webdataset")
        plain_tar_s = plain_tar(corpus, work / "plain.tar")
        ours_pq, pq_bytes = ours(corpus, "parquet")
        plain_pq_s = plain_parquet(corpus, work / "plain.parquet")
    mb = 1e6
    print(f"{args.clips} clips; features resnet34 [6, 512] and text [384], float16")
    print(f"webdataset: ours {tar_bytes / mb / ours_tar:7.1f} MB/s ({ours_tar:.2f} s, reading the "
          f"tables included); plain tarfile {tar_bytes / mb / plain_tar_s:7.1f} MB/s; "
          f"ratio {plain_tar_s / ours_tar:.2f}")
    print(f"parquet:    ours {pq_bytes / mb / ours_pq:7.1f} MB/s ({ours_pq:.2f} s, reading the "
          f"tables included); plain write_table {pq_bytes / mb / plain_pq_s:7.1f} MB/s; "
          f"ratio {plain_pq_s / ours_pq:.2f}")


if __name__ == "__main__":
    main()
