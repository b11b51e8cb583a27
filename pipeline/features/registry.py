"""The registry of extractors by config name, filled by each family's module as it is imported
(like torchvision's ``register_model``): a new family needs no edit anywhere else."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from pipeline.config import TEXT_PREFIX, ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.features.base import TextExtractor, VisualExtractor
from pipeline.models.cache import Published

Extractor: TypeAlias = VisualExtractor | TextExtractor
# A builder loads the model and its weights, so a setup problem surfaces before any item runs.
Builder: TypeAlias = Callable[[ExtractorConfig, FramesConfig, FeaturesConfig], Extractor]
# The published models a builder would download on first use for a config (`vlcorpus
# fetch-models` fetches them ahead).
Needs: TypeAlias = Callable[[ExtractorConfig], list[Published]]

# Config name -> builder. "text:" builds any Hugging Face encoder named after the prefix.
EXTRACTORS: dict[str, Builder] = {}
# Config name -> what its builder downloads; families that download nothing have no entry.
NEEDS: dict[str, Needs] = {}


def register(*names: str, needs: Needs | None = None) -> Callable[[Builder], Builder]:
    """Register a builder (and what it downloads) under ``names``; a name taken twice is a
    programming error."""

    def add(builder: Builder) -> Builder:
        for name in names:
            if name in EXTRACTORS:
                raise ValueError(f"extractor {name!r} registered twice")
            EXTRACTORS[name] = builder
            if needs is not None:
                NEEDS[name] = needs
        return builder

    return add


def registered_name(name: str) -> str | None:
    """The registry entry of a config name: itself, or "text:" for any other text model."""
    if name in EXTRACTORS:
        return name
    return TEXT_PREFIX if name.startswith(TEXT_PREFIX) and TEXT_PREFIX in EXTRACTORS else None
