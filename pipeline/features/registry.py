"""The registry of extractors by config name, filled by each family's module as it is imported
(like torchvision's ``register_model``): a new family needs no edit anywhere else."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.features.base import TextExtractor, VisualExtractor

Extractor: TypeAlias = VisualExtractor | TextExtractor
# A builder loads the model and its weights, so a setup problem surfaces before any item runs.
Builder: TypeAlias = Callable[[ExtractorConfig, FramesConfig, FeaturesConfig], Extractor]

# Config name -> builder. "text:" builds any Hugging Face encoder named after the prefix.
EXTRACTORS: dict[str, Builder] = {}


def register(*names: str) -> Callable[[Builder], Builder]:
    """Register a builder under ``names``; a name taken twice is a programming error."""

    def add(builder: Builder) -> Builder:
        for name in names:
            if name in EXTRACTORS:
                raise ValueError(f"extractor {name!r} registered twice")
            EXTRACTORS[name] = builder
        return builder

    return add
