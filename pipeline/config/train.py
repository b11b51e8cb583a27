"""The retrieval model trained on the corpus: the `train` section, with each paper's settings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TrainModel = Literal["wal", "nce", "milnce", "mms", "amm", "shn", "max_margin", "order", "asynce"]

# Each model's paper settings (papers/METHODS.md); a key the config leaves out takes the value
# here, else the field default. Values the papers do not give keep the field default.
_SMIT = {"embed_dim": 4096, "epochs": 100, "batch_size": 2048, "optimizer": "adam"}
_TORABI = {"embed_dim": 950, "batch_size": 200, "optimizer": "adam", "lr": 1e-3, "margin": 0.05}
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "wal": {
        "epochs": 70, "batch_size": 60, "optimizer": "sgd", "lr": 0.1, "momentum": 0.9,
        "weight_decay": 1e-3, "lr_step": 50, "lr_gamma": 0.1, "margin": 0.2,
    },
    "nce": _SMIT,
    "mms": {**_SMIT, "margin": 0.001},
    "amm": _SMIT,
    "shn": _SMIT,
    "milnce": {"embed_dim": 512, "batch_size": 512, "optimizer": "adam", "lr": 1e-3},
    "max_margin": _TORABI,
    "order": _TORABI,
    "asynce": {
        "optimizer": "sgd", "lr": 1e-3, "momentum": 0.9, "margin": 0.05, "temperature": 0.07,
    },
}


class TrainConfig(BaseModel):
    """A retrieval model trained on the corpus; unset keys take the model's paper values."""

    model_config = ConfigDict(extra="forbid")

    model: TrainModel
    visual: str = Field(description="name of a visual extractor in features.extractors")
    text: str = Field(description="name of a text extractor in features.extractors")
    embed_dim: int = Field(512, gt=0)
    epochs: int = Field(100, gt=0)
    batch_size: int = Field(256, gt=0)
    optimizer: Literal["sgd", "adam", "adamw"] = "adam"
    lr: float = Field(1e-3, gt=0)
    momentum: float = Field(0.9, ge=0, le=1, description="sgd only")
    weight_decay: float = Field(0.0, ge=0)
    lr_step: int | None = Field(None, gt=0, description="epochs between lr *= lr_gamma")
    lr_gamma: float = Field(0.1, gt=0, le=1)
    seed: int = 0
    temperature: float = Field(1.0, gt=0, description="softmax temperature of contrastive losses")
    margin: float = Field(0.2, ge=0, description="ranking margin; MMS initial margin; AsyNCE delta")
    options: dict[str, Any] = Field(default_factory=dict, description="model-specific settings")

    @model_validator(mode="before")
    @classmethod
    def _paper_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            return {**TRAIN_DEFAULTS.get(data["model"], {}), **data}
        return data
