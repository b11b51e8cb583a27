"""Where a test's videos fall: a video's partition and split hash its id, which holds its page URL
(the server's port too). A test that needs its videos spread over partitions (each worker busy,
every partition with media) copies the two tours to names chosen for the port it serves them on;
one that trains needs a port on which enough of its videos fall in each split. A test that
looks into a build while it downloads serves the site held (``held_site``)."""

from __future__ import annotations

import functools
import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import spare_port

from pipeline.align.stage import split_for
from pipeline.demo.serve import QuietHandler, serve_demo
from pipeline.corpus.partitions import index_of
from pipeline.discover import id_for_url
from pipeline.ids import video_id


def copy_site(demo_corpus: tuple[Path, Path], tmp_path: Path) -> Path:
    """A copy of the demo site of the ``demo_corpus`` fixture, which ``spread_pages`` adds pages to."""
    _, site = demo_corpus
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    return copy


def spread_pages(site: Path, base: str, videos: int, partitions: int) -> list[str]:
    """The URLs of ``videos`` pages of the two tours (alternately) on the server at ``base``,
    ``videos // partitions`` in each of ``partitions`` partitions."""
    per: Counter[int] = Counter()
    urls: list[str] = []
    for i in range(1000):
        url = f"{base}pages/copy-{i}.html"
        partition = index_of(video_id(*id_for_url(url)), partitions)
        if per[partition] < videos // partitions:
            shutil.copy(site / "pages" / f"tour-{len(urls) % 2}.html", site / "pages" / f"copy-{i}.html")
            per[partition] += 1
            urls.append(url)
        if len(urls) == videos:
            return urls
    raise AssertionError(f"no {videos} page names fill {partitions} partitions evenly")


def port_for_splits(pages: list[str], splits: dict[str, float], at_least: dict[str, int]) -> int:
    """A free port on which ``pages`` (paths under the site's root) put at least ``at_least[s]``
    videos in each split ``s`` of ``splits``: on another, a training may find one test pair."""
    while True:
        port = spare_port()
        found = Counter(split_for(video_id(*id_for_url(f"http://127.0.0.1:{port}/{page}")), splits)
                        for page in pages)
        if all(found[split] >= n for split, n in at_least.items()):
            return port


class HeldSite:
    """The demo site on 127.0.0.1 (``held_site``), whose requests for a video's media wait while
    it is held: a build then waits in its download stage, its workers up, while a test looks."""

    def __init__(self) -> None:
        self.base = ""
        self.waiting = threading.Event()  # a media request waits on the hold
        self._open = threading.Event()
        self._open.set()

    def hold(self) -> None:
        self.waiting.clear()
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def wait_for_download(self, build: subprocess.Popen) -> None:
        """Until a download of ``build`` waits on the hold; fails if the build ends first (a
        hang is pytest-timeout's)."""
        while not self.waiting.wait(0.2):
            assert build.poll() is None, f"the build ended (exit {build.returncode}) before any download"

    def _gate(self, path: str) -> None:
        if path.startswith("/media/") and not self._open.is_set():
            self.waiting.set()
            self._open.wait()


class _HeldHandler(QuietHandler):
    def __init__(self, *args, held: HeldSite, **kwargs) -> None:
        self.held = held  # before the base class's __init__, which answers the request
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        self.held._gate(self.path)
        super().do_GET()


@contextmanager
def held_site(site: Path, port: int = 0) -> Iterator[HeldSite]:
    """``site`` served as ``serve_demo`` serves it (urls.txt written for the server), on
    127.0.0.1, through a server whose media requests wait while it is held (``HeldSite.hold``)."""
    held = HeldSite()
    with serve_demo(site, port=port, handler=functools.partial(_HeldHandler, held=held)) as base:
        held.base = base
        try:
            yield held
        finally:
            held.release()
