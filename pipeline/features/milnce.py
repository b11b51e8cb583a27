"""The MIL-NCE S3D-G and its text tower, trained on HowTo100M (Miech et al., 2020), as
published with github.com/antoine77340/S3D_HowTo100M: ``s3d_howto100m.pth`` plus the word list
``s3d_dict.npy``, which must sit next to it. ``weights: default`` is the published pair, kept in
torch's cache (``$TORCH_HOME/hub/checkpoints``) and downloaded into it on first use, once their
sha256 are pinned (pipeline/models/pins.py: they are not yet, and it is refused until then).

Module and attribute names follow that repository's ``s3dg.py`` so the published file loads
with an exact key match. Three extractors share one checkpoint read:

- ``s3d_howto100m``: [512] per clip, the joint text-video space (``video_embedding``);
- ``s3d_howto100m:mixed_5c``: [1024] per clip, the pooled Mixed_5c features the authors
  recommend for classification;
- ``text:s3d_howto100m``: [512] per sentence (``text_embedding``), comparable to the video
  embedding by dot product; with ``keep_tokens``, the tower's input instead: [K, 300] word2vec
  vectors of the sentence's K known words (the GoogleNews vectors, kept fixed in training,
  MIL-NCE appendix B), for a text tower trained from scratch as in the paper.

Video input is RGB in [0, 1], no mean/std, 32 frames at 10 fps by default, 200-256 px.
"""

from __future__ import annotations

import functools
import os
import re
import zlib
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import SetupError
from pipeline.features.base import TextExtractor, TorchVisualExtractor, autocast_dtype, frame_spec, inference, \
    torch_device
from pipeline.features.registry import register
from pipeline.features.weights import (
    WeightsError,
    downloads_off,
    file_id,
    load_weights,
    on_meta,
    published_file,
    random_init,
    read_state_dict,
)
from pipeline.models.cache import FETCH_HINT, Published, obtain
from pipeline.models.pins import pinned

PUBLISHED = "https://www.rocq.inria.fr/cluster-willow/amiech/howto100m/"
WEIGHTS_FILE = "s3d_howto100m.pth"
DICT_FILE = "s3d_dict.npy"
NUM_EMBEDDINGS = 66250  # the published word list plus padding token 0
MAX_WORDS = 16
EMBED_DIM = 512
_HOW_TO_GET = (f"; download {PUBLISHED}{WEIGHTS_FILE} and {PUBLISHED}{DICT_FILE} into one folder "
               f"(github.com/antoine77340/S3D_HowTo100M) and set weights to the .pth path")


# ---------------------------------------------------------------- the network


class STConv3D(nn.Module):
    """Conv3d + BatchNorm + ReLU; "separable" splits a k x k x k kernel into a 1 x k x k
    spatial conv (conv1/bn1) followed by a k x 1 x 1 temporal one (conv2/bn2)."""

    def __init__(self, input_dim: int, output_dim: int, kernel_size: Sequence[int],
                 stride: int = 1, padding: int | Sequence[int] = 0, separable: bool = False) -> None:
        super().__init__()
        self.separable = separable
        self.relu = nn.ReLU(inplace=True)
        if separable:
            k_t, k_h, k_w = kernel_size
            self.conv1 = nn.Conv3d(input_dim, output_dim, [1, k_h, k_w], stride=[1, stride, stride],
                                   padding=[0, padding, padding], bias=False)
            self.bn1 = nn.BatchNorm3d(output_dim)
            self.conv2 = nn.Conv3d(output_dim, output_dim, [k_t, 1, 1], stride=[stride, 1, 1],
                                   padding=[padding, 0, 0], bias=False)
            self.bn2 = nn.BatchNorm3d(output_dim)
        else:
            self.conv1 = nn.Conv3d(input_dim, output_dim, kernel_size, stride=stride, padding=padding, bias=False)
            self.bn1 = nn.BatchNorm3d(output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        if self.separable:
            out = self.relu(self.bn2(self.conv2(out)))
        return out


class SelfGating(nn.Module):
    """S3D-G feature gating: channels scaled by a sigmoid of a linear map of their mean."""

    def __init__(self, input_dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(input_dim, input_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.sigmoid(self.fc(x.mean(dim=(2, 3, 4))))
        return weights[:, :, None, None, None] * x


class MaxPool3dTFPadding(nn.Module):
    """Max pooling with TensorFlow's "SAME" padding (the weights come from TF): zero padding,
    the extra pixel at the end, ceil mode."""

    def __init__(self, kernel_size: Sequence[int], stride: Sequence[int]) -> None:
        super().__init__()
        # Pad k - s per axis, the odd pixel at the end. The original hands ConstantPad3d its
        # (H, W, T) pads where it reads (W, H, T); H and W pads are always equal, so do the same.
        pads = [(max(k - s, 0) // 2, max(k - s, 0) - max(k - s, 0) // 2) for k, s in zip(kernel_size, stride)]
        (t0, t1), (h0, h1), (w0, w1) = pads
        self.pad = nn.ConstantPad3d((h0, h1, w0, w1, t0, t1), 0)
        self.pool = nn.MaxPool3d(kernel_size, stride, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.pad(x))


class InceptionBlock(nn.Module):
    """Four branches (1x1; 1x1 then separable 3x3x3; the same again; 3x3x3 max pool then 1x1),
    each gated, concatenated."""

    def __init__(self, input_dim: int, num_outputs_0_0a: int, num_outputs_1_0a: int, num_outputs_1_0b: int,
                 num_outputs_2_0a: int, num_outputs_2_0b: int, num_outputs_3_0b: int) -> None:
        super().__init__()
        self.conv_b0 = STConv3D(input_dim, num_outputs_0_0a, [1, 1, 1])
        self.conv_b1_a = STConv3D(input_dim, num_outputs_1_0a, [1, 1, 1])
        self.conv_b1_b = STConv3D(num_outputs_1_0a, num_outputs_1_0b, [3, 3, 3], padding=1, separable=True)
        self.conv_b2_a = STConv3D(input_dim, num_outputs_2_0a, [1, 1, 1])
        self.conv_b2_b = STConv3D(num_outputs_2_0a, num_outputs_2_0b, [3, 3, 3], padding=1, separable=True)
        self.maxpool_b3 = nn.MaxPool3d((3, 3, 3), stride=1, padding=1)
        self.conv_b3_b = STConv3D(input_dim, num_outputs_3_0b, [1, 1, 1])
        self.gating_b0 = SelfGating(num_outputs_0_0a)
        self.gating_b1 = SelfGating(num_outputs_1_0b)
        self.gating_b2 = SelfGating(num_outputs_2_0b)
        self.gating_b3 = SelfGating(num_outputs_3_0b)
        self.output_dim = num_outputs_0_0a + num_outputs_1_0b + num_outputs_2_0b + num_outputs_3_0b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b0 = self.gating_b0(self.conv_b0(x))
        b1 = self.gating_b1(self.conv_b1_b(self.conv_b1_a(x)))
        b2 = self.gating_b2(self.conv_b2_b(self.conv_b2_a(x)))
        b3 = self.gating_b3(self.conv_b3_b(self.maxpool_b3(x)))
        return torch.cat((b0, b1, b2, b3), dim=1)


class SentenceEmbedding(nn.Module):
    """Word vectors (300-d word2vec) -> Linear+ReLU (2048) -> max over the 16 word slots
    (padding slots included, as trained) -> Linear (512)."""

    def __init__(self, embd_dim: int = EMBED_DIM, num_embeddings: int = NUM_EMBEDDINGS,
                 word_embedding_dim: int = 300, output_dim: int = 2048) -> None:
        super().__init__()
        self.word_embd = nn.Embedding(num_embeddings, word_embedding_dim)
        self.fc1 = nn.Linear(word_embedding_dim, output_dim)
        self.fc2 = nn.Linear(output_dim, embd_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(self.word_embd(tokens)))
        return self.fc2(x.max(dim=1).values)


class S3DG(nn.Module):
    """S3D-G with the space-to-depth stem (2x2x2 blocks folded into 24 channels), returning the
    512-d joint embedding (``fc`` of the pooled Mixed_5c) and the 1024-d pooled Mixed_5c."""

    def __init__(self, num_classes: int = EMBED_DIM) -> None:
        super().__init__()
        self.conv1 = STConv3D(24, 64, [2, 4, 4], stride=1, padding=(1, 2, 2))
        self.conv_2b = STConv3D(64, 64, [1, 1, 1])
        self.conv_2c = STConv3D(64, 192, [3, 3, 3], padding=1, separable=True)
        self.gating = SelfGating(192)
        self.maxpool_2a = MaxPool3dTFPadding(kernel_size=(1, 3, 3), stride=(1, 2, 2))
        self.maxpool_3a = MaxPool3dTFPadding(kernel_size=(1, 3, 3), stride=(1, 2, 2))
        self.mixed_3b = InceptionBlock(192, 64, 96, 128, 16, 32, 32)
        self.mixed_3c = InceptionBlock(self.mixed_3b.output_dim, 128, 128, 192, 32, 96, 64)
        self.maxpool_4a = MaxPool3dTFPadding(kernel_size=(3, 3, 3), stride=(2, 2, 2))
        self.mixed_4b = InceptionBlock(self.mixed_3c.output_dim, 192, 96, 208, 16, 48, 64)
        self.mixed_4c = InceptionBlock(self.mixed_4b.output_dim, 160, 112, 224, 24, 64, 64)
        self.mixed_4d = InceptionBlock(self.mixed_4c.output_dim, 128, 128, 256, 24, 64, 64)
        self.mixed_4e = InceptionBlock(self.mixed_4d.output_dim, 112, 144, 288, 32, 64, 64)
        self.mixed_4f = InceptionBlock(self.mixed_4e.output_dim, 256, 160, 320, 32, 128, 128)
        self.maxpool_5a = MaxPool3dTFPadding(kernel_size=(2, 2, 2), stride=(2, 2, 2))
        self.mixed_5b = InceptionBlock(self.mixed_4f.output_dim, 256, 160, 320, 32, 128, 128)
        self.mixed_5c = InceptionBlock(self.mixed_5b.output_dim, 384, 192, 384, 48, 128, 128)
        self.fc = nn.Linear(self.mixed_5c.output_dim, num_classes)
        self.text_module: SentenceEmbedding | None = SentenceEmbedding(num_classes)
        # Only random init ("none") sees this: PyTorch's default conv init shrinks activations
        # through 20 gated blocks to ~1e-10, making every clip's features the same.
        for module in self.modules():
            if isinstance(module, nn.Conv3d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    @staticmethod
    def space_to_depth(x: torch.Tensor) -> torch.Tensor:
        """[B, C, T, H, W] -> [B, 8C, T/2, H/2, W/2], offsets (t, h, w) major, as trained."""
        b, c, t, h, w = x.shape
        x = x.view(b, c, t // 2, 2, h // 2, 2, w // 2, 2).permute(0, 3, 5, 7, 1, 2, 4, 6)
        return x.reshape(b, 8 * c, t // 2, h // 2, w // 2)

    def mixed_5c_pooled(self, x: torch.Tensor) -> torch.Tensor:
        """[B, 3, T, H, W] in [0, 1], T, H, W even -> [B, 1024]."""
        net = self.conv1(self.space_to_depth(x))
        net = net[:, :, 1:, 1:, 1:]  # with the padding above, TF's "SAME" for the 2x4x4 stem
        net = self.maxpool_2a(net)
        net = self.gating(self.conv_2c(self.conv_2b(net)))
        net = self.maxpool_3a(net)
        net = self.mixed_3c(self.mixed_3b(net))
        net = self.maxpool_4a(net)
        for block in (self.mixed_4b, self.mixed_4c, self.mixed_4d, self.mixed_4e, self.mixed_4f):
            net = block(net)
        net = self.maxpool_5a(net)
        net = self.mixed_5c(self.mixed_5b(net))
        return net.mean(dim=(2, 3, 4))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        pooled = self.mixed_5c_pooled(x)
        return {"video_embedding": self.fc(pooled), "mixed_5c": pooled}


class VideoHead(nn.Module):
    """One of S3DG's two outputs as a plain tensor (what the extractor runs and compiles)."""

    def __init__(self, net: S3DG, output: str) -> None:
        super().__init__()
        self.net = net
        self.output = output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.net.mixed_5c_pooled(x)
        return self.net.fc(pooled) if self.output == "video_embedding" else pooled


# ---------------------------------------------------------------- words


class WordTokenizer:
    """Sentences -> [B, 16] token ids as the original does: lower case, words are runs of
    ``[\\w']``, unknown words dropped, the first 16 kept, 0-padded. Without a word list (random
    init) words hash into the table, so different sentences still differ."""

    def __init__(self, words: Sequence[str] | None) -> None:
        # Token 0 is padding; a word listed twice keeps its last index, as in the original.
        self.word_to_token = None if words is None else {str(w): i + 1 for i, w in enumerate(words)}

    def _token(self, word: str) -> int | None:
        if self.word_to_token is None:
            return 1 + zlib.crc32(word.encode()) % (NUM_EMBEDDINGS - 1)
        return self.word_to_token.get(word)

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        out = torch.zeros(len(texts), MAX_WORDS, dtype=torch.long)
        for row, text in enumerate(texts):
            tokens = [t for w in re.findall(r"[\w']+", str(text).lower()) if (t := self._token(w)) is not None]
            tokens = tokens[:MAX_WORDS]
            out[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        return out


def read_words(path: str) -> list[str]:
    dict_path = os.path.join(os.path.dirname(os.path.abspath(path)), DICT_FILE)
    if not os.path.isfile(dict_path):
        raise WeightsError(f"text:s3d_howto100m: word list {dict_path} does not exist; it must sit next to "
                           f"{os.path.basename(path)}{_HOW_TO_GET}")
    try:
        return [str(w) for w in np.load(dict_path, allow_pickle=False)]
    except (OSError, ValueError) as exc:
        raise WeightsError(f"text:s3d_howto100m: cannot read word list {dict_path}: {exc}") from None


# ---------------------------------------------------------------- loading


@functools.lru_cache(maxsize=1)
def _checkpoint(path: str, mtime_ns: int, size: int) -> dict[str, torch.Tensor]:
    # Keyed by the file's identity: the video and text extractors of one run read it once, and
    # share the tensors (load_weights assigns them instead of copying).
    return read_state_dict("s3d_howto100m", path, _HOW_TO_GET)


def _published() -> list[Published]:
    """The published checkpoint and its word list, in torch's cache side by side; refused while
    their sha256 are not pinned (pipeline/models/pins.py)."""
    folder = os.path.join(torch.hub.get_dir(), "checkpoints")
    try:
        return [published_file(f"MIL-NCE {file}", PUBLISHED + file, os.path.join(folder, file), pinned(file))
                for file in (WEIGHTS_FILE, DICT_FILE)]
    except SetupError as exc:
        raise WeightsError(f"{exc}{_HOW_TO_GET}") from None


def _needs(cfg: ExtractorConfig) -> list[Published]:
    return _published() if cfg.weights == "default" else []


def weights_path(name: str, weights: str, off: str | None) -> str:
    """``weights`` itself, or for "default" the published checkpoint in torch's cache (with its
    word list beside it), downloaded there unless ``off`` or an offline switch says why not."""
    if weights != "default":
        return weights
    try:
        checkpoint, words = _published()
    except WeightsError as exc:  # not pinned
        raise WeightsError(f"{name}: {exc}") from None

    def missing(reason: str) -> WeightsError:
        return WeightsError(f"{name}: the published {WEIGHTS_FILE} and {DICT_FILE} are not in the local cache "
                            f"({checkpoint.cache}), and {reason}{_HOW_TO_GET}, or put them into "
                            f"{checkpoint.cache} ({FETCH_HINT})")

    path = obtain(checkpoint, name, missing, off)
    obtain(words, name, missing, off)
    return path


def load_s3dg(name: str, weights: str) -> tuple[S3DG, str]:
    """The full network (video and text towers) with the weights of a file, or seeded random."""
    if weights == "none":
        return random_init(name, S3DG), "none"
    if not os.path.isfile(weights):
        raise WeightsError(f"{name}: weight file {weights} does not exist{_HOW_TO_GET}")
    stat = os.stat(weights)
    state = _checkpoint(os.path.abspath(weights), stat.st_mtime_ns, stat.st_size)
    net = on_meta(S3DG)
    load_weights(name, net, state, weights)
    return net, file_id(weights)


class MilNceVideoExtractor(TorchVisualExtractor):
    def adjust(self, clip: torch.Tensor) -> torch.Tensor:
        # Space-to-depth folds 2x2x2 blocks: an odd frame count repeats the last frame, an odd
        # height or width loses its last row or column.
        if len(clip) % 2:
            clip = torch.cat([clip, clip[-1:]])
        height, width = clip.shape[1] // 2 * 2, clip.shape[2] // 2 * 2
        return clip[:, :height, :width]


def _build_video(cfg: ExtractorConfig, frames: FramesConfig, features: FeaturesConfig,
                 output: str) -> MilNceVideoExtractor:
    net, weights_id = load_s3dg(cfg.name, weights_path(cfg.name, cfg.weights, downloads_off(features)))
    net.text_module = None  # the video extractor never needs the 20M-parameter word table
    return MilNceVideoExtractor(
        name=cfg.name, weights_id=weights_id, dim=EMBED_DIM if output == "video_embedding" else 1024,
        spec=frame_spec(cfg, frames, count=32), pooled=True, layout="clip",
        model=VideoHead(net, output), features=features, mean=None, std=None,
    )


@register("s3d_howto100m", needs=_needs)
def build_video(cfg: ExtractorConfig, frames: FramesConfig, features: FeaturesConfig) -> MilNceVideoExtractor:
    """[512] per clip: the joint text-video embedding."""
    return _build_video(cfg, frames, features, "video_embedding")


@register("s3d_howto100m:mixed_5c", needs=_needs)
def build_mixed_5c(cfg: ExtractorConfig, frames: FramesConfig, features: FeaturesConfig) -> MilNceVideoExtractor:
    """[1024] per clip: pooled Mixed_5c, for classification-style downstream use."""
    return _build_video(cfg, frames, features, "mixed_5c")


class MilNceTextExtractor(TextExtractor):
    """[512] per sentence from the text tower; dot products with ``s3d_howto100m`` video
    embeddings are the model's similarity scores. With ``keep_tokens``: [K, 300], the word2vec
    vectors of the K known words (a sentence with none: the padding vector, one row)."""

    def __init__(self, cfg: ExtractorConfig, features: FeaturesConfig) -> None:
        weights = weights_path(cfg.name, cfg.weights, downloads_off(features))
        net, self.weights_id = load_s3dg(cfg.name, weights)
        self.tokenize = WordTokenizer(None if weights == "none" else read_words(weights))
        self.name = cfg.name
        self.keep_tokens = cfg.keep_tokens
        self.dim = net.text_module.word_embd.embedding_dim if self.keep_tokens else EMBED_DIM
        self.device = torch_device(features.device)
        self.dtype = autocast_dtype(self.device, features.precision)
        assert net.text_module is not None
        self.module = net.text_module.eval().requires_grad_(False).float().to(self.device)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        tokens = self.tokenize(texts).to(self.device)
        with inference(self.device, self.dtype):
            if self.keep_tokens:
                words = self.module.word_embd(tokens).float().cpu().numpy()
                counts = (tokens != 0).sum(1).clamp(min=1).tolist()  # known words come first
                return [w[:n] for w, n in zip(words, counts)]
            out = self.module(tokens).float().cpu().numpy()
        return list(out)


@register("text:s3d_howto100m", needs=_needs)
def build_text(cfg: ExtractorConfig, frames: FramesConfig, features: FeaturesConfig) -> MilNceTextExtractor:
    return MilNceTextExtractor(cfg, features)
