"""What a demo site holds: its videos down to each word's timing, its bad pages, and the
manifest.json that records all of it as the ground truth of the site."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urljoin


@dataclass
class Word:
    """A spoken word (without punctuation); all times are seconds from the video start."""

    text: str
    start_s: float
    end_s: float


@dataclass
class Sentence:
    text: str
    start_s: float
    end_s: float
    words: list[Word]


@dataclass
class Scene:
    """One shot: a single object drawn as a coloured shape while its sentences are said."""

    index: int
    start_s: float
    end_s: float
    room: str
    object: str
    colour: str
    shape: str
    sentences: list[Sentence]


@dataclass
class DemoVideo:
    """Ground truth of one video; paths are relative to the site directory."""

    id: str
    title: str
    page: str
    media: str
    subs: dict[str, str]
    duration_s: float
    music_s: float  # length of the intro music (0 when none), captioned "[Music]"
    scenes: list[Scene]


@dataclass
class BadPage:
    page: str
    media: str
    kind: str  # "truncated" (media is cut, unreadable) or "missing" (media URL 404s)


@dataclass
class DemoSite:
    """What make_demo_media wrote; manifest.json holds all of it but out_dir."""

    out_dir: Path
    seed: int
    videos: list[DemoVideo]
    bad_pages: list[BadPage] = field(default_factory=list)

    def page_urls(self, base_url: str) -> list[str]:
        """Every page URL under base_url: the good videos first, then the bad pages."""
        pages = [v.page for v in self.videos] + [b.page for b in self.bad_pages]
        return [urljoin(base_url, page) for page in pages]

    def manifest(self) -> dict:
        return {
            "seed": self.seed,
            "videos": [asdict(v) for v in self.videos],
            "bad_pages": [asdict(b) for b in self.bad_pages],
        }

    @classmethod
    def load(cls, site_dir: Path) -> DemoSite:
        """Read a site back from its manifest.json."""
        data = json.loads((Path(site_dir) / "manifest.json").read_text(encoding="utf-8"))
        return cls(
            out_dir=Path(site_dir),
            seed=data["seed"],
            videos=[_video_from_dict(v) for v in data["videos"]],
            bad_pages=[BadPage(**b) for b in data["bad_pages"]],
        )


def _sentence_from_dict(data: dict) -> Sentence:
    return Sentence(**{**data, "words": [Word(**w) for w in data["words"]]})


def _video_from_dict(data: dict) -> DemoVideo:
    scenes = [Scene(**{**s, "sentences": [_sentence_from_dict(t) for t in s["sentences"]]}) for s in data["scenes"]]
    return DemoVideo(**{**data, "scenes": scenes})
