"""The retrieval model trained on the corpus: the `train` section, with each paper's settings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TrainModel = Literal["wal", "nce", "milnce", "mms", "amm", "shn", "max_margin", "order", "asynce"]

# Each model's paper settings (papers/METHODS.md); a key the config leaves out takes the value
# here, else the field default. Values the papers do not give keep the field default.
# S-MiT (appendix B): 100 epochs per phase, the best epoch on the validation set kept, then a
# second phase; its two learning rates are lost in the extracted text (1e-3 / 1e-4 are ours).
_SMIT = {"embed_dim": 4096, "epochs": 100, "batch_size": 2048, "optimizer": "adam", "lr": 1e-3,
         "select": "val_recall", "finetune": True, "finetune_lr": 1e-4, "eval_protocol": "subsets"}
# Torabi et al. 5.1: early stopping on the loss of validation samples.
_TORABI = {"embed_dim": 950, "batch_size": 200, "optimizer": "adam", "lr": 1e-3, "margin": 0.05,
           "select": "val_loss"}
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    # WAL 5.3: lr 0.1 divided by 10 "in later epochs" (no epoch given); the discriminator is
    # fixed for 50 epochs, then everything trains 20 more. The ÷10 at epoch 60 is ours: it
    # leaves the discriminator 10 epochs at the full rate (at 50 it would only ever see lr/10).
    "wal": {
        "epochs": 70, "batch_size": 60, "optimizer": "sgd", "lr": 0.1, "momentum": 0.9,
        "weight_decay": 1e-3, "lr_milestones": [60], "lr_gamma": 0.1, "margin": 0.2,
    },
    "nce": _SMIT,
    "mms": {**_SMIT, "margin": 0.001},
    "amm": _SMIT,
    "shn": _SMIT,
    # MIL-NCE 4.1: Adam 1e-3, linear warm-up over 5k steps, decayed twice by 10 (when is not
    # given: at 60% and 80% of the epochs here).
    "milnce": {"embed_dim": 512, "batch_size": 512, "optimizer": "adam", "lr": 1e-3, "warmup_steps": 5000,
               "lr_milestones": [60, 80], "lr_gamma": 0.1},
    "max_margin": _TORABI,
    "order": _TORABI,
    "asynce": {
        "optimizer": "sgd", "lr": 1e-3, "momentum": 0.9, "margin": 0.05, "temperature": 0.07,
    },
}


class StreamConfig(BaseModel):
    """Training on corpora too large to hold in memory: pairs streamed from the tables."""

    model_config = ConfigDict(extra="forbid")

    above: int = Field(1_000_000, ge=0, description="a corpus whose clips table has more rows than "
                       "this trains streamed (smaller ones are read whole, as before)")
    buffer: int = Field(16_384, ge=2, description="pairs in the shuffle buffer batches are drawn from")
    chunk: int = Field(8_192, ge=1, description="clips read and joined with their features at once "
                       "(whole videos, so MIL-NCE candidates stay together)")
    held_out: int = Field(5_000, ge=2, description="val and test pairs kept per split (a seeded "
                          "sample): selection and evaluation score these in memory")


class TrainConfig(BaseModel):
    """A retrieval model trained on the corpus; unset keys take the model's paper values."""

    model_config = ConfigDict(extra="forbid")

    model: TrainModel
    visual: str | list[str] = Field(description="name of a visual extractor in features.extractors, or "
                                    "several: each max-pooled over time, then concatenated (S-MiT)")
    text: str = Field(description="name of a text extractor in features.extractors")
    embed_dim: int = Field(512, gt=0)
    epochs: int = Field(100, gt=0)
    batch_size: int = Field(256, gt=0)
    optimizer: Literal["sgd", "adam", "adamw"] = "adam"
    lr: float = Field(1e-3, gt=0)
    momentum: float = Field(0.9, ge=0, le=1, description="sgd only")
    weight_decay: float = Field(0.0, ge=0)
    lr_step: int | None = Field(None, gt=0, description="epochs between lr *= lr_gamma")
    lr_milestones: list[int] | None = Field(None, description="epochs at which lr *= lr_gamma "
                                            "(instead of lr_step)")
    lr_gamma: float = Field(0.1, gt=0, le=1)
    warmup_steps: int = Field(0, ge=0, description="linear lr warm-up from 0 over this many steps")
    select: Literal["last", "val_loss", "val_recall"] = Field(
        "last", description="checkpoint evaluated: the last epoch, or the best on the val split by "
        "loss or by mean R@1/5/10")
    finetune: bool = Field(False, description="a second phase of `epochs` epochs from the first "
                           "phase's selected checkpoint, fresh optimizer at finetune_lr (S-MiT)")
    finetune_lr: float | None = Field(None, gt=0, description="second-phase lr (None: lr)")
    eval_protocol: Literal["fixed", "subsets"] = Field(
        "fixed", description="fixed: the whole test split once (WAL, Torabi); subsets: 5 random "
        "sets of 1000 test pairs, averaged (S-MiT)")
    seed: int = 0
    temperature: float = Field(1.0, gt=0, description="softmax temperature of contrastive losses")
    margin: float = Field(0.2, ge=0, description="ranking margin; MMS initial margin; AsyNCE delta")
    options: dict[str, Any] = Field(default_factory=dict, description="model-specific settings")
    stream: StreamConfig = Field(default_factory=StreamConfig)
    retrain_growth: float | None = Field(
        None, ge=0, description="a build trains again when the pairs grew or shrank by at least this "
        "fraction since its checkpoint was trained (0: on any change of the tables it read); unset: "
        "growth alone never trains again, since a new checkpoint has every clip scored again while "
        "shards already written keep the scores they were written with. A changed train section, or "
        "no checkpoint, always trains; a kept checkpoint scores only the new clips")

    @model_validator(mode="before")
    @classmethod
    def _paper_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            defaults = dict(TRAIN_DEFAULTS.get(data["model"], {}))
            # A schedule the config gives replaces the paper's, whichever form each takes.
            if data.get("lr_step") is not None or data.get("lr_milestones") is not None:
                defaults.pop("lr_milestones", None)
            return {**defaults, **data}
        return data

    @model_validator(mode="after")
    def _one_schedule(self) -> "TrainConfig":
        if self.lr_step is not None and self.lr_milestones is not None:
            raise ValueError("give lr_step or lr_milestones, not both")
        return self

    @property
    def visual_names(self) -> list[str]:
        return [self.visual] if isinstance(self.visual, str) else list(self.visual)
