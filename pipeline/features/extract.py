"""Features of a batch of clips, for the featurize stage (pipeline/featurize/stage.py).

For visual extractors, frames
are decoded once per video (``media.sample_frames``) in worker processes, one per core by
default (``media.decode_pool``), or on the GPU's video decoder (``media.nvdec``), into a bounded
queue of prepared model inputs; the main thread batches clips across videos and runs the model,
whose next batch is copied to the GPU while it works on this one, so decode and copies hide
behind compute. Rows hold float16 arrays ([T, D] or [D]).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from typing import Any

import numpy as np
import torch

from pipeline.config import Config, ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import BadInputError, StageError
from pipeline.features import build_extractor
from pipeline.features.base import TextExtractor, VisualExtractor
from pipeline.media import FrameRequest
from pipeline.media import nvdec
from pipeline.media.decode_pool import DECODE_WORKERS_ENV, FeederPool, plan_jobs, shared_pool, usable_cpus
from pipeline.progress import beat
from pipeline.runner import Item, Outcome, StageContext


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


def decode_processes(fcfg: FeaturesConfig) -> int:
    """``features.decode_workers``, or the worker's share of the cores (a local cluster's GPU
    worker: the cores per GPU), or one decode worker per CPU this process may use."""
    return fcfg.decode_workers or int(os.environ.get(DECODE_WORKERS_ENV, 0)) or usable_cpus()


def _host_buffer(device: torch.device) -> Callable[[tuple[int, ...]], np.ndarray]:
    """Where decoded frames are received: page-locked memory when they go to a GPU, so that
    ``prepare`` keeps them as they are and the copy to the device runs asynchronously."""
    if device.type != "cuda":
        return lambda shape: np.empty(shape, np.uint8)
    return lambda shape: torch.empty(shape, dtype=torch.uint8, pin_memory=True).numpy()


def _decoded(items: Sequence[Item], extractor: VisualExtractor, ctx: StageContext,
             processes: int, depth: int) -> Iterator[tuple[str, torch.Tensor | StageError]]:
    """Prepared clip tensors as they come, decoded by the worker processes of ``decode_pool``
    or on the GPU (``nvdec``)."""
    videos: dict[str, list[FrameRequest]] = {}
    for item in items:
        media = item.info.get("media_path")
        if not media:
            yield item.key, BadInputError("no media for this clip's video")
            continue
        videos.setdefault(media, []).append(
            FrameRequest(item.key, item.rows[0]["start_s"], item.rows[0]["end_s"], extractor.spec))
    if not videos:
        return
    if nvdec.use_nvdec(ctx.config.features.decode, extractor.device):
        # Whole videos: NVDEC decodes every frame from the start (no seeking), so a part of a
        # video would decode all that comes before it again.
        pool: FeederPool = nvdec.shared_pool(processes, extractor.device)
        jobs = plan_jobs(videos, 1)
    else:
        pool = shared_pool(processes, ctx.config.frames.decode_threads)
        jobs = plan_jobs(videos, pool.size, ctx.config.frames.skip_nonref)
    yield from pool.sample(jobs, ctx.corpus.local_file, depth, _host_buffer(extractor.device),
                           extractor.prepare)


def _visual(items: Sequence[Item], ctx: StageContext, extractor: VisualExtractor,
            ecfg: ExtractorConfig) -> list[Outcome]:
    fcfg: FeaturesConfig = ctx.config.features
    outcomes: dict[str, Outcome] = {}
    keys: deque[list[str]] = deque()  # of the batches handed to the model, oldest first

    def batches() -> Iterator[list[torch.Tensor]]:
        pending: list[tuple[str, torch.Tensor]] = []
        for key, prepared in _decoded(items, extractor, ctx, decode_processes(fcfg), fcfg.queue_size):
            beat()
            if isinstance(prepared, StageError):
                outcomes[key] = Outcome(key, kind=prepared.kind, message=str(prepared))
                continue
            pending.append((key, prepared))
            if len(pending) >= ecfg.batch_size:
                keys.append([k for k, _ in pending])
                yield [t for _, t in pending]
                pending = []
        if pending:
            keys.append([k for k, _ in pending])
            yield [t for _, t in pending]

    for results in extractor.run_batches(batches()):
        beat()
        for key, result in zip(keys.popleft(), results):
            array = result.float().numpy()
            frames = extractor.spec.frames if extractor.pooled else int(array.shape[0])
            outcomes[key] = Outcome(key, rows=[_row(key, extractor, array, extractor.spec.fps,
                                                    frames)])
    return [outcomes[i.key] for i in items]


def _text(items: Sequence[Item], extractor: TextExtractor, ecfg: ExtractorConfig) -> list[Outcome]:
    outcomes = []
    for start in range(0, len(items), ecfg.batch_size):
        chunk = items[start : start + ecfg.batch_size]
        vectors = extractor.encode([i.rows[0]["text"] for i in chunk])
        beat()
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
