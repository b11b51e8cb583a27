"""TSM: ResNet-50 with the temporal shift module (Lin et al., 2019), as published by the TSM
project (github.com/mit-han-lab/temporal-shift-module); S-MiT used it on 8 frames.

Each shifted layer sees, per clip of T frames (segments), 1/div of its channels from the next
frame, 1/div from the previous one (zeros past the ends) and the rest from its own frame. With
"blockres" the shift sits on the residual branch, before conv1 of each bottleneck; with
"block" before the whole block. The checkpoints carry the setting in their file names, e.g.
``TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth``: div 8, blockres, 8 segments.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
from torch import nn
from torchvision import models

from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import SetupError
from pipeline.features.base import TorchVisualExtractor, frame_spec
from pipeline.features.registry import register
from pipeline.features.weights import (
    WeightsError,
    file_id,
    load_weights,
    on_meta,
    random_init,
    read_state_dict,
    strip_prefix,
)
from pipeline.progress import log

PUBLISHED = "https://hanlab.mit.edu/projects/tsm/models/"
PUBLISHED_FILE = "TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth"
_HOW_TO_GET = (f"; TSM checkpoints are published at {PUBLISHED} (e.g. {PUBLISHED_FILE}; see "
               "github.com/mit-han-lab/temporal-shift-module): keep the published file name, it "
               "holds the shift settings")


@dataclass(frozen=True)
class ShiftSettings:
    shift_div: int | None  # None: plain TSN, no shift
    place: str  # "blockres" or "block"
    segments: int | None  # the segment count it was trained with


DEFAULT_SETTINGS = ShiftSettings(shift_div=8, place="blockres", segments=8)


def parse_settings(path: str) -> ShiftSettings:
    """Shift settings from a checkpoint's file name, the way the TSM scripts read them."""
    name = os.path.basename(path)
    parts = os.path.splitext(name)[0].split("_")
    if "nl" in parts or "tpool" in parts:
        raise WeightsError(f"tsm_r50: {name}: non-local and temporal-pool TSM variants are not supported")
    segments = next((int(m.group(1)) for p in parts if (m := re.fullmatch(r"segment(\d+)", p))), None)
    for i, part in enumerate(parts):
        if (m := re.fullmatch(r"shift(\d+)", part)) and i + 1 < len(parts):
            place = parts[i + 1]
            if place not in ("blockres", "block"):
                raise WeightsError(f"tsm_r50: {name}: shift place {place!r} is not supported (blockres, block)")
            return ShiftSettings(int(m.group(1)), place, segments)
    if segments is not None:  # a TSM-project file without "shift": a TSN baseline
        return ShiftSettings(None, "blockres", segments)
    log.warning("tsm_r50: %s does not name its shift settings (like %s); assuming shift8 blockres",
                name, PUBLISHED_FILE)
    return DEFAULT_SETTINGS


class TemporalShift(nn.Module):
    """Shift part of the channels along time, then apply ``net``. Attribute names follow the
    TSM code (the wrapped layer is ``net``), so its checkpoints load as they are."""

    def __init__(self, net: nn.Module, segments: int, shift_div: int) -> None:
        super().__init__()
        self.net = net
        self.segments = segments
        self.shift_div = shift_div

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(shift(x, self.segments, self.shift_div))


def shift(x: torch.Tensor, segments: int, shift_div: int) -> torch.Tensor:
    """[N*T, C, H, W] -> same: channels [0, C/div) from frame t+1, [C/div, 2C/div) from t-1,
    zero where that frame does not exist; the others unchanged."""
    nt, c, h, w = x.shape
    x = x.view(nt // segments, segments, c, h, w)
    fold = c // shift_div
    out = torch.zeros_like(x)
    out[:, :-1, :fold] = x[:, 1:, :fold]
    out[:, 1:, fold:2 * fold] = x[:, :-1, fold:2 * fold]
    out[:, :, 2 * fold:] = x[:, :, 2 * fold:]
    return out.view(nt, c, h, w)


def tsm_resnet50(settings: ShiftSettings, segments: int) -> models.ResNet:
    """torchvision's ResNet-50, fc removed, with shifts placed as ``settings`` says. Its state
    dict keys are the TSM checkpoint's minus ``module.base_model.``."""
    net = models.resnet50(zero_init_residual=True)  # random init stays in range (see resnet.py)
    net.fc = nn.Identity()
    if settings.shift_div is not None:
        for stage in (net.layer1, net.layer2, net.layer3, net.layer4):
            for i, block in enumerate(stage):
                if settings.place == "blockres":
                    block.conv1 = TemporalShift(block.conv1, segments, settings.shift_div)
                else:
                    stage[i] = TemporalShift(block, segments, settings.shift_div)
    return net


class SegmentMean(nn.Module):
    """Frame features averaged over each clip's segments (TSN's "avg" consensus, taken before
    the classifier instead of after it)."""

    def __init__(self, net: nn.Module, segments: int) -> None:
        super().__init__()
        self.net = net
        self.segments = segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.net(x)
        return features.view(-1, self.segments, features.shape[-1]).mean(dim=1)


class TsmExtractor(TorchVisualExtractor):
    def adjust(self, clip: torch.Tensor) -> torch.Tensor:
        # The shift mixes neighbouring frames of one clip: every clip needs exactly T frames.
        if len(clip) != self.spec.frames:
            raise ValueError(f"tsm_r50: a clip of {len(clip)} frames; the model takes {self.spec.frames}")
        return clip


@register("tsm_r50")
def build_tsm(cfg: ExtractorConfig, frames: FramesConfig, features: FeaturesConfig) -> TsmExtractor:
    """[2048] per clip; frames default to the checkpoint's segment count (8), ImageNet
    normalisation, short side 256 and centre 224 as in TSM's single-crop test."""
    if cfg.weights == "default":
        raise WeightsError(f"tsm_r50 has no automatic download: set weights to the path of a TSM "
                           f"checkpoint{_HOW_TO_GET}")
    settings = DEFAULT_SETTINGS if cfg.weights == "none" else parse_settings(cfg.weights)
    if cfg.frames is None and cfg.fps is not None:
        raise SetupError("tsm_r50 takes a fixed number of frames (segments): set frames")
    segments = cfg.frames or settings.segments or 8
    spec = frame_spec(cfg, frames, count=segments)
    if cfg.weights == "none":
        net = random_init(cfg.name, lambda: tsm_resnet50(settings, segments))
        weights_id = "none"
    else:
        state = read_state_dict(cfg.name, cfg.weights, _HOW_TO_GET)
        # Keys are module.base_model.* (DataParallel around TSN) plus the classifier, new_fc.*
        state = {k: v for k, v in strip_prefix(state, "module.").items() if not k.startswith("new_fc.")}
        state = strip_prefix(state, "base_model.")
        net = on_meta(lambda: tsm_resnet50(settings, segments))
        load_weights(cfg.name, net, state, cfg.weights)
        weights_id = file_id(cfg.weights)
    return TsmExtractor(
        name=cfg.name, weights_id=weights_id, dim=2048, spec=spec, pooled=True, layout="frames",
        model=SegmentMean(net, segments), features=features,
    )
