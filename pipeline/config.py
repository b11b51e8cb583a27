"""The YAML config of a corpus build: pydantic models, loading, hashing, dumping, JSON schema.

Every model forbids unknown keys, so a typo is an error that names the key and the keys allowed
there instead of a setting silently ignored. `python -m pipeline.config --write-schema`
regenerates `schemas/config.schema.json`.
"""

import argparse
import hashlib
import itertools
import json
import string
import sys
from datetime import date
from pathlib import Path, PurePosixPath
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from pipeline.ids import feature_key

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.json"

VISUAL_EXTRACTORS = ("resnet34", "resnet50", "resnet152", "tsm_r50", "s3d", "s3d_howto100m",
                     "s3d_howto100m:mixed_5c")
TEXT_PREFIX = "text:"

_LIST_SUFFIXES: dict[str, Literal["txt", "csv", "parquet"]] = {
    ".txt": "txt",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_SECTIONS_WITH_DEFAULTS = (
    "filters", "download", "transcribe", "align", "frames", "features", "shards", "execution",
)


class ConfigError(ValueError):
    """A config that cannot be used; the message names every problem with its key path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        noun = "problem" if len(problems) == 1 else "problems"
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} {noun}:\n{lines}")


# Problems a validator found: (key path relative to its model, message).
_Found = list[tuple[tuple[str | int, ...], str]]


class _Problems(ValueError):
    """Validator errors that point below the model raising them (paths relative to it)."""

    def __init__(self, items: _Found) -> None:
        super().__init__("; ".join(message for _, message in items))
        self.items = items


def _raise_if(items: _Found) -> None:
    if items:
        raise _Problems(items)


# ---------------------------------------------------------------- sources


def _template_vars(template: str) -> list[str]:
    """Names of the `{var}` placeholders of a query template, in order, without repeats."""
    names: dict[str, None] = {}
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        if not field.isidentifier():
            raise ValueError(f"placeholder {{{field}}} is not a var name")
        names.setdefault(field, None)
    return list(names)


class _SourceBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, description="label of the source in logs")


class SearchSource(_SourceBase):
    """yt-dlp searches `<prefix><per_query>:<query>`, each query expanded over the vars it names."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["search"]
    queries: list[str] = Field(min_length=1, description='templates like "apartment tour {year}"')
    vars: dict[str, Annotated[list[str | int], Field(min_length=1)]] = Field(default_factory=dict)
    per_query: int = Field(50, gt=0)
    prefix: str = Field("ytsearch", min_length=1)

    @model_validator(mode="after")
    def _known_vars(self) -> "SearchSource":
        problems: _Found = []
        for i, query in enumerate(self.queries):
            try:
                names = _template_vars(query)
            except ValueError as exc:
                problems.append((("queries", i), f"bad query template {query!r}: {exc}"))
                continue
            unknown = [n for n in names if n not in self.vars]
            if unknown:
                known = ", ".join(sorted(self.vars)) or "(none)"
                problems.append(
                    (("queries", i), f"query {query!r} names unknown var(s) {', '.join(unknown)}; "
                     f"known vars: {known}")
                )
        _raise_if(problems)
        return self

    def expanded_queries(self) -> list[str]:
        """Every query filled in over the product of the vars it names, first occurrence kept."""
        out: dict[str, None] = {}
        for query in self.queries:
            names = _template_vars(query)
            for values in itertools.product(*(self.vars[n] for n in names)):
                out.setdefault(query.format(**dict(zip(names, values))), None)
        return list(out)


class PlaylistSource(_SourceBase):
    """Playlists and channels, listed with yt-dlp."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["playlist"]
    urls: list[str] = Field(min_length=1)
    max_videos: int | None = Field(None, gt=0, description="per playlist or channel")


class ListSource(_SourceBase):
    """A file of video URLs or ids (txt: one a line; csv/parquet: columns), maybe with times."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["list"]
    path: str = Field(min_length=1, description="local path or fsspec URL, used as given")
    format: Literal["auto", "txt", "csv", "parquet"] = "auto"
    url_column: str = "url"
    id_column: str | None = None
    start_column: str | None = None
    end_column: str | None = None
    caption_column: str | None = None
    url_template: str | None = Field(
        None, description='built from each id, e.g. "https://www.youtube.com/watch?v={id}"'
    )

    @property
    def file_format(self) -> Literal["txt", "csv", "parquet"]:
        """The format, from `format` or else from the file extension."""
        if self.format != "auto":
            return self.format
        return _LIST_SUFFIXES[PurePosixPath(self.path).suffix.lower()]

    @model_validator(mode="after")
    def _consistent(self) -> "ListSource":
        if self.format == "auto" and PurePosixPath(self.path).suffix.lower() not in _LIST_SUFFIXES:
            _raise_if([(("path",), f"cannot tell the format of {self.path!r} from its extension "
                        f"({', '.join(_LIST_SUFFIXES)}); set format to txt, csv or parquet")])
        problems: _Found = []
        if self.url_template is not None:
            try:
                names = _template_vars(self.url_template)
            except ValueError as exc:
                names = [str(exc)]
            if names != ["id"]:
                problems.append((("url_template",), "must have exactly one placeholder, {id}"))
        if (self.start_column is None) != (self.end_column is None):
            missing = "end_column" if self.end_column is None else "start_column"
            problems.append(((missing,), "start_column and end_column are set together"))
        if self.file_format == "txt":
            for key in ("id_column", "start_column", "end_column", "caption_column"):
                if getattr(self, key) is not None:
                    problems.append(((key,), "a txt list has one value a line and no columns"))
        elif self.url_template is not None and self.id_column is None:
            problems.append((("id_column",), "url_template needs id_column in a csv/parquet list"))
        _raise_if(problems)
        return self


class UrlsSource(_SourceBase):
    """Video URLs given inline."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["urls"]
    urls: list[str] = Field(min_length=1)


class FolderSource(_SourceBase):
    """Local video files under a folder."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["folder"]
    path: str = Field(min_length=1)
    extensions: list[str] = Field(
        default_factory=lambda: [".mp4", ".mkv", ".webm", ".mov", ".avi", ".m4v"], min_length=1
    )
    recursive: bool = True

    @field_validator("extensions")
    @classmethod
    def _dotted_lower(cls, value: list[str]) -> list[str]:
        # "mp4", ".MP4" and ".mp4" all mean the same suffix match.
        out = ["." + ext.strip().lstrip(".").lower() for ext in value]
        if "." in out:
            raise ValueError("an extension is empty")
        return out


Source = Annotated[
    SearchSource | PlaylistSource | ListSource | UrlsSource | FolderSource,
    Field(discriminator="type"),
]
SOURCE_TYPES: tuple[str, ...] = tuple(
    get_args(member.model_fields["type"].annotation)[0] for member in get_args(get_args(Source)[0])
)


def _yyyymmdd(value: Any) -> Any:
    # yt-dlp writes dates as YYYYMMDD; YAML reads an unquoted 20180101 as an int, which pydantic
    # would otherwise take as a Unix timestamp.
    text = str(value)
    if isinstance(value, (int, str)) and len(text) == 8 and text.isdigit():
        return date(int(text[:4]), int(text[4:6]), int(text[6:]))
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(f"expected a date as YYYY-MM-DD or YYYYMMDD (got {value})")
    return value


class FiltersConfig(BaseModel):
    """Which discovered videos to keep, judged on their metadata; bounds are inclusive."""

    model_config = ConfigDict(extra="forbid")

    min_duration_s: float | None = Field(None, ge=0)
    max_duration_s: float | None = Field(None, gt=0)
    subtitle_langs: list[str] | None = Field(
        None, description="keep only videos with subtitles in one of these languages"
    )
    upload_date_after: date | None = None
    upload_date_before: date | None = None
    require_subtitles: Literal["none", "manual", "any"] = "none"

    @field_validator("upload_date_after", "upload_date_before", mode="before")
    @classmethod
    def _dates(cls, value: Any) -> Any:
        return _yyyymmdd(value)

    @model_validator(mode="after")
    def _ordered(self) -> "FiltersConfig":
        problems: _Found = []
        lo, hi = self.min_duration_s, self.max_duration_s
        if lo is not None and hi is not None and lo > hi:
            problems.append((("min_duration_s",), f"greater than max_duration_s ({lo} > {hi})"))
        after, before = self.upload_date_after, self.upload_date_before
        if after is not None and before is not None and after > before:
            problems.append(
                (("upload_date_after",), f"later than upload_date_before ({after} > {before})")
            )
        _raise_if(problems)
        return self


# ---------------------------------------------------------------- download


class DownloadConfig(BaseModel):
    """yt-dlp download settings."""

    model_config = ConfigDict(extra="forbid")

    # `<=?` also accepts formats of unknown height (plain <video> pages say none).
    format: str = Field("bv*[height<=?480]+ba/b[height<=?480]", min_length=1)
    subtitle_langs: list[str] = Field(default_factory=lambda: ["en"])
    manual_subtitles: bool = True
    auto_subtitles: bool = Field(True, description="fallback when no manual subtitles exist")
    concurrency: int = Field(4, ge=1, description="videos in flight at once, across the cluster")
    concurrency_limit: str = Field(
        "vlcorpus-download", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="the Prefect global concurrency limit downloads take slots of (sized to "
                    "`concurrency` by each build): builds sharing a name share the slots")
    rate_limit: str | None = Field(
        None, pattern=r"^\d+(\.\d+)?[KMGkmg]?$", description='bytes per second, e.g. "2M"'
    )
    sleep_interval_s: float = Field(0, ge=0)
    max_sleep_interval_s: float | None = Field(None, ge=0)
    proxy: SecretStr | None = None
    cookies_file: str | None = None
    user_agent: str | None = None
    section_padding_s: float = Field(
        1.0, ge=0, description="extra seconds around a clip when only a section is downloaded"
    )
    partial: bool = Field(False, description="download only the listed sections, not whole videos")
    max_filesize_mb: float | None = Field(
        500, gt=0, description="a video whose files together grow past this is stopped (permanent)")
    timeout_s: float = Field(
        600, gt=0, description="a video still transferring after this many seconds is stopped "
                               "(permanent; --retry-failed retries it); also the socket timeout, up to 60 s")
    retries: int = Field(3, ge=0)
    allowed_schemes: list[str] = Field(default_factory=lambda: ["http", "https"], min_length=1)

    @field_validator("allowed_schemes")
    @classmethod
    def _lower(cls, value: list[str]) -> list[str]:
        return [scheme.lower() for scheme in value]

    @model_validator(mode="after")
    def _sleep_range(self) -> "DownloadConfig":
        top = self.max_sleep_interval_s
        if top is not None and top < self.sleep_interval_s:
            _raise_if([(("max_sleep_interval_s",),
                        f"less than sleep_interval_s ({top} < {self.sleep_interval_s})")])
        return self


# ---------------------------------------------------------------- transcribe


class GoogleAsrConfig(BaseModel):
    """Google Cloud Speech-to-Text."""

    model_config = ConfigDict(extra="forbid")

    language_code: str = "en-US"
    model: str | None = None
    automatic_punctuation: bool = True
    endpoint: str | None = Field(None, description="API endpoint, e.g. a local test server")
    chunk_s: float = Field(55, gt=0)
    long_running: bool = False

    @model_validator(mode="after")
    def _sync_limit(self) -> "GoogleAsrConfig":
        # Synchronous recognize() rejects audio longer than one minute.
        if not self.long_running and self.chunk_s > 60:
            _raise_if([(("chunk_s",), f"at most 60 unless long_running (got {self.chunk_s})")])
        return self


class AsrConfig(BaseModel):
    """Speech recognition for videos without usable subtitles."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["faster-whisper", "google"] = "faster-whisper"
    model: str = Field("small", min_length=1, description="model name or local path")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    compute_type: str | None = Field(None, description="None: int8 on CPU, float16 on GPU")
    vad: bool = True
    language: str | None = Field("en", description="None: detect")
    beam_size: int = Field(5, gt=0)
    google: GoogleAsrConfig = Field(default_factory=GoogleAsrConfig)


class SentenceConfig(BaseModel):
    """How timed words are split into sentences."""

    model_config = ConfigDict(extra="forbid")

    max_words: int = Field(30, gt=0)
    max_s: float = Field(8.0, gt=0)
    pause_s: float = Field(0.7, ge=0, description="a silence this long ends a sentence")


class QualityConfig(BaseModel):
    """Checks on transcribed text (S-MiT kept captions of at least 5 words and 3 s of speech)."""

    model_config = ConfigDict(extra="forbid")

    min_words: int = Field(0, ge=0, description="drop sentences with fewer words")
    min_speech_s: float = Field(0, ge=0, description="drop videos with less speech than this")
    unique_text: bool = Field(False, description="drop a sentence already said in the video")


class TranscribeConfig(BaseModel):
    """Subtitles or speech into timed sentences."""

    model_config = ConfigDict(extra="forbid")

    prefer: list[Literal["manual", "auto", "asr"]] = Field(
        default_factory=lambda: ["manual", "auto", "asr"], min_length=1,
        description="text sources in order of preference; one left out is never used",
    )
    asr: AsrConfig = Field(default_factory=AsrConfig)
    sentences: SentenceConfig = Field(default_factory=SentenceConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    drop_sound_tags: bool = Field(True, description="drop cues like [Music] and (applause)")

    @field_validator("prefer")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"lists a text source twice: {value}")
        return value


# ---------------------------------------------------------------- align


class AlignConfig(BaseModel):
    """Clip–sentence pairs from timed sentences."""

    model_config = ConfigDict(extra="forbid")

    policy: Literal["subtitle_span", "fixed", "whole"] = "subtitle_span"
    min_s: float = Field(2.0, gt=0)
    max_s: float = Field(5.0, gt=0)
    short: Literal["merge", "drop"] = Field("merge", description="sentence spans under min_s")
    long: Literal["trim", "split", "drop"] = Field("split", description="spans over max_s")
    length_s: float = Field(3.2, gt=0, description="clip length of the fixed policy")
    candidates: int = Field(
        5, ge=0, description="nearest sentences in time kept as positive candidates (MIL-NCE K)"
    )
    splits: dict[Literal["train", "val", "test"], Annotated[float, Field(ge=0)]] = Field(
        default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1},
        description="fractions of videos, assigned by a hash of video_id",
    )
    test_clip_ids: str | None = Field(None, description="file of clip ids held out as test")

    @model_validator(mode="after")
    def _consistent(self) -> "AlignConfig":
        problems: _Found = []
        if self.min_s >= self.max_s:
            problems.append((("min_s",), f"must be less than max_s ({self.min_s} >= {self.max_s})"))
        total = sum(self.splits.values())
        if abs(total - 1.0) > 1e-6:
            problems.append((("splits",), f"fractions must sum to 1 (got {total:g})"))
        _raise_if(problems)
        return self


# ---------------------------------------------------------------- frames and features


class FramesConfig(BaseModel):
    """Frame decoding defaults shared by the visual extractors."""

    model_config = ConfigDict(extra="forbid")

    short_side: int = Field(256, gt=0)
    crop: int = Field(224, gt=0, description="center crop, square")
    decode_threads: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _crop_fits(self) -> "FramesConfig":
        if self.crop > self.short_side:
            _raise_if([(("crop",), f"larger than short_side ({self.crop} > {self.short_side})")])
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
            _raise_if([((k,), "only for visual extractors") for k in keys
                       if getattr(self, k) is not None])
        elif self.keep_tokens:
            _raise_if([(("keep_tokens",), "only for text extractors")])
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
    decode_workers: int = Field(2, ge=1, description="threads decoding videos ahead of the model")
    queue_size: int = Field(8, ge=1, description="decoded clips waiting for the model")
    clips_per_commit: int = Field(256, ge=1, description="clips per committed batch")

    @model_validator(mode="after")
    def _unique_names(self) -> "FeaturesConfig":
        # Names become table folders and shard members, which WebDataset reads lowercased.
        seen: dict[str, str] = {}
        problems: _Found = []
        for i, extractor in enumerate(self.extractors):
            key = feature_key(extractor.name).lower()
            if key in seen:
                same = "" if seen[key] == extractor.name else f" (as stored, the same as {seen[key]!r})"
                problems.append((("extractors", i, "name"), f"duplicate name {extractor.name!r}{same}"))
            seen.setdefault(key, extractor.name)
        _raise_if(problems)
        return self


# ---------------------------------------------------------------- shards


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


class WebDatasetConfig(BaseModel):
    """WebDataset tar shards, one sample per clip."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    samples_per_shard: int = Field(1000, gt=0)
    max_bytes: int = Field(1_000_000_000, gt=0)
    include_media: bool = Field(False, description="add the clip mp4 to each sample")
    media: ClipMediaConfig = Field(default_factory=ClipMediaConfig)


class ParquetShardConfig(BaseModel):
    """Parquet shards: clips joined with their features."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    row_group_size: int = Field(1024, gt=0, description="rows per row group, for readers")
    rows_per_file: int = Field(100_000, gt=0, description="rows per part file")


class ShardsConfig(BaseModel):
    """Training-ready shards."""

    model_config = ConfigDict(extra="forbid")

    webdataset: WebDatasetConfig = Field(default_factory=WebDatasetConfig)
    parquet: ParquetShardConfig = Field(default_factory=ParquetShardConfig)


# ---------------------------------------------------------------- train

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


# ---------------------------------------------------------------- execution


class ExecutionConfig(BaseModel):
    """How stages run: batching, retries, the Dask cluster, logging."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(16, ge=1, description="items per committed batch")
    retries: int = Field(3, ge=0, description="extra attempts for transient errors")
    retry_backoff_s: float = Field(1.0, ge=0)
    retry_backoff_max_s: float = Field(60.0, ge=0)
    dask_address: str | None = Field(None, description="None: start a local cluster")
    n_workers: int | None = Field(None, ge=1)
    threads_per_worker: int = Field(1, ge=1)
    gpu_resource: bool = Field(False, description="featurize tasks ask Dask for the resource GPU=1")
    log_format: Literal["rich", "json"] = "rich"

    @model_validator(mode="after")
    def _backoff_range(self) -> "ExecutionConfig":
        if self.retry_backoff_max_s < self.retry_backoff_s:
            _raise_if([(("retry_backoff_max_s",), f"less than retry_backoff_s "
                        f"({self.retry_backoff_max_s} < {self.retry_backoff_s})")])
        return self


# ---------------------------------------------------------------- the whole config


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
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)

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
        problems: _Found = []
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
        _raise_if(problems)
        return self

    def _train_inputs(self, train: TrainConfig) -> _Found:
        extractors = {e.name: e for e in self.features.extractors}
        listed = ", ".join(extractors) or "(none)"
        problems: _Found = []
        for key in ("visual", "text"):
            name = getattr(train, key)
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


# ---------------------------------------------------------------- error messages


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, UnionType)


def _discriminator(tp: Any) -> str | None:
    if get_origin(tp) is Annotated:
        for meta in get_args(tp)[1:]:
            if isinstance(meta, FieldInfo) and isinstance(meta.discriminator, str):
                return meta.discriminator
    return None


def _strip(tp: Any) -> Any:
    """Drop Annotated (but not a discriminated union's) and Optional wrappers."""
    while True:
        if get_origin(tp) is Annotated and _discriminator(tp) is None:
            tp = get_args(tp)[0]
        elif _is_union(tp) and type(None) in get_args(tp):
            rest = [a for a in get_args(tp) if a is not type(None)]
            if len(rest) != 1:
                return Union[tuple(rest)]
            tp = rest[0]
        else:
            return tp


_NOT_A_UNION = object()


def _union_member(tp: Any, item: str | int) -> Any:
    """The union member a loc item names, None if unknown, _NOT_A_UNION if tp is no union."""
    tag_key = _discriminator(tp)
    if tag_key is not None:
        for member in get_args(get_args(tp)[0]):
            if item in get_args(member.model_fields[tag_key].annotation):
                return member
        return None
    if _is_union(tp):
        return next((m for m in get_args(tp) if getattr(m, "__name__", None) == item), None)
    return _NOT_A_UNION


def _child(tp: Any, item: str | int) -> Any:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(str(item))
        return field.annotation if field is not None else None
    origin = get_origin(tp)
    if origin is list:
        return get_args(tp)[0]
    if origin is dict:
        return get_args(tp)[1]
    return None


def _walk(loc: tuple[str | int, ...]) -> tuple[list[str], Any, Any, bool]:
    """Display path of a pydantic loc (union tags dropped), the type found there, the type
    holding its last key, and whether a plain union branch was passed."""
    path: list[str] = []
    tp: Any = Config
    parent: Any = None
    via_union = False
    for item in loc:
        if item == "[key]":  # marks an error in a dict key rather than its value
            continue
        tp = _strip(tp)
        member = _union_member(tp, item)
        if member is not _NOT_A_UNION:
            via_union = via_union or _discriminator(tp) is None
            tp = member
            continue
        parent = tp
        path.append(str(item))
        tp = _child(tp, item)
    return path, _strip(tp), _strip(parent), via_union


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _problem_lines(exc: ValidationError) -> list[str]:
    """One line per problem: `key.path: message (got value)`."""
    allowed_types = ", ".join(sorted(SOURCE_TYPES))
    # Errors of the branches of a plain union (e.g. `str | int`) share one line.
    problems: dict[Any, tuple[str, list[str], str]] = {}
    for n, err in enumerate(exc.errors()):
        loc, kind, msg = tuple(err["loc"]), err["type"], err["msg"]
        error = err.get("ctx", {}).get("error")
        if isinstance(error, _Problems):
            for j, (sub, message) in enumerate(error.items):
                problems[(n, j)] = (".".join(_walk(loc + sub)[0]) or "(top level)", [message], "")
            continue
        path, tp, parent, via_union = _walk(loc)
        show_input = kind not in ("missing", "extra_forbidden", "value_error")
        if kind == "extra_forbidden":
            allowed = ", ".join(sorted(parent.model_fields)) if isinstance(parent, type) else "?"
            msg = f"unknown key; allowed keys: {allowed}"
        elif kind == "union_tag_invalid":
            path.append("type")
            msg = f"unknown source type {err['ctx']['tag']!r}; allowed types: {allowed_types}"
            show_input = False
        elif kind == "union_tag_not_found":
            path.append("type")
            msg = f"missing key; allowed types: {allowed_types}"
            show_input = False
        elif kind in ("model_type", "model_attributes_type"):
            msg = "Input should be a mapping"
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        if tp is SecretStr or isinstance(err.get("input"), dict):
            show_input = False
        where = ".".join(path) or "(top level)"
        got = f" (got {_short_repr(err['input'])})" if show_input else ""
        key = ("union", where) if via_union else n
        if key in problems:
            problems[key][1].append(msg)
        else:
            problems[key] = (where, [msg], got)
    return [f"{where}: {'; or '.join(msgs)}{got}" for where, msgs, got in problems.values()]


# ---------------------------------------------------------------- public functions


def parse_config(data: dict, source: str = "<config>") -> Config:
    """Validate a config mapping; every problem is reported at once as a ConfigError."""
    if not isinstance(data, dict):
        got = type(data).__name__
        raise ConfigError(source, [f"(top level): expected a mapping of keys (got {got})"])
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, _problem_lines(exc)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice (PyYAML would keep the last silently)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file; unreadable files, bad YAML and bad values all raise
    ConfigError."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"(file): cannot read: {exc}"]) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(file)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"{where}: invalid YAML: {problem}"]) from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise ConfigError(source, [f"(top level): expected a mapping of keys (got {got})"])
    return parse_config(data, source)


def _resolved(cfg: Config) -> dict[str, Any]:
    # JSON mode renders dates as ISO strings and secrets as "**********".
    return cfg.model_dump(mode="json")


def config_hash(cfg: Config) -> str:
    """First 16 hex chars of the sha256 of the canonical JSON of the resolved config (secrets are
    masked, so the hash is safe to log and does not change with a proxy)."""
    canonical = json.dumps(_resolved(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def dump_config(cfg: Config) -> str:
    """YAML of the resolved config, every default filled in, secrets masked."""
    return yaml.safe_dump(_resolved(cfg), sort_keys=False, allow_unicode=True)


def config_json_schema() -> dict[str, Any]:
    """JSON schema of the YAML config, for editors and `schemas/config.schema.json`."""
    schema = Config.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.config", description=__doc__)
    parser.add_argument("--write-schema", action="store_true", help=f"write {SCHEMA_PATH}")
    args = parser.parse_args(argv)
    text = json.dumps(config_json_schema(), sort_keys=True, indent=2) + "\n"
    if args.write_schema:
        SCHEMA_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {SCHEMA_PATH}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
