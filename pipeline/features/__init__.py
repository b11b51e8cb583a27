"""Feature extractors: one module per family, registered by config name.

    extractor = build_extractor(cfg, config.frames, config.features)   # loads model + weights
    if isinstance(extractor, VisualExtractor):
        clip = extractor.prepare(frames)      # uint8 [T, H, W, 3] from media.sample_frames(extractor.spec)
        features = extractor.run([clip, ...]) # [T, D] or [D] per clip
    else:
        features = extractor.encode(texts)    # [D] or [K, D] per text

| name | output | default frames | weights "default" |
| --- | --- | --- | --- |
| resnet34 / resnet50 / resnet152 | [T, 512 / 2048] | 2 / 1 / 1 fps | torchvision ImageNet, from the torch cache |
| tsm_r50 | [2048] | 8 (the checkpoint's segments) | none: a TSM checkpoint path is required |
| s3d | [1024] | 16 | torchvision Kinetics-400, from the torch cache |
| s3d_howto100m | [512] video embedding | 32 | published s3d_howto100m.pth (+ s3d_dict.npy): refused until pinned |
| s3d_howto100m:mixed_5c | [1024] pooled Mixed_5c | 32 | as s3d_howto100m |
| text:s3d_howto100m | [512] text embedding | - | as s3d_howto100m |
| text:<hf id or folder> | [D] or [K, D] | - | the model itself, from a folder or the HF cache |

A published model missing from its cache is downloaded into it on first use
(pipeline/models/cache.py), and a weight file checked against its pinned sha256
(pipeline/models/pins.py); ``published_models`` names them for ``vlcorpus fetch-models``.
"""

from __future__ import annotations

from pipeline.config import TEXT_PREFIX, ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import SetupError
from pipeline.features import milnce, resnet, s3d, text, tsm  # noqa: F401  (each registers its builders)
from pipeline.features.base import TextExtractor, VisualExtractor, torch_device
from pipeline.features.registry import EXTRACTORS, NEEDS, Builder, Extractor, register, registered_name
from pipeline.features.weights import WeightsError
from pipeline.models.cache import Published


def _registered(cfg: ExtractorConfig) -> str:
    name = registered_name(cfg.name)
    if name is None:
        known = ", ".join(sorted(n for n in EXTRACTORS if n != TEXT_PREFIX))
        raise SetupError(f"unknown extractor {cfg.name!r}; known: {known}, {TEXT_PREFIX}<hf model>")
    return name


def build_extractor(cfg: ExtractorConfig, frames: FramesConfig, features: FeaturesConfig) -> Extractor:
    """The extractor ``cfg.name`` names, with its model and weights loaded: a missing weight
    file or package fails here, before any item runs; missing published weights are
    downloaded here (pipeline/models/cache.py)."""
    return EXTRACTORS[_registered(cfg)](cfg, frames, features)


def published_models(cfg: ExtractorConfig) -> list[Published]:
    """The published models ``build_extractor`` would download for ``cfg`` if they were not
    cached (none for local files and random init)."""
    needs = NEEDS.get(_registered(cfg))
    return [] if needs is None else needs(cfg)


__all__ = [
    "EXTRACTORS",
    "Builder",
    "Extractor",
    "TextExtractor",
    "VisualExtractor",
    "WeightsError",
    "build_extractor",
    "published_models",
    "torch_device",
    "register",
]
