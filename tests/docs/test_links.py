"""The Markdown reads on GitHub as on the site: every relative link of README.md and docs/
leads to a file of the repository, and the committed reference pages (docs/reference/) are
what ``make reference`` writes now."""

from __future__ import annotations

import sys
from pathlib import Path

from docskit import DOCS, ROOT
from markdown_it import MarkdownIt

sys.path.insert(0, str(DOCS / "hooks"))
import reference  # noqa: E402 - docs/hooks is no package: MkDocs loads it by path


def _links(page: Path) -> list[str]:
    """The link targets of a page's text (not of its code), anchors left out."""
    found = []
    for token in MarkdownIt().parse(page.read_text(encoding="utf-8")):
        for child in token.children or []:
            if child.type == "link_open":
                found.append(str(child.attrs["href"]).split("#", 1)[0])
    return found


def test_every_relative_link_leads_to_a_file():
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    dead = [f"{page.relative_to(ROOT)}: {target}" for page in pages for target in _links(page)
            if target and "://" not in target and not target.startswith("mailto:")
            and not (page.parent / target).exists()]
    assert not dead, dead


def test_the_reference_pages_are_fresh():
    assert reference.stale() == [], "run `make reference`"
