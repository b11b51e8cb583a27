"""Sentence features from any Hugging Face encoder (BERT for WAL, BART for S-MiT, MiniLM...):
``text:<model id or folder>``. Models load from a local folder or the Hugging Face cache, where
a model id is downloaded on first use (pipeline/models/cache.py); transformers itself never goes
to the network. Encoder-decoder models (BART, T5) use their encoder.
"""

from __future__ import annotations

import os

import numpy as np

from pipeline.config import TEXT_PREFIX, ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import SetupError
from pipeline.features.base import TextExtractor, autocast_dtype, inference, torch_device
from pipeline.features.registry import register
from pipeline.features.weights import WeightsError, downloads_off, file_id, local_weights, random_init
from pipeline.models.hub import cache_folder, hub_model
from pipeline.models.cache import FETCH_HINT, Published, obtain

# The file of a saved model whose hash identifies its weights, in order of preference.
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                 "pytorch_model.bin.index.json")
_UNBOUNDED = 1_000_000  # tokenizers without a length limit report a huge model_max_length


class HFTextExtractor(TextExtractor):
    """Mean of the last hidden states over the real tokens (attention mask), or those token
    vectors themselves with ``keep_tokens`` (special tokens included, so their mean is the
    pooled vector)."""

    def __init__(self, cfg: ExtractorConfig, features: FeaturesConfig) -> None:
        source = _source(cfg)
        folder = _local_folder(cfg.name, source, downloads_off(features))
        try:
            from transformers import AutoConfig, AutoModel, AutoTokenizer
        except ImportError as exc:
            raise SetupError(f"{cfg.name} needs the transformers package ({exc}); pip install transformers") from None
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            if cfg.weights == "none":
                config = AutoConfig.from_pretrained(folder, local_files_only=True)
                model = random_init(cfg.name, lambda: AutoModel.from_config(config))
            else:
                model = AutoModel.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise WeightsError(_missing_model(cfg.name, source, _first_line(exc))) from None
        if model.config.is_encoder_decoder:
            model = model.get_encoder()
        self.name = cfg.name
        self.weights_id = "none" if cfg.weights == "none" else _weights_id(source, folder)
        self.dim = int(model.config.hidden_size)
        self.keep_tokens = cfg.keep_tokens
        self.batch_size = cfg.batch_size
        self.device = torch_device(features.device)
        self.dtype = autocast_dtype(self.device, features.precision)
        self.tokenizer = tokenizer
        limit = tokenizer.model_max_length
        self.max_length = limit if limit < _UNBOUNDED else getattr(model.config, "max_position_embeddings", 512)
        self.model = model.eval().requires_grad_(False).float().to(self.device)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        # Texts of similar length batch together: less padding to run through the model.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[np.ndarray] = [np.empty(0, np.float32)] * len(texts)
        for start in range(0, len(order), self.batch_size):
            indices = order[start:start + self.batch_size]
            batch = self.tokenizer([texts[i] for i in indices], padding=True, truncation=True,
                                   max_length=self.max_length, return_tensors="pt").to(self.device)
            with inference(self.device, self.dtype):
                hidden = self.model(**batch).last_hidden_state.float()
            mask = batch["attention_mask"].bool()
            if self.keep_tokens:
                rows = [h[m].cpu().numpy() for h, m in zip(hidden, mask)]
            else:
                summed = (hidden * mask[..., None]).sum(dim=1)
                rows = list((summed / mask.sum(dim=1, keepdim=True).clamp(min=1)).cpu().numpy())
            for i, row in zip(indices, rows):
                out[i] = row
        return out


def _source(cfg: ExtractorConfig) -> str:
    """The model id or folder ``cfg`` loads (its weights, where they name a folder)."""
    if cfg.weights in ("default", "none"):
        return cfg.name[len(TEXT_PREFIX):]
    return local_weights(cfg.name, cfg.weights)


def _is_folder(source: str) -> bool:
    return os.path.isabs(source) or source.startswith(".") or os.path.exists(source)


def _local_folder(name: str, source: str, off: str | None) -> str:
    """The folder to load ``source`` from: itself, or its snapshot in the Hugging Face cache
    (downloaded into it unless ``off`` or an offline switch says why not). Found before
    transformers is asked: with a Hub id, even a cache-only load asks the Hub for its request
    headers, and waits on a Hub that cannot be reached."""
    if os.path.isdir(source):
        return source
    if _is_folder(source):
        raise WeightsError(_missing_model(name, source, "no such folder"))
    return obtain(hub_model(source), name,
                  lambda reason: WeightsError(_missing_model(name, source, "not in it", reason)), off)


def _needs(cfg: ExtractorConfig) -> list[Published]:
    source = _source(cfg)
    return [] if _is_folder(source) else [hub_model(source)]


def _weights_id(source: str, folder: str) -> str:
    """``hf:<id>@<commit>`` for a model from the cache; ``file:<folder>#<sha>`` for a folder."""
    if folder != source:
        # A cache snapshot's folder is named by its commit.
        return f"hf:{source}@{os.path.basename(folder)[:12]}"
    folder = os.path.normpath(source)
    weights = next((os.path.join(folder, f) for f in _WEIGHT_FILES if os.path.isfile(os.path.join(folder, f))),
                   None)
    if weights is not None:
        return file_id(weights, label=os.path.basename(folder))
    return f"file:{os.path.basename(folder)}"


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _missing_model(name: str, source: str, reason: str, not_downloaded: str | None = None) -> str:
    if _is_folder(source):
        return f"{name}: cannot load a Hugging Face model from folder {source} ({reason})"
    why = f", and {not_downloaded}" if not_downloaded else ""
    return (f"{name}: no local copy of the Hugging Face model {source!r} (looked in the cache {cache_folder()}; "
            f"{reason}){why}. On a machine with internet, {FETCH_HINT} (or `hf download {source}` this one): "
            f"copy the cache here (HF_HOME moves it), or name a model folder: text:/path/to/model.")


@register(TEXT_PREFIX, needs=_needs)
def build_text(cfg: ExtractorConfig, frames: FramesConfig, features: FeaturesConfig) -> HFTextExtractor:
    return HFTextExtractor(cfg, features)
