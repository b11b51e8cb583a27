"""torchvision's S3D trained on Kinetics-400: one 1024-d vector per clip."""

from __future__ import annotations

import torch
from torch import nn
from torchvision import models

from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import SetupError
from pipeline.features.base import TorchVisualExtractor, frame_spec
from pipeline.features.registry import register
from pipeline.features.weights import downloads_off, torchvision_model, torchvision_needs
from pipeline.models.cache import Published

_WEIGHTS = models.video.S3D_Weights
_TRANSFORMS = _WEIGHTS.KINETICS400_V1.transforms()
MIN_FRAMES = _WEIGHTS.KINETICS400_V1.meta["min_temporal_size"]  # 14: the final 2-frame pool needs it
MIN_SIZE = _WEIGHTS.KINETICS400_V1.meta["min_size"][0]  # 224: the final 7x7 pool needs it


class S3DPooled(nn.Module):
    """S3D up to its classifier: features, the model's own 2x7x7 average pool, then the mean
    over what is left, exactly as torchvision's forward does before and after the (linear)
    classifier."""

    def __init__(self, s3d: models.video.S3D) -> None:
        super().__init__()
        self.features = s3d.features
        self.avgpool = s3d.avgpool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.avgpool(self.features(x)).mean(dim=(2, 3, 4))


def _needs(cfg: ExtractorConfig) -> list[Published]:
    return torchvision_needs(cfg.weights, _WEIGHTS)


@register("s3d", needs=_needs)
def build_s3d(cfg: ExtractorConfig, frames: FramesConfig, features: FeaturesConfig) -> TorchVisualExtractor:
    """[1024] per clip; 16 frames by default, normalised with the Kinetics mean and std of
    torchvision's transforms for these weights. Frames keep their aspect ratio (short side,
    centre crop) where torchvision's transform squeezes them to 256x256 first."""
    spec = frame_spec(cfg, frames, count=16)
    if (spec.frames is not None and spec.frames < MIN_FRAMES) or (spec.crop or spec.short_side) < MIN_SIZE:
        raise SetupError(f"s3d needs at least {MIN_FRAMES} frames of at least {MIN_SIZE} px "
                         f"(got frames={spec.frames}, crop={spec.crop})")
    model, weights_id = torchvision_model(cfg.name, cfg.weights, models.video.s3d, _WEIGHTS, head="classifier",
                                          off=downloads_off(features))
    return TorchVisualExtractor(
        name=cfg.name, weights_id=weights_id, dim=1024, spec=spec, pooled=True, layout="clip",
        model=S3DPooled(model), features=features, mean=_TRANSFORMS.mean, std=_TRANSFORMS.std,
    )
