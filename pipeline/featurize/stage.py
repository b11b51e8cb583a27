"""The featurize stage: clips and media in, ``features/<extractor>`` rows out.

One runner stage per configured extractor (``featurize:<key>``), run one after the other for
a partition. The extraction itself (frames decoded once per video, models batched across
clips) is in pipeline/features/extract.py, imported when a batch runs: planning needs no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import Config, ExtractorConfig
from pipeline.ids import feature_key
from pipeline.setup import require_package
from pipeline.runner import Item, Outcome, Stage, StageContext, attach, rows_of


def clips_with_media(ctx: StageContext, partition: str, clip_ids: pa.Array) -> pa.Table:
    """Clips, each with its video's media path (the inputs of featurize and shard)."""
    clips = rows_of(ctx, "clips", partition, "clip_id", clip_ids)
    videos = pc.unique(clips.column("video_id"))
    media = rows_of(ctx, "downloads", partition, "video_id", videos, ["video_id", "media_path"])
    return attach(clips, media, "video_id")


def make_stage(ecfg: ExtractorConfig, cfg: Config) -> Stage:
    name = ecfg.name

    def process(items: Sequence[Item], ctx: StageContext) -> list[Outcome]:
        from pipeline.features.extract import extract

        return extract(items, ctx, name)

    def check(cfg: Config) -> None:
        # The model built once now: missing weights, packages or GPUs stop the build before
        # any download. It is built on the CPU: this is the build's own process, which never
        # initialises CUDA (a GPU is counted through NVML); the workers build it on their device.
        require_package("torch", f"the {name} extractor")
        if ecfg.is_text:
            require_package("transformers", f"the {name} extractor")
        import torch

        from pipeline.models.device import pick_device
        from pipeline.features import build_extractor
        from pipeline.media.nvdec import use_nvdec

        device = pick_device(cfg.features.device, "features.device")
        build_extractor(ecfg, cfg.frames, cfg.features.model_copy(update={"device": "cpu", "compile": False}))
        if not ecfg.is_text and device == "cpu":
            use_nvdec(cfg.features.decode, torch.device(device))  # "nvdec" without a GPU stops here

    return Stage(name=f"featurize:{feature_key(name)}", output=f"features/{feature_key(name)}",
                 source="clips", inputs=clips_with_media, process=process, key="clip_id",
                 order=("video_id",),
                 info=("media_path",), batch_size=cfg.features.clips_per_commit, check=check)


def stages(cfg: Config) -> list[Stage]:
    return [make_stage(e, cfg) for e in cfg.features.extractors]
