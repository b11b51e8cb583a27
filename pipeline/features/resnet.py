"""ImageNet ResNets from torchvision, one pooled vector per frame (WAL: ResNet-34 at 2 fps;
S-MiT: ResNet-152 at 1 fps)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import nn
from torchvision import models
from torchvision.models._api import WeightsEnum

from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.features.base import TorchVisualExtractor, frame_spec
from pipeline.features.registry import register
from pipeline.features.weights import downloads_off, torchvision_model, torchvision_needs
from pipeline.models.cache import Published

# name -> (builder, weights enum, feature size, default fps). zero_init_residual only matters
# for random init ("none"): without it ResNet-152 features reach 1e8, past float16 storage.
_ARCHS: dict[str, tuple[Callable[[], nn.Module], type[WeightsEnum], int, float]] = {
    "resnet34": (partial(models.resnet34, zero_init_residual=True), models.ResNet34_Weights, 512, 2.0),
    "resnet50": (partial(models.resnet50, zero_init_residual=True), models.ResNet50_Weights, 2048, 1.0),
    "resnet152": (partial(models.resnet152, zero_init_residual=True), models.ResNet152_Weights, 2048, 1.0),
}


def _needs(cfg: ExtractorConfig) -> list[Published]:
    return torchvision_needs(cfg.weights, _ARCHS[cfg.name][1])


@register(*_ARCHS, needs=_needs)
def build_resnet(cfg: ExtractorConfig, frames: FramesConfig, features: FeaturesConfig) -> TorchVisualExtractor:
    """[T, D] per clip: the global-average-pooled output of the last stage (fc dropped), on
    frames normalised with the ImageNet mean and std."""
    build, enum, dim, fps = _ARCHS[cfg.name]
    model, weights_id = torchvision_model(cfg.name, cfg.weights, build, enum, head="fc", off=downloads_off(features))
    return TorchVisualExtractor(
        name=cfg.name, weights_id=weights_id, dim=dim, spec=frame_spec(cfg, frames, fps=fps),
        pooled=False, layout="frames", model=model, features=features,
    )
