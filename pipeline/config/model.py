"""The whole config: every section, and the checks that span sections."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.config.execution import ExecutionConfig
from pipeline.graph import SCORES
from pipeline.config.features import TEXT_PREFIX, FeaturesConfig, FramesConfig
from pipeline.config.health import HealthConfig
from pipeline.config.problems import Found, raise_if
from pipeline.config.score import ScoreConfig, milnce_weights, score_key
from pipeline.config.sections import AlignConfig, DownloadConfig, FiltersConfig, TranscribeConfig
from pipeline.config.shards import ShardsConfig
from pipeline.config.sources import Source
from pipeline.config.storage import StorageConfig
from pipeline.config.train import TrainConfig

# Where corpora live when neither a config nor a caller names a root.
ROOT_ENV = "VLCORPUS_ROOT"

_SECTIONS_WITH_DEFAULTS = (
    "filters", "download", "transcribe", "align", "frames", "features", "shards", "storage",
    "execution", "health",
)


class Config(BaseModel):
    """A corpus build: where videos come from and what every stage does with them."""

    model_config = ConfigDict(extra="forbid", title="vlcorpus config")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="safe as a file name")
    root: str | None = Field(None, description="corpus root: a local path or any fsspec URL")
    sources: list[Source] = Field(min_length=1)
    filters: FiltersConfig = Field(default_factory=FiltersConfig)
    download: DownloadConfig = Field(default_factory=DownloadConfig)
    transcribe: TranscribeConfig = Field(default_factory=TranscribeConfig)
    align: AlignConfig = Field(default_factory=AlignConfig)
    frames: FramesConfig = Field(default_factory=FramesConfig)
    features: FeaturesConfig = Field(default_factory=FeaturesConfig)
    shards: ShardsConfig = Field(default_factory=ShardsConfig)
    train: TrainConfig | None = Field(None, description="None: no training")
    score: ScoreConfig | None = Field(None, description="None: no score stage (and no scores "
                                      "in the shards)")
    storage: StorageConfig = Field(default_factory=StorageConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)

    def corpus_root(self, override: str | None = None) -> str:
        """Where the corpus lives: ``override`` (a --root option or a deployment's parameter),
        the config's ``root``, or ``$VLCORPUS_ROOT/<name>`` (one folder or bucket prefix for
        every corpus a machine builds)."""
        chosen = override or self.root
        if not chosen and os.environ.get(ROOT_ENV):
            chosen = f"{os.environ[ROOT_ENV].rstrip('/')}/{self.name}"
        if not chosen:
            raise ValueError(f"config {self.name!r} has no corpus root: pass --root, set `root:` in "
                             f"it, or set {ROOT_ENV} (the corpus is then ${ROOT_ENV}/{self.name})")
        return chosen

    @model_validator(mode="before")
    @classmethod
    def _empty_sections(cls, data: Any) -> Any:
        # `download:` with every key commented out is YAML null; it means "all defaults".
        if isinstance(data, dict):
            return {
                k: {} if v is None and k in _SECTIONS_WITH_DEFAULTS else v for k, v in data.items()
            }
        return data

    @model_validator(mode="after")
    def _cross_section(self) -> "Config":
        problems: Found = []
        names: set[str] = set()
        for i, source in enumerate(self.sources):
            if source.name is None:
                continue
            if source.name in names:
                # The union tag in the path, as in pydantic's own error locations.
                where = ("sources", i, source.type, "name")
                problems.append((where, f"duplicate source name {source.name!r}"))
            names.add(source.name)
        for i, extractor in enumerate(self.features.extractors):
            side = extractor.short_side or self.frames.short_side
            crop = extractor.crop or self.frames.crop
            if not extractor.is_text and crop > side:
                problems.append((("features", "extractors", i, "crop"),
                                 f"larger than the short side ({crop} > {side})"))
        if self.train is not None:
            problems += self._train_inputs(self.train)
        problems += self._score_inputs()
        raise_if(problems)
        return self

    @property
    def score_model(self) -> str | None:
        """The model the score stage scores with: score.model, else train.model; None
        without a score section."""
        if self.score is None:
            return None
        return self.score.model or (self.train.model if self.train is not None else None)

    @property
    def score_table(self) -> str | None:
        """``scores/<key>``, the table of the score model; None without a score section."""
        model = self.score_model
        return None if model is None else f"{SCORES}/{score_key(model)}"

    def _score_inputs(self) -> Found:
        problems: Found = []
        if self.score is None:
            for key in ("min_score", "score_top_fraction"):
                if getattr(self.shards, key) is not None:
                    problems.append((("shards", key), "needs a score section (the model that "
                                     "scores the clips)"))
            return problems
        model = self.score_model
        if model is None:
            problems.append((("score", "model"), "no train section to take the model from: name "
                             "a trained model's folder under ROOT/train/ or milnce:<checkpoint>"))
            return problems
        weights = milnce_weights(model)
        if weights is not None:
            video = [e for e in self.features.extractors if e.name == "s3d_howto100m"]
            if not video:
                problems.append((("score", "model"), "milnce: scores the s3d_howto100m video "
                                 "embeddings: add the s3d_howto100m extractor to features.extractors "
                                 f"with weights: {weights}"))
            elif video[0].weights != weights:
                problems.append((("score", "model"), f"the s3d_howto100m extractor's weights are "
                                 f"{video[0].weights!r}, not this checkpoint: the two towers must "
                                 f"come from one file"))
            if self.shards.score_by == "p_aligned":
                problems.append((("shards", "score_by"), "p_aligned is the WAL discriminator's; "
                                 "the MIL-NCE checkpoint has none"))
        return problems

    def _train_inputs(self, train: TrainConfig) -> Found:
        extractors = {e.name: e for e in self.features.extractors}
        listed = ", ".join(extractors) or "(none)"
        problems: Found = []
        named = [("visual", name) for name in train.visual_names] + [("text", train.text)]
        for key, name in named:
            extractor = extractors.get(name)
            if extractor is None:
                problems.append(
                    (("train", key), f"{name!r} is not in features.extractors; listed: {listed}")
                )
            elif key == "visual" and extractor.is_text:
                problems.append((("train", key), f"{name!r} is a text extractor"))
            elif key == "text" and not extractor.is_text:
                problems.append(
                    (("train", key), f"{name!r} has no text output; use a {TEXT_PREFIX}<model> "
                     f"extractor (text:s3d_howto100m for the MIL-NCE text tower)")
                )
        return problems
