"""``vlcorpus demo``: generate narrated videos, serve them on 127.0.0.1, build a corpus.

Everything runs offline. The site is served on a fixed port when it is free, because page
URLs are part of generic video ids: a rerun on the same port resumes instead of starting over.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from flows.build import run_build
from pipeline.config import ListSource, load_config
from pipeline.demo import make_demo_media, serve_demo
from pipeline.progress import log

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"
DEMO_PORT = 8765


def _site(site_dir: Path, n_videos: int, seed: int) -> None:
    """Generate the demo media unless the same videos are already there."""
    manifest = site_dir / "manifest.json"
    if manifest.exists():
        data = json.loads(manifest.read_text())
        if data.get("seed") == seed and len(data.get("videos", [])) == n_videos:
            return
    make_demo_media(site_dir, n_videos=n_videos, seed=seed)


def run_demo(root: Path, n_videos: int = 12, seed: int = 0, until: str | None = None,
             port: int = DEMO_PORT) -> dict[str, Any]:
    root = root.resolve()
    if not DEMO_CONFIG.exists():
        raise FileNotFoundError(f"{DEMO_CONFIG} is missing: run the demo from a source checkout")
    site_dir = root / "site"
    began = time.monotonic()
    _site(site_dir, n_videos, seed)
    site_s = round(time.monotonic() - began, 2)
    cfg = load_config(DEMO_CONFIG)
    with ExitStack() as stack:
        try:
            base = stack.enter_context(serve_demo(site_dir, port=port))
        except OSError:  # taken, by a server or by a process that bound it a moment ago
            log.warning("port %d is busy; serving on a random port (video ids will differ)", port)
            base = stack.enter_context(serve_demo(site_dir, port=0))
        log.info("demo site at %s", base)
        urls = ListSource(type="list", path=str(site_dir / "urls.txt"))
        corpus = str(root / "corpus")
        cfg = cfg.model_copy(update={"sources": [urls], "root": corpus})
        summary = run_build(cfg, root=corpus, until=until)
    summary["timing"]["site_s"] = site_s
    return summary
