"""The report: stats.json figures, escaping of user text, and the page in a real headless
browser (Debian chromium through Playwright): no console errors, every image shown."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline import align, transcribe
from pipeline.config import parse_config
from pipeline.report import message_class, write_report
from pipeline.runner import StageContext, run_stage
from pipeline.stages import context
from pipeline.storage import Corpus

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HOSTILE = "<script>alert('x')</script> & \"quotes\""


@pytest.fixture
def reported(demo_corpus, tmp_path) -> Corpus:
    root, _ = demo_corpus
    shutil.copytree(root, tmp_path / "corpus")
    corpus = Corpus(str(tmp_path / "corpus"))
    cfg = parse_config({"name": "t", "sources": [{"type": "urls", "urls": ["http://x/"]}],
                        "transcribe": {"prefer": ["manual"]}})
    ctx = context(corpus, cfg)
    run_stage(transcribe.STAGE, ctx, batch_size=4)
    run_stage(align.STAGE, ctx, batch_size=4)
    # A hostile sentence, as a real video could carry.
    first = corpus.read("clips").to_pylist()[0]
    corpus.write_partitioned("clips", [dict(first, clip_id="aa-evil-0-2000", video_id="aa-evil",
                                            text=HOSTILE)], "evil", done=["aa-evil"])
    corpus.write_partitioned("errors", [{"stage": "download", "item_id": "aa-evil", "kind": "permanent",
                                         "message": HOSTILE, "attempt": 1,
                                         "time": corpus.read("errors").column("time")[0].as_py()}],
                             "evil")
    write_report(StageContext(corpus, cfg))
    return corpus


def test_stats_json_has_the_figures(reported):
    stats = json.loads(reported.fs.cat(reported.path("report/stats.json")))
    clips = reported.read("clips").num_rows
    assert stats["tables"]["clips"] == clips
    assert stats["stages"]["download"] == {"in": 4, "out": 2}
    assert stats["errors"]["by_kind"] == {"download": {"bad_input": 1, "permanent": 2}}
    assert sum(stats["clip_duration_s"]["histogram"]["counts"]) == clips
    assert 2 <= stats["clip_duration_s"]["min"] and stats["clip_duration_s"]["max"] <= 5
    assert stats["media_hours"] > 0
    (label, row), = stats["per_source"].items()
    assert label.startswith("list:") and row["videos"] == 4 and row["downloaded"] == 2
    assert message_class("HTTP Error 404 for https://x.org/v?id=3") == "HTTP Error … for …"
    (run,) = stats["download_runs"]  # the figures of the demo corpus's download run
    assert (run["videos"], run["downloaded"], run["errors"]) == (4, 2, {"bad_input": 1,
                                                                         "permanent": 1})
    assert run["per_minute"] > 0 and (run["pauses"], run["paused_s"], run["left"]) == (0, 0, 0)
    page = reported.fs.cat(reported.path("report/report.html")).decode()
    assert "<h2>Download runs</h2>" in page


def test_page_escapes_user_text_and_loads_nothing_external(reported):
    page = reported.fs.cat(reported.path("report/report.html")).decode()
    assert HOSTILE not in page
    assert page.count("&lt;script&gt;alert(&#x27;x&#x27;)") == 2  # the grid and the errors
    assert "<script" not in page.lower()
    assert "http://" not in page.replace(reported.url, "") and "https://" not in page
    assert page.count("<img") >= 3


def test_page_renders_in_headless_chromium(reported, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip("needs Debian's chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1280, "height": 1600})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: errors.append(f"request {r.url}")
                if not r.url.startswith(("file:", "data:")) else None)
        page.goto(Path(reported.path("report/report.html")).as_uri())
        broken = page.evaluate(
            "Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
            ".map(i => i.alt)")
        shown = page.evaluate("document.images.length")
        shot = Path(reported.path("report")) / "screenshot.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert errors == [] and broken == [] and shown >= 3
    assert shot.stat().st_size > 10_000
