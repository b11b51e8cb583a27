"""``vlcorpus fetch-models``: the published models a config's stages need, fetched into the
libraries' caches ahead of a build, for clusters whose workers have no internet (fetch where
the hubs are reachable, then share or copy the caches: ``TORCH_HOME``, ``HF_HOME``).

A build downloads the same models on first use (pipeline/models/cache.py); this fetches them in
the same way, the same lock included, but regardless of ``features.download_weights`` (the
config's word on builds). The machine's offline switches still hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pipeline.config import Config
from pipeline.errors import SetupError
from pipeline.models.cache import Published, obtain
from pipeline.setup import require_package


@dataclass(frozen=True)
class Fetched:
    who: str  # the part of the config that needs it: an extractor's name, "transcribe.asr.model"
    model: str  # the model's label; "" where the config's entry could not be resolved
    status: Literal["cached", "downloaded", "failed"]
    detail: str  # its local copy, or why it cannot be had

    def line(self) -> str:
        what = f"{self.who}: {self.model}" if self.model else self.who
        words = {"cached": "cached already", "downloaded": "downloaded", "failed": "failed"}[self.status]
        return f"{what}: {words}: {self.detail}"


def needed(cfg: Config) -> Iterator[tuple[str, Published | SetupError]]:
    """(who, model) for each published model the config's stages would download on first use,
    in build order; an entry that cannot be resolved (a package missing, an unknown model) as
    its error."""
    asr = cfg.transcribe.asr
    if "asr" in cfg.transcribe.prefer and asr.backend == "faster-whisper":
        try:
            require_package("faster_whisper", "the faster-whisper ASR backend")
            from pipeline.transcribe.asr.whisper import published_model

            model = published_model(asr.model)
        except SetupError as exc:
            yield "transcribe.asr.model", exc
        else:
            if model is not None:
                yield "transcribe.asr.model", model
    for extractor in cfg.features.extractors:
        try:
            require_package("torch", f"the {extractor.name} extractor")
            from pipeline.features import published_models

            models = published_models(extractor)
        except SetupError as exc:
            yield extractor.name, exc
            continue
        for model in models:
            yield extractor.name, model


def fetch(who: str, model: Published) -> Fetched:
    """``model`` in its cache: found there, or downloaded now."""
    try:
        found = model.cached()
        if found is not None:
            return Fetched(who, model.label, "cached", found)
        return Fetched(who, model.label, "downloaded", obtain(model, who, SetupError))
    # Offline, the hub unreachable or without it, a failed download, a file that did not match
    # its pinned sha256.
    except SetupError as exc:
        return Fetched(who, model.label, "failed", str(exc))


def fetch_models(cfg: Config) -> Iterator[Fetched]:
    """Each model ``cfg`` needs, fetched in turn."""
    for who, model in needed(cfg):
        yield Fetched(who, "", "failed", str(model)) if isinstance(model, SetupError) else fetch(who, model)
