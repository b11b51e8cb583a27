"""The sections of the stages before features: filters, download, transcribe, align."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from pipeline.config.problems import Found, raise_if
from pipeline.download.ytdlp_args import browser_cookies, extractor_args


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
        problems: Found = []
        lo, hi = self.min_duration_s, self.max_duration_s
        if lo is not None and hi is not None and lo > hi:
            problems.append((("min_duration_s",), f"greater than max_duration_s ({lo} > {hi})"))
        after, before = self.upload_date_after, self.upload_date_before
        if after is not None and before is not None and after > before:
            problems.append(
                (("upload_date_after",), f"later than upload_date_before ({after} > {before})")
            )
        raise_if(problems)
        return self


# ---------------------------------------------------------------- download


class DownloadConfig(BaseModel):
    """yt-dlp download settings, politeness, identity and egress."""

    model_config = ConfigDict(extra="forbid")

    # `<=?` also accepts formats of unknown height (plain <video> pages say none).
    format: str = Field("bv*[height<=?480]+ba/b[height<=?480]", min_length=1)
    subtitle_langs: list[str] = Field(default_factory=lambda: ["en"])
    manual_subtitles: bool = True
    auto_subtitles: bool = Field(True, description="fallback when no manual subtitles exist")
    concurrency: int = Field(4, ge=1, description="videos in flight at once, across the cluster")
    concurrency_limit: str = Field(
        "vlcorpus-download", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="the global concurrency limit downloads take slots of (sized to "
                    "`concurrency` by each build): builds sharing a name and a Prefect server "
                    "share the slots, the rate limit and the block breaker (`<name>-rate`, "
                    "`<name>-host-*`, variables `<name>-breaker-*`); a build on its own temporary "
                    "server keeps them on its Dask cluster")
    # Politeness
    rate_limit: float | None = Field(
        30, gt=0, description="yt-dlp requests for a video (one per video, one more per "
                              "re-extraction) per minute across every worker and build sharing "
                              "concurrency_limit; null: no limit")
    per_host: int | None = Field(
        2, ge=1, description="videos in flight per site host, across every worker and build; "
                             "null: only `concurrency`")
    preset: Literal["sleep"] | None = Field(
        None, description="yt-dlp's preset alias `-t sleep`: sleep_requests_s 0.75, "
                          "sleep_interval_s 10, max_sleep_interval_s 20, sleep_subtitles_s 5; "
                          "the sleep_* keys given here win")
    sleep_requests_s: float | None = Field(None, ge=0, description="between requests of a video")
    sleep_interval_s: float | None = Field(None, ge=0, description="before each video's download")
    max_sleep_interval_s: float | None = Field(
        None, ge=0, description="sleep a random time from sleep_interval_s up to this")
    sleep_subtitles_s: float | None = Field(None, ge=0, description="before each subtitle track")
    max_bandwidth: str | None = Field(
        None, pattern=r"^\d+(\.\d+)?[KMGkmg]?$",
        description='bytes per second per download, e.g. "2M" (yt-dlp --limit-rate)')
    # When the site refuses the session (bot check, HTTP 429, "try again later", HTTP 403
    # across videos): see pipeline/download/breaker.py.
    block_threshold: int = Field(
        3, ge=1, le=50, description="videos refused within block_window_s that pause downloads")
    block_window_s: float = Field(300, gt=0)
    block_cooldown_s: float = Field(60, gt=0, description="first pause; doubles while refused")
    block_cooldown_max_s: float = Field(900, gt=0)
    max_block_s: float = Field(
        3600, gt=0, description="a block lasting longer stops the stage; the videos left are "
                                "tried again by the next run")
    # When the network fails rather than a site (no name resolves, connections refused or
    # timing out): see pipeline/download/outage.py and pipeline/download/gone_hosts.py.
    network_threshold: int = Field(
        5, ge=2, le=100, description="videos failing on the network in a row (no site reached in "
                                     "between, within block_window_s) that make the network count "
                                     "as down: every download pauses")
    network_cooldown_s: float = Field(30, gt=0, description="first pause; doubles while it stays down")
    network_cooldown_max_s: float = Field(300, gt=0, description="longest pause while it stays down")
    max_outage_s: float = Field(
        1800, gt=0, description="an outage lasting longer stops the stage; the videos left are "
                                "tried again by the next run, none is failed")
    gone_host_runs: int = Field(
        3, ge=2, description="a host counts as gone (its videos fail for good) once its name "
                             "failed to resolve, while other hosts resolved, on this many "
                             "different days, spanning gone_host_days")
    gone_host_days: float = Field(
        7, ge=1, description="days at least from the first of a host's gone_host_runs days of "
                             "failing to resolve to the last")
    # Identity and egress: secrets never reach tables, logs or error messages.
    proxy: SecretStr | None = None
    proxies: list[SecretStr] = Field(
        default_factory=list, description="proxies to rotate through: a blocked one is rested "
                                          "while the next carries the downloads")
    cookies_file: str | None = Field(None, description="cookies in Netscape format")
    cookies_from_browser: str | None = Field(
        None, description="yt-dlp --cookies-from-browser, e.g. firefox or 'chrome:Profile 1'")
    extractor_args: list[str] = Field(
        default_factory=list, description="yt-dlp --extractor-args strings, e.g. "
                                          "'youtube:player_client=web' or a PO-token provider's")
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

    def section(self, start_s: float, end_s: float) -> tuple[float, float]:
        """The span of a video that a partial download fetches for the listed span
        [start_s, end_s]: its media's time 0 is this span's start (align moves a listed span
        onto the media's timeline by it)."""
        return max(0.0, start_s - self.section_padding_s), end_s + self.section_padding_s

    @field_validator("allowed_schemes")
    @classmethod
    def _lower(cls, value: list[str]) -> list[str]:
        return [scheme.lower() for scheme in value]

    @field_validator("rate_limit", mode="before")
    @classmethod
    def _requests_per_minute(cls, value: Any) -> Any:
        if isinstance(value, str) and value[-1:].upper() in ("K", "M", "G"):
            raise ValueError(f"requests per minute now (got {value!r}); the bytes-per-second "
                             f"cap of earlier versions is max_bandwidth")
        return value

    @field_validator("extractor_args")
    @classmethod
    def _extractor_args(cls, value: list[str]) -> list[str]:
        if value:
            extractor_args(tuple(value))
        return value

    @field_validator("cookies_from_browser")
    @classmethod
    def _browser(cls, value: str | None) -> str | None:
        if value is not None:
            browser_cookies(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "DownloadConfig":
        problems: Found = []
        top, bottom = self.max_sleep_interval_s, self.sleep_interval_s
        if top is not None and bottom is not None and top < bottom:
            problems.append((("max_sleep_interval_s",), f"less than sleep_interval_s ({top} < {bottom})"))
        if self.proxy is not None and self.proxies:
            problems.append((("proxies",), "give either proxy or proxies, not both"))
        if self.block_cooldown_max_s < self.block_cooldown_s:
            problems.append((("block_cooldown_max_s",), f"less than block_cooldown_s "
                             f"({self.block_cooldown_max_s} < {self.block_cooldown_s})"))
        if self.network_cooldown_max_s < self.network_cooldown_s:
            problems.append((("network_cooldown_max_s",), f"less than network_cooldown_s "
                             f"({self.network_cooldown_max_s} < {self.network_cooldown_s})"))
        raise_if(problems)
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
            raise_if([(("chunk_s",), f"at most 60 unless long_running (got {self.chunk_s})")])
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
        problems: Found = []
        if self.min_s >= self.max_s:
            problems.append((("min_s",), f"must be less than max_s ({self.min_s} >= {self.max_s})"))
        total = sum(self.splits.values())
        if abs(total - 1.0) > 1e-6:
            problems.append((("splits",), f"fractions must sum to 1 (got {total:g})"))
        raise_if(problems)
        return self
