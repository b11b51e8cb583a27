"""The two extractor interfaces the featurize stage drives, and the torch plumbing every visual
extractor shares: device and precision choice, the frame spec, batching and normalisation.

A visual extractor works in two steps so decoding and the model overlap:

    clip = extractor.prepare(frames)        # decode feeder thread: uint8 [T, H, W, 3] -> tensor
    feats = extractor.run([clip, ...])      # model thread: one batched forward, [T, D] or [D] each
    for feats in extractor.run_batches(batches): ...   # the same, the next batch's copy to the
                                                       # GPU overlapping this one's forward
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn
# The functions torchvision's weight transforms (ImageClassification) call: same pixels exactly.
from torchvision.transforms import functional as TF

from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.models.device import pick_device
from pipeline.errors import SetupError
from pipeline.media import FrameSpec

Precision = Literal["auto", "fp32", "bf16", "fp16"]
# How a visual model takes its input: "frames" sees every frame as an image (the frames of all
# clips of a batch go through as one batch), "clip" sees each clip as one [3, T, H, W] volume.
Layout = Literal["frames", "clip"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class VisualExtractor(abc.ABC):
    """Features of video clips. ``prepare`` runs in decode worker threads, ``run`` in the
    thread that owns the model."""

    name: str  # config name, e.g. "resnet34"
    weights_id: str  # what the rows record: "torchvision:<Enum>.<member>", "file:<name>#<sha12>", "none"
    dim: int  # feature size D
    spec: FrameSpec  # the frames this extractor wants
    pooled: bool  # True: one [D] vector per clip; False: [T, D]
    device: torch.device

    @abc.abstractmethod
    def prepare(self, frames: np.ndarray | torch.Tensor) -> torch.Tensor:
        """One clip's uint8 [T, H, W, 3] RGB frames (numpy, or a tensor: on the GPU when NVDEC
        decoded them) as the tensor ``run`` takes. Cheap and thread-safe."""

    @abc.abstractmethod
    def run(self, clips: list[torch.Tensor]) -> list[torch.Tensor]:
        """Features of prepared clips, in input order: float32 CPU tensors, [T, D] per clip or
        [D] when ``pooled``."""

    def run_batches(self, batches: Iterable[list[torch.Tensor]]) -> Iterator[list[torch.Tensor]]:
        """``run`` of each batch, in order. Extractors on a GPU take the next batch before they
        hand out this one's features, to move it to the device while the model works."""
        for clips in batches:
            yield self.run(clips)


class TextExtractor(abc.ABC):
    """Features of sentences."""

    name: str  # config name, e.g. "text:bert-base-uncased"
    weights_id: str
    dim: int
    keep_tokens: bool  # True: [K, D] per text (its K real tokens) instead of [D]

    @abc.abstractmethod
    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """float32 [D] per text (mean over its real tokens), or [K, D] when ``keep_tokens``."""


def torch_device(choice: str) -> torch.device:
    """The torch device for ``features.device``."""
    return torch.device(pick_device(choice, "features.device"))


def autocast_dtype(device: torch.device, precision: Precision) -> torch.dtype | None:
    """The autocast dtype for ``precision`` on ``device``; None: plain fp32. Reduced precision
    is for GPUs only: on the CPU it is slow and changes the features for nothing."""
    if device.type != "cuda" or precision == "fp32":
        return None
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return torch.bfloat16 if precision == "bf16" else torch.float16


@contextlib.contextmanager
def inference(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    """No autograd, and autocast to ``dtype`` when one is given."""
    with torch.inference_mode():
        if dtype is None:
            yield
        else:
            with torch.autocast(device.type, dtype=dtype):
                yield


def frame_spec(cfg: ExtractorConfig, frames: FramesConfig, *, fps: float | None = None,
               count: int | None = None) -> FrameSpec:
    """The extractor's FrameSpec: the config's fps/frames when set, else the model's default
    (one of ``fps`` and ``count``); sizes from the extractor config, else the shared frames config.

    With both fps and frames set, the spec asks for ``frames`` spread over the clip: clips cut
    to frames/fps seconds (HowTo100M's 3.2 s, S-MiT's 3 s) then get exactly that rate.
    """
    short_side = cfg.short_side or frames.short_side
    crop = cfg.crop or frames.crop
    if crop > short_side:
        raise SetupError(f"{cfg.name}: crop {crop} is larger than short side {short_side}")
    if cfg.frames is not None:
        return FrameSpec(frames=cfg.frames, short_side=short_side, crop=crop)
    if cfg.fps is not None:
        return FrameSpec(fps=cfg.fps, short_side=short_side, crop=crop)
    return FrameSpec(fps=fps, frames=count, short_side=short_side, crop=crop)


def fit_frames(clip: torch.Tensor, spec: FrameSpec) -> torch.Tensor:
    """uint8 [T, H, W, 3] frames at the spec's size. Frames from ``sample_frames`` already are,
    and pass untouched; others are resized (short side, antialiased bilinear) and centre
    cropped the way torchvision's classification transforms do."""
    height, width = clip.shape[1:3]
    if spec.crop is not None and (height, width) == (spec.crop, spec.crop):
        return clip
    if spec.crop is None and min(height, width) == spec.short_side:
        return clip
    chw = clip.permute(0, 3, 1, 2)
    if min(height, width) != spec.short_side:
        chw = TF.resize(chw, [spec.short_side], antialias=True)
    if spec.crop is not None:
        chw = TF.center_crop(chw, [spec.crop, spec.crop])
    return chw.permute(0, 2, 3, 1).contiguous()


@dataclass
class _Launched:
    """A batch whose forward passes are queued: per group of same-shaped clips, their indices,
    lengths and features (on the host, or arriving there until ``done``)."""

    size: int
    groups: list[tuple[list[int], list[int], torch.Tensor]] = field(default_factory=list)
    done: torch.cuda.Event | None = None
    sources: list[torch.Tensor] | None = None  # the staged host buffers, kept until ``done``


@dataclass
class _Staged:
    """Clips on their way to the model's device: ``ready`` marks the end of their copies, and
    ``sources`` keeps the page-locked host buffers they are copied from until the model has run
    on them (freed earlier, a buffer from ``torch.from_numpy`` could be reused mid-copy: the
    host allocator does not know it)."""

    clips: list[torch.Tensor]
    ready: torch.cuda.Event | None = None
    sources: list[torch.Tensor] | None = None


class TorchVisualExtractor(VisualExtractor):
    """A visual extractor around one torch module that maps normalised float input
    ([N, 3, H, W] for layout "frames", [N, 3, T, H, W] for "clip") to features ([N, D]; with
    layout "frames" and ``pooled``, the module pools each clip's frames itself, so N counts clips).

    Clips stay uint8 [T, H, W, 3] until they are on the device: a quarter of the bytes to move,
    and the permuted view is already channels-last, the layout convolutions run fastest in on
    GPUs. Conversion to float and normalisation happen on the device. On a GPU, clips come in
    page-locked memory and are copied on a stream of their own, so a copy runs while the model
    works on the batch before (``run_batches``).
    """

    def __init__(self, *, name: str, weights_id: str, dim: int, spec: FrameSpec, pooled: bool,
                 layout: Layout, model: nn.Module, features: FeaturesConfig,
                 mean: Sequence[float] | None = IMAGENET_MEAN,
                 std: Sequence[float] | None = IMAGENET_STD) -> None:
        self.name = name
        self.weights_id = weights_id
        self.dim = dim
        self.spec = spec
        self.pooled = pooled
        self.layout = layout
        self.device = torch_device(features.device)
        self.dtype = autocast_dtype(self.device, features.precision)
        self.memory_format = None
        self.copy_stream: torch.cuda.Stream | None = None
        if self.device.type == "cuda":
            self.memory_format = torch.channels_last if layout == "frames" else torch.channels_last_3d
            self.copy_stream = torch.cuda.Stream(self.device)
        model = model.eval().requires_grad_(False).float().to(self.device, memory_format=self.memory_format)
        self.model: nn.Module = torch.compile(model) if features.compile else model
        shape = (1, 3, 1, 1) if layout == "frames" else (1, 3, 1, 1, 1)
        self.mean = None if mean is None else torch.tensor(mean, device=self.device).view(shape)
        self.std = None if std is None else torch.tensor(std, device=self.device).view(shape)

    def prepare(self, frames: np.ndarray | torch.Tensor) -> torch.Tensor:
        clip = frames if isinstance(frames, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(frames))
        if clip.dtype != torch.uint8 or clip.ndim != 4 or clip.shape[-1] != 3 or not len(clip):
            raise ValueError(f"{self.name}: expected uint8 [T, H, W, 3] frames, got {frames.dtype} "
                             f"{list(frames.shape)}")
        clip = self.adjust(fit_frames(clip, self.spec))
        # Page-locked memory lets the copy to the GPU run asynchronously (frames received from
        # the decode pool are in it already: no copy then).
        return clip.pin_memory() if self.device.type == "cuda" and not clip.is_cuda else clip

    def adjust(self, clip: torch.Tensor) -> torch.Tensor:
        """Model-specific checks or fixes of a clip at the spec's size (e.g. segment count)."""
        return clip

    def run(self, clips: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._collect(self._launch(self._upload(clips)))

    def run_batches(self, batches: Iterable[list[torch.Tensor]]) -> Iterator[list[torch.Tensor]]:
        """Features of each batch, in order. On a GPU nothing here waits for the model while it
        has work queued: a batch's copy to the device and its forward pass are queued as soon as
        it is assembled (the copy on a stream of its own, the forward waiting for it on the
        device), and a batch's results, copied back without blocking, are read only once the
        next batch is queued. At most two batches are on the device at once."""
        launched: _Launched | None = None
        for clips in batches:
            queued = self._launch(self._upload(clips))
            if launched is not None:
                yield self._collect(launched)  # the GPU works on `queued` meanwhile
            launched = queued
        if launched is not None:
            yield self._collect(launched)

    def _upload(self, clips: list[torch.Tensor]) -> _Staged:
        """Start copying ``clips`` to the device (on the copy stream, not waiting for it)."""
        if self.copy_stream is None:
            return _Staged(clips)
        with torch.cuda.stream(self.copy_stream):
            moved = [clip.to(self.device, non_blocking=True) for clip in clips]
            ready = torch.cuda.Event()
            ready.record(self.copy_stream)
        compute = torch.cuda.current_stream(self.device)
        for clip in moved:
            clip.record_stream(compute)  # made on the copy stream, used on the compute stream
        return _Staged(moved, ready, clips)

    def _launch(self, staged: _Staged) -> _Launched:
        """Queue the forward passes of a staged batch and the copies of their results to the
        host; on the CPU they simply run."""
        if staged.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(staged.ready)
        clips = staged.clips
        # Only same-shaped input batches together: frames of one size, or clips of one shape
        # (clip lengths vary when the spec samples at an fps).
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, clip in enumerate(clips):
            key = tuple(clip.shape[1:] if self.layout == "frames" else clip.shape)
            groups.setdefault(key, []).append(i)
        launched = _Launched(len(clips), sources=staged.sources)
        for indices in groups.values():
            batch = [clips[i] for i in indices]
            launched.groups.append((indices, [len(c) for c in batch], self._forward(batch)))
        if self.device.type == "cuda":
            launched.done = torch.cuda.Event()
            launched.done.record(torch.cuda.current_stream(self.device))
        return launched

    def _to_host(self, features: torch.Tensor) -> torch.Tensor:
        """Float32 features on the host: on a GPU, a copy into page-locked memory that does not
        block (read once ``_Launched.done`` has passed)."""
        features = features.float()
        if features.device.type == "cpu":
            return features
        host = torch.empty(features.shape, dtype=features.dtype, pin_memory=True)
        return host.copy_(features, non_blocking=True)

    def _collect(self, launched: _Launched) -> list[torch.Tensor]:
        """Each clip's features of a launched batch, once its copies are done."""
        if launched.done is not None:
            launched.done.synchronize()
        out: list[torch.Tensor] = [torch.empty(0)] * launched.size
        for indices, lengths, features in launched.groups:
            if self.layout == "frames" and not self.pooled:
                parts = torch.split(features, lengths)
            else:
                parts = features.unbind(0)
            for i, part in zip(indices, parts):
                out[i] = part
        return out

    def _forward(self, batch: list[torch.Tensor]) -> torch.Tensor:
        with inference(self.device, self.dtype):
            if self.layout == "frames":
                x = torch.cat(batch).permute(0, 3, 1, 2)  # [sum T, 3, H, W]
            else:
                x = torch.stack(batch).permute(0, 4, 1, 2, 3)  # [N, 3, T, H, W]
            if self.memory_format is None:
                x = x.contiguous()
            x = x.float().div_(255)
            if self.mean is not None:
                x = x.sub_(self.mean).div_(self.std)
            return self._to_host(self.model(x))
