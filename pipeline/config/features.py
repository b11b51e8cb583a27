"""Frame decoding and the feature extractors: the `frames` and `features` sections."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.config.problems import Found, raise_if
from pipeline.ids import feature_key

VISUAL_EXTRACTORS = ("resnet34", "resnet50", "resnet152", "tsm_r50", "s3d", "s3d_howto100m",
                     "s3d_howto100m:mixed_5c")
TEXT_PREFIX = "text:"


class FramesConfig(BaseModel):
    """Frame decoding defaults shared by the visual extractors."""

    model_config = ConfigDict(extra="forbid")

    short_side: int = Field(256, gt=0)
    crop: int = Field(224, gt=0, description="center crop, square")
    decode_threads: int | None = Field(
        None, ge=1, description="decoder threads in each decode process (CPU decoding); None: "
        "the process's share of the cores, one each when the processes fill the machine")
    skip_nonref: bool = Field(
        False, description="decode only the frames other frames refer to (FFmpeg skip_frame "
        "nonref; CPU decoding only): 1.3-1.6x faster on video with B-frames; a sample time then "
        "takes the nearest decoded frame, at most half the longest run of skipped frames away "
        "(one frame with x264's defaults)"
    )

    @model_validator(mode="after")
    def _crop_fits(self) -> "FramesConfig":
        if self.crop > self.short_side:
            raise_if([(("crop",), f"larger than short_side ({self.crop} > {self.short_side})")])
        return self


class ExtractorConfig(BaseModel):
    """One feature extractor; `features/<name>/` holds its output."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description=f"one of {', '.join(VISUAL_EXTRACTORS)} or text:<model>")
    fps: float | None = Field(None, gt=0, description="sampling rate; None: the model's default")
    frames: int | None = Field(
        None, gt=0, description="N frames per clip: at fps if set, else spread uniformly"
    )
    weights: str = Field("default", min_length=1, description='"default", "none", a local path, '
                         'or package:<module> (the folder <module>.get_model_path() returns)')
    batch_size: int = Field(32, gt=0)
    short_side: int | None = Field(None, gt=0, description="None: frames.short_side")
    crop: int | None = Field(None, gt=0, description="None: frames.crop")
    keep_tokens: bool = Field(False, description="text only: keep per-token vectors too")

    @property
    def is_text(self) -> bool:
        return self.name.startswith(TEXT_PREFIX)

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value in VISUAL_EXTRACTORS or (value.startswith(TEXT_PREFIX) and value != TEXT_PREFIX):
            return value
        raise ValueError(
            f"unknown extractor {value!r}; allowed: {', '.join(VISUAL_EXTRACTORS)}, "
            f"{TEXT_PREFIX}<hf model name or path>"
        )

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> "ExtractorConfig":
        if self.is_text:
            keys = ("fps", "frames", "short_side", "crop")
            raise_if([((k,), "only for visual extractors") for k in keys
                       if getattr(self, k) is not None])
        elif self.keep_tokens:
            raise_if([(("keep_tokens",), "only for text extractors")])
        return self


class FeaturesConfig(BaseModel):
    """Feature extraction: which extractors, on what hardware."""

    model_config = ConfigDict(extra="forbid")

    extractors: list[ExtractorConfig] = Field(default_factory=list)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 on GPUs that have it, else fp16 on GPU, fp32 on CPU"
    )
    compile: bool = False
    decode: Literal["auto", "cpu", "nvdec"] = Field(
        "auto", description="where frames are decoded: nvdec on the GPU's video decoder "
        "(PyNvVideoCodec, the gpu extra; a setup error where it is missing), cpu in worker "
        "processes, auto cpu: faster than NVDEC's path on every machine measured (the log says why)"
    )
    decode_workers: int | None = Field(
        None, ge=1, description="processes decoding videos ahead of the model (threads with nvdec); "
        "None: one per CPU this process may use (set it to the cores per GPU when several GPU "
        "workers share a machine)"
    )
    queue_size: int = Field(8, ge=1, description="decoded clips waiting for the model")
    clips_per_commit: int = Field(256, ge=1, description="clips per committed batch")
    download_weights: bool = Field(True, description="published weights missing from the libraries' "
                                   "caches are downloaded on first use; false: the caches only")

    @model_validator(mode="after")
    def _unique_names(self) -> "FeaturesConfig":
        # Names become table folders and shard members, which WebDataset reads lowercased.
        seen: dict[str, str] = {}
        problems: Found = []
        for i, extractor in enumerate(self.extractors):
            key = feature_key(extractor.name).lower()
            if key in seen:
                same = "" if seen[key] == extractor.name else f" (as stored, the same as {seen[key]!r})"
                problems.append((("extractors", i, "name"), f"duplicate name {extractor.name!r}{same}"))
            seen.setdefault(key, extractor.name)
        raise_if(problems)
        return self
