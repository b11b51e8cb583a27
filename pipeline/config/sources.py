"""Where videos come from: the `sources` section (search, playlist, list, urls, folder)."""

from __future__ import annotations

import itertools
import string
from pathlib import PurePosixPath
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.config.problems import Found, raise_if

_LIST_SUFFIXES: dict[str, Literal["txt", "csv", "parquet"]] = {
    ".txt": "txt",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


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
        problems: Found = []
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
        raise_if(problems)
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
            raise_if([(("path",), f"cannot tell the format of {self.path!r} from its extension "
                        f"({', '.join(_LIST_SUFFIXES)}); set format to txt, csv or parquet")])
        problems: Found = []
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
        raise_if(problems)
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
