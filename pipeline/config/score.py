"""Scoring every clip–sentence pair with a retrieval model: the `score` section."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.ids import safe_id

MILNCE_PREFIX = "milnce:"


class ScoreConfig(BaseModel):
    """A score for every clip's pair (`scores/<model>`): the pair similarity, its rank among the
    sentences of the same video and, for WAL-att-adv, the discriminator's P(aligned)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        None, description="the score model: a trained model's folder under ROOT/train/ (None: "
        "train.model, trained by the same build), or milnce:<path to s3d_howto100m.pth> for the "
        "MIL-NCE checkpoint's two towers (its video embeddings are the s3d_howto100m features, "
        "which must be extracted with the same file; s3d_dict.npy must sit beside it)")
    batch_size: int = Field(4096, gt=0, description="clips per committed batch")
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @field_validator("model")
    @classmethod
    def _model(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if value.startswith(MILNCE_PREFIX):
            if not value[len(MILNCE_PREFIX):]:
                raise ValueError("milnce: needs the path of the checkpoint, e.g. milnce:/models/s3d_howto100m.pth")
            return value
        if value != safe_id(value) or value.startswith("."):
            raise ValueError(f"{value!r} is not a folder name under ROOT/train/ (letters, digits, _ and -), "
                             f"nor milnce:<path>")
        return value


def milnce_weights(model: str) -> str | None:
    """The checkpoint path of a ``milnce:<path>`` score model, None for a trained model."""
    return model[len(MILNCE_PREFIX):] if model.startswith(MILNCE_PREFIX) else None


def score_key(model: str) -> str:
    """The table key of a score model: ``wal`` -> ``scores/wal``;
    ``milnce:/m/s3d_howto100m.pth`` -> ``scores/milnce_s3d_howto100m``."""
    weights = milnce_weights(model)
    if weights is None:
        return safe_id(model)
    return safe_id(f"milnce_{os.path.splitext(os.path.basename(weights))[0]}")
