"""The site's HTML: one page per video (a <video> with its <source> and caption <track>s) and
the index; and how every text file of the site is written."""

from __future__ import annotations

import html
from pathlib import Path

from pipeline.demo.model import DemoSite
from pipeline.demo.pictures import HEIGHT, WIDTH


def page_html(title: str, media: str, tracks: list[tuple[str, str, str]]) -> str:
    """A page with one <video> of media and a caption track per (srclang, path, label)."""
    track_tags = "".join(
        f'    <track kind="captions" src="../{src}" srclang="{lang}" label="{label}">\n'
        for lang, src, label in tracks
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
        f'<video controls width="{WIDTH}" height="{HEIGHT}">\n'
        f'    <source src="../{media}" type="video/mp4">\n{track_tags}</video>\n</body>\n</html>\n'
    )


def index_html(site: DemoSite) -> str:
    links = [(v.page, v.title) for v in site.videos] + [(b.page, b.page) for b in site.bad_pages]
    items = "".join(f'<li><a href="{page}">{html.escape(text)}</a></li>\n' for page, text in links)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>vlcorpus demo</title>\n</head>\n<body>\n<ul>\n{items}</ul>\n</body>\n</html>\n"
    )


def write_text(path: Path, text: str) -> None:
    """UTF-8 with \\n line ends on every platform, so the bytes depend only on the seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")

