"""WebDataset tar shards: one sample per clip, key = clip_id.

Members: ``json`` (the clip row), ``txt`` (its sentence), one ``<extractor>.npy`` per feature
and, when configured, ``mp4`` (the clip cut from its video, all clips of a video in one ffmpeg
process). Shards are ``{split}-{000000}.tar``, cut by sample count and bytes, written under a
temporary name and renamed when complete; tar headers carry no time or owner, so a rebuild
from the same inputs gives the same bytes.
"""

from __future__ import annotations

import io
import json
import posixpath
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import webdataset as wds

from pipeline.config import Config, WebDatasetConfig
from pipeline.errors import BadInputError
from pipeline.ids import batch_name, check_member
from pipeline.media import ClipCut, cut_clips
from pipeline.progress import track
from pipeline.shards.hashing import HashingWriter
from pipeline.shards.index import ShardEntry, ShardIndex
from pipeline.shards.samples import Sample, ordered_clips, samples
from pipeline.storage import TMP_PREFIX, Corpus

FOLDER = "shards/webdataset"
SPLITS = ("train", "val", "test")


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def encode(sample: Sample, mp4: bytes | None) -> dict[str, Any]:
    clip = sample.clip
    record: dict[str, Any] = {
        "__key__": clip["clip_id"],
        "json": json.dumps(clip, sort_keys=True, ensure_ascii=False).encode(),
        "txt": clip["text"].encode(),
    }
    for key, array in sorted(sample.features.items()):
        record[f"{key}.npy"] = npy_bytes(array)
    if mp4 is not None:
        record["mp4"] = mp4
    for member in record:
        if member != "__key__":
            check_member(f"{record['__key__']}.{member}")
    return record


@dataclass
class _Open:
    """The shard being written."""

    name: str
    tmp: str
    handle: Any
    hasher: HashingWriter
    writer: wds.TarWriter
    clips: list[str] = field(default_factory=list)


class ShardSink:
    """Packs records into shards of at most ``samples_per_shard`` samples and ``max_bytes``."""

    def __init__(self, corpus: Corpus, index: ShardIndex, split: str, cfg: WebDatasetConfig,
                 on_close: Callable[[], None]) -> None:
        self.corpus, self.index, self.split, self.cfg = corpus, index, split, cfg
        self.on_close = on_close
        self.current: _Open | None = None
        self.number = index.next_number(split)

    def write(self, record: dict[str, Any]) -> None:
        size = sum(len(v) for k, v in record.items() if not k.startswith("__"))
        cur = self.current
        if cur is not None and (len(cur.clips) >= self.cfg.samples_per_shard
                                or cur.hasher.bytes + size > self.cfg.max_bytes):
            self.close()
        if self.current is None:
            self.current = self._open()
        self.current.writer.write(record)
        self.current.clips.append(record["__key__"])

    def _open(self) -> _Open:
        name = f"{self.split}-{self.number:06d}.tar"
        self.number += 1
        folder = self.corpus.path(FOLDER)
        self.corpus.fs.makedirs(folder, exist_ok=True)
        tmp = posixpath.join(folder, f"{TMP_PREFIX}{name}-{uuid.uuid4().hex}")
        handle = self.corpus.fs.open(tmp, "wb")
        hasher = HashingWriter(handle)
        writer = wds.TarWriter(hasher, user="vlcorpus", group="vlcorpus", mtime=0)
        return _Open(name, tmp, handle, hasher, writer)

    def close(self) -> None:
        cur, self.current = self.current, None
        if cur is None:
            return
        cur.writer.close()
        cur.handle.close()
        self.corpus.fs.mv(cur.tmp, self.corpus.path(FOLDER, cur.name))
        self.index.add(ShardEntry(cur.name, self.split, len(cur.clips), cur.hasher.bytes,
                                  cur.hasher.sha256, cur.clips))
        self.on_close()


def _video_clips(corpus: Corpus, cfg: Config, media: dict[str, str],
                 clips: list[dict[str, Any]], workdir: str) -> dict[str, bytes | BadInputError]:
    """All clips of one video cut in one ffmpeg process."""
    video = clips[0]["video_id"]
    if video not in media:
        return {c["clip_id"]: BadInputError(f"no media for {video}") for c in clips}
    mcfg = cfg.shards.webdataset.media
    cuts = [ClipCut(c["clip_id"], c["start_s"], c["end_s"],
                    posixpath.join(workdir, f"{c['clip_id']}.mp4")) for c in clips]
    with corpus.local_file(media[video]) as path:
        made = cut_clips(path, cuts, precision=mcfg.precision, height=mcfg.height, fps=mcfg.fps,
                         codec=mcfg.codec, audio=mcfg.audio)
    out: dict[str, bytes | BadInputError] = {}
    for cid, result in made.items():
        if isinstance(result, BadInputError):
            out[cid] = result
        else:
            with open(result, "rb") as handle:
                out[cid] = handle.read()
    return out


def _with_media(corpus: Corpus, cfg: Config, stream: Iterator[Sample],
                errors: list[dict[str, Any]]) -> Iterator[tuple[Sample, bytes | None]]:
    """Samples with their mp4 bytes; a clip that cannot be cut becomes an errors row."""
    if not cfg.shards.webdataset.include_media:
        yield from ((s, None) for s in stream)
        return
    media = {r["video_id"]: r["media_path"] for r in corpus.read(
        "downloads", columns=["video_id", "media_path"]).to_pylist()}
    buffered: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="vlcorpus-cut-") as workdir:
        def flush() -> Iterator[tuple[Sample, bytes | None]]:
            cut = _video_clips(corpus, cfg, media, [s.clip for s in buffered], workdir)
            for sample in buffered:
                result = cut[sample.clip["clip_id"]]
                if isinstance(result, BadInputError):
                    errors.append(_error(sample.clip["clip_id"], str(result)))
                else:
                    yield sample, result
            buffered.clear()

        for sample in stream:
            if buffered and buffered[0].clip["video_id"] != sample.clip["video_id"]:
                yield from flush()
            buffered.append(sample)
        if buffered:
            yield from flush()


def _error(clip: str, message: str) -> dict[str, Any]:
    return {"stage": "shard", "item_id": clip, "kind": "bad_input", "message": message,
            "attempt": 1, "time": datetime.now(UTC)}


def write_webdataset(corpus: Corpus, cfg: Config) -> dict[str, Any]:
    """Write shards for every clip not yet in one; returns counts per split."""
    wcfg = cfg.shards.webdataset
    corpus.sweep_temporary(FOLDER)
    index = ShardIndex.load(corpus, FOLDER)
    written: dict[str, int] = {}
    errors: list[dict[str, Any]] = []
    for split in SPLITS:
        known = index.known(split)
        clips = [c for c in ordered_clips(corpus, split) if c["clip_id"] not in known]
        if not clips:
            continue
        sink = ShardSink(corpus, index, split, wcfg, on_close=lambda: index.save(corpus))
        stream = samples(corpus, clips)
        for sample, mp4 in track(_with_media(corpus, cfg, stream, errors),
                                 f"webdataset {split}", total=len(clips)):
            sink.write(encode(sample, mp4))
            written[split] = written.get(split, 0) + 1
        sink.close()
    if errors:
        corpus.write_batch("errors", errors, f"shard-{batch_name([e['item_id'] for e in errors])}")
    return {"written": written, "shards": len(index.shards), "samples": index.count(),
            "errors": len(errors)}
