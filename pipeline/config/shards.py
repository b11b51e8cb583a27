"""Training-ready shards: the `shards` section."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ClipMediaConfig(BaseModel):
    """How clip media is cut into WebDataset samples."""

    model_config = ConfigDict(extra="forbid")

    precision: Literal["copy", "exact"] = Field(
        "exact", description="copy: stream copy, cut at keyframes; exact: re-encode, frame exact"
    )
    height: int | None = Field(224, gt=0, description="None: keep the source height")
    fps: float | None = Field(None, gt=0, description="None: keep the source rate")
    codec: str = Field("libx264", min_length=1)
    audio: bool = False
    processes: int | None = Field(
        None, ge=1, description="ffmpeg processes a shard batch cuts with at once; None: one per "
        "CPU core. On a machine whose cores several Dask worker threads share, cores / threads")


class WebDatasetConfig(BaseModel):
    """WebDataset tar shards, one sample per clip."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    max_bytes: int = Field(1_000_000_000, gt=0, description="a shard reaching this size is "
                           "closed early; the Parquet shard of the same number closes with it")
    include_media: bool = Field(False, description="add the clip mp4 to each sample")
    media: ClipMediaConfig = Field(default_factory=ClipMediaConfig)


class ParquetShardConfig(BaseModel):
    """Parquet shards: clips joined with their features."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    row_group_size: int = Field(1024, gt=0, description="rows per row group, for readers")


class ShardsConfig(BaseModel):
    """Training-ready shards, written per partition; shard N of a split of a partition holds
    the same clips in both formats."""

    model_config = ConfigDict(extra="forbid")

    samples_per_shard: int = Field(1000, gt=0, description="clips per shard, in both formats")
    webdataset: WebDatasetConfig = Field(default_factory=WebDatasetConfig)
    parquet: ParquetShardConfig = Field(default_factory=ParquetShardConfig)
    # With a `score` section the shards carry each clip's score (a `score` column, a "score"
    # field of the sample JSON) and wait for it: a video's clips are sharded once all of them
    # are scored (or failed to be).
    min_score: float | None = Field(
        None, description="with a score section: drop the clips whose score is below this (of "
        "the splits in score_splits); dropped clips are in no shard and are not errors")
    score_top_fraction: float | None = Field(
        None, gt=0, le=1, description="with a score section: keep the best ceil(f x n) of each "
        "video's n clips by score (of the splits in score_splits)")
    score_by: Literal["similarity", "p_aligned"] = Field(
        "similarity", description="the score the shards carry and filter by: the model's pair "
        "similarity, or the WAL-att-adv discriminator's P(aligned)")
    score_splits: list[Literal["train", "val", "test"]] = Field(
        ["train"], description="the splits min_score and score_top_fraction apply to; val and "
        "test stay whole by default, so a model is not evaluated on pairs a model's score chose")

    @property
    def score_filter(self) -> bool:
        """Whether a score filter is set (min_score or score_top_fraction)."""
        return self.min_score is not None or self.score_top_fraction is not None
