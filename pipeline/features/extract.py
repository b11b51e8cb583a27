"""Features of a batch of clips, for the featurize stage (pipeline/featurize.py).

For visual extractors, frames
are decoded once per video (``media.sample_frames``) in background threads that also prepare
the model inputs, feeding a bounded queue; the main thread batches clips across videos and runs
the model, so decode hides behind compute. Rows hold float16 arrays ([T, D] or [D]).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import numpy as np
import torch

from pipeline.config import Config, ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import BadInputError
from pipeline.features import build_extractor
from pipeline.features.base import TextExtractor, VisualExtractor
from pipeline.media import FrameRequest, sample_frames
from pipeline.runner import Item, Outcome, StageContext

_END = object()


@cache
def _extractor(extractor: str, frames: str, features: str) -> VisualExtractor | TextExtractor:
    # One model per worker process and extractor, built on first use (JSON keys: hashable).
    return build_extractor(ExtractorConfig.model_validate_json(extractor),
                           FramesConfig.model_validate_json(frames),
                           FeaturesConfig.model_validate_json(features))


def extractor_for(cfg: Config, name: str) -> VisualExtractor | TextExtractor:
    ecfg = next(e for e in cfg.features.extractors if e.name == name)
    return _extractor(ecfg.model_dump_json(), cfg.frames.model_dump_json(),
                      cfg.features.model_dump_json())


def _row(clip: str, extractor: VisualExtractor | TextExtractor, array: np.ndarray,
         fps: float | None, frames: int | None) -> dict[str, Any]:
    half = np.ascontiguousarray(array, dtype=np.float16)
    return {"clip_id": clip, "extractor": extractor.name, "weights": extractor.weights_id,
            "fps": fps, "frames": frames, "shape": list(half.shape),
            "values": half.reshape(-1)}


def _decoded(items: Sequence[Item], extractor: VisualExtractor, ctx: StageContext,
             workers: int, depth: int) -> Iterator[tuple[str, torch.Tensor | BadInputError]]:
    """Prepared clip tensors, decoded per video in background threads through a bounded queue."""
    by_video: dict[str, list[Item]] = {}
    for item in items:
        by_video.setdefault(item.info.get("media_path") or "", []).append(item)
    out: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: object) -> None:
        # Give up when the consumer has gone (it failed), instead of blocking forever.
        while not stop.is_set():
            try:
                out.put(entry, timeout=0.1)
                return
            except queue.Full:
                continue

    def decode(media: str, group: list[Item]) -> None:
        done: set[str] = set()
        try:
            if not media:
                raise BadInputError("no media for this clip's video")
            requests = [FrameRequest(i.key, i.rows[0]["start_s"], i.rows[0]["end_s"],
                                     extractor.spec) for i in group]
            with ctx.corpus.local_file(media) as path:
                for key, frames in sample_frames(path, requests):
                    done.add(key)
                    put((key, frames if isinstance(frames, BadInputError)
                         else extractor.prepare(frames)))
        except Exception as exc:  # noqa: BLE001 - becomes these clips' error rows
            error = exc if isinstance(exc, BadInputError) else BadInputError(f"decode failed: {exc}")
            for item in group:
                if item.key not in done:
                    put((item.key, error))
        finally:
            put(_END)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for media, group in by_video.items():
            pool.submit(decode, media, group)
        try:
            finished = 0
            while finished < len(by_video):
                got = out.get()
                if got is _END:
                    finished += 1
                else:
                    yield got
        finally:
            stop.set()


def _visual(items: Sequence[Item], ctx: StageContext, extractor: VisualExtractor,
            ecfg: ExtractorConfig) -> list[Outcome]:
    fcfg: FeaturesConfig = ctx.config.features
    outcomes: dict[str, Outcome] = {}
    pending: list[tuple[str, torch.Tensor]] = []

    def flush() -> None:
        results = extractor.run([t for _, t in pending])
        for (key, _), result in zip(pending, results):
            array = result.float().numpy()
            frames = extractor.spec.frames if extractor.pooled else int(array.shape[0])
            outcomes[key] = Outcome(key, rows=[_row(key, extractor, array, extractor.spec.fps,
                                                    frames)])
        pending.clear()

    for key, prepared in _decoded(items, extractor, ctx, fcfg.decode_workers, fcfg.queue_size):
        if isinstance(prepared, BadInputError):
            outcomes[key] = Outcome(key, kind=prepared.kind, message=str(prepared))
            continue
        pending.append((key, prepared))
        if len(pending) >= ecfg.batch_size:
            flush()
    if pending:
        flush()
    return [outcomes[i.key] for i in items]


def _text(items: Sequence[Item], extractor: TextExtractor, ecfg: ExtractorConfig) -> list[Outcome]:
    outcomes = []
    for start in range(0, len(items), ecfg.batch_size):
        chunk = items[start : start + ecfg.batch_size]
        vectors = extractor.encode([i.rows[0]["text"] for i in chunk])
        for item, vector in zip(chunk, vectors):
            outcomes.append(Outcome(item.key, rows=[_row(item.key, extractor, vector, None, None)]))
    return outcomes


def extract(items: Sequence[Item], ctx: StageContext, name: str) -> list[Outcome]:
    """Features of extractor ``name`` for a batch of clips (media_path in each item's info)."""
    ecfg = next(e for e in ctx.config.features.extractors if e.name == name)
    extractor = extractor_for(ctx.config, name)
    if isinstance(extractor, TextExtractor):
        return _text(items, extractor, ecfg)
    return _visual(items, ctx, extractor, ecfg)
