"""Shard write throughput against plain writes of the same bytes.

Builds a synthetic corpus (clips with a [T, 512] frame feature and a [384] text feature), then
prints MB/s of (a) our WebDataset writer against a plain ``tarfile`` write of the same members,
and (b) our Parquet writer against one ``pyarrow.parquet.write_table`` of the same table.
Usage: python bench/shards.py [--clips 4000]
"""

from __future__ import annotations

import argparse
import io
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.config import parse_config
from pipeline.ids import clip_id
from pipeline.shards.parquet import write_parquet
from pipeline.shards.samples import ordered_clips, samples
from pipeline.shards.webdataset import encode, write_webdataset
from pipeline.storage import Corpus


def make_corpus(root: Path, n: int) -> Corpus:
    corpus = Corpus(str(root))
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
    corpus.write_batch("clips", clips, "bench", done={c["video_id"]: 50 for c in clips})
    corpus.write_batch("features/resnet34", frame_rows, "bench",
                       done={r["clip_id"]: 1 for r in frame_rows})
    corpus.write_batch("features/text_minilm", text_rows, "bench",
                       done={r["clip_id"]: 1 for r in text_rows})
    return corpus


def plain_tar(corpus: Corpus, path: Path) -> float:
    """The same members written with nothing but tarfile (samples read beforehand)."""
    records = [encode(s, None) for s in samples(corpus, ordered_clips(corpus, "train"))]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clips", type=int, default=4000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vlcorpus-bench-") as tmp:
        work = Path(tmp)
        corpus = make_corpus(work / "corpus", args.clips)
        cfg = parse_config({"name": "bench", "sources": [{"type": "urls", "urls": ["http://x/"]}],
                            "shards": {"samples_per_shard": 1000}})
        start = time.perf_counter()
        write_webdataset(corpus, cfg)
        ours_tar = time.perf_counter() - start
        tar_bytes = sum(p.stat().st_size for p in (work / "corpus/shards/webdataset").glob("*.tar"))
        plain_tar_s = plain_tar(corpus, work / "plain.tar")

        start = time.perf_counter()
        write_parquet(corpus, cfg)
        ours_pq = time.perf_counter() - start
        files = sorted((work / "corpus/shards/parquet").rglob("*.parquet"))
        pq_bytes = sum(p.stat().st_size for p in files)
        table = pq.read_table(files[0].parent)
        start = time.perf_counter()
        pq.write_table(table, work / "plain.parquet", compression="zstd")
        plain_pq_s = time.perf_counter() - start
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
