"""The report: stats.json figures, escaping of user text, the sections (timing of the newest
build, errors by stage and kind, shards, training, scores), and the page in a real headless
browser (Debian chromium through Playwright): no console errors, every image shown."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import missing_system
from markupsafe import escape

from pipeline.align import stage as align
from pipeline.transcribe import stage as transcribe
from pipeline.config import parse_config
from pipeline.report import message_class, write_report
from pipeline.runner import StageContext, StageReport, run_stage
from pipeline.report.scores import score_summary
from pipeline.shards.stage import write_shards
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HOSTILE = "<script>alert('x')</script> & \"quotes\""
HOSTILE_TITLE = "</div></section><script>alert('t')</script> Room tour"
OLD_BUILD = "20250101T000000Z"
TRANSCRIBE_ERRORS = {"aa-t1": "ffprobe: invalid data at byte 1234 in /media/aa-t1.mp4",
                     "aa-t2": "ffprobe: invalid data at byte 99 in /media/aa-t2.mp4"}


def _build_record(corpus: Corpus, transcribed: StageReport, aligned: StageReport) -> None:
    """runs/build records as a pipelined build writes them (StageTotals over partition task
    results): download as the demo corpus's run went, featurize as if two extractors ran."""
    from flows.build import record_run
    from flows.partition_passes import StageTotals

    clips = aligned.rows
    stages = {  # stage: (its parts as a partition task reports them, start, seconds)
        "download": ([StageReport("download", items=4, ok=2, errors={"bad_input": 1, "permanent": 1},
                                  total=4, todo=4)], 1000.0, 30.0),
        "transcribe": ([transcribed], 1010.0, 4.0),
        "align": ([aligned], 1020.0, 2.0),
        "featurize": ([StageReport(f"featurize:{key}", items=clips, ok=clips, rows=clips, total=clips,
                                   todo=clips) for key in ("resnet34", "text_minilm")], 1025.0, 10.0),
    }
    reports = {}
    for stage, (parts, began, seconds) in stages.items():
        totals = StageTotals()
        # Two tasks on two workers, one after the other (the second found nothing left to do):
        # wall time is their span, task time their sum.
        for worker, start, work in (("w1", began, parts),
                                    ("w2", began + seconds / 2, [StageReport(p.stage) for p in parts])):
            totals.add({"stage": stage, "partition": "00000", "parts": {p.stage: asdict(p) for p in work},
                        "released": 0, "worker": worker, "seconds": seconds / 2, "began": start})
        reports.update(totals.as_dicts())
    corpus.write_text(f"runs/build/{OLD_BUILD}.json", json.dumps({"finished": OLD_BUILD, "stages": {}}))
    record_run(corpus, reports)  # the newest: the one shown


def _newest_build(corpus: Corpus) -> str:
    stamps = [Path(p).stem for p in corpus.fs.glob(corpus.path("runs/build/*.json"))]
    assert len(stamps) == 2 and OLD_BUILD in stamps
    return max(stamps)


def _training_run(corpus: Corpus) -> None:
    """train/wal/ as the trainer leaves it (pipeline/train/loop.py: metrics.json)."""
    curve = [{"epoch": e, "loss": 1.0 - 0.2 * e, "lr": 0.01, "val": 20.0 + 5 * e, "z0_share": None}
             for e in range(4)]
    metrics = {
        "t2v": {"R@1": 37.5, "R@5": 75.0, "R@10": 100.0, "medR": 2.0, "mAP": 55.0},
        "v2t": {"R@1": 25.0, "R@5": 62.5, "R@10": 87.5, "medR": 3.5, "mAP": 45.0},
        "mc_acc": 62.5, "mc_rule": "other_videos", "n_test": 8, "protocol": "fixed_8", "split": "test",
        "selected": {"by": "val_recall", "epoch": 2, "value": 30.0}, "curve": curve,
        "config": {"model": "wal", "visual": "resnet34", "text": "text_all-MiniLM-L6-v2", "epochs": 4,
                   "batch_size": 16, "lr": 0.01, "select": "val_recall", "eval_protocol": "fixed"},
        "data": {"source": "the corpus's features tables", "visual_dim": 512, "text_dim": 384,
                 "pairs": {"test": 8, "train": 40, "val": 8}},
        "device": "cpu", "torch_threads": 1,
    }
    corpus.write_text("train/wal/metrics.json", json.dumps(metrics, indent=2, sort_keys=True))


@pytest.fixture
def reported(demo_corpus, tmp_path) -> Corpus:
    root, _ = demo_corpus
    shutil.copytree(root, tmp_path / "corpus")
    corpus = Corpus(str(tmp_path / "corpus"))
    cfg = parse_config({"name": "t", "sources": [{"type": "urls", "urls": ["http://x/"]}],
                        "transcribe": {"prefer": ["manual"]}})
    ctx = context(corpus, cfg)
    transcribed = run_stage(transcribe.STAGE, ctx, batch_size=4)
    aligned = run_stage(align.STAGE, ctx, batch_size=4)
    write_shards(ctx)
    _build_record(corpus, transcribed, aligned)
    _training_run(corpus)
    # A hostile sentence and title, as a real video could carry.
    first = corpus.read("clips").to_pylist()[0]
    corpus.write_partitioned("clips", [dict(first, clip_id="aa-evil-0-2000", video_id="aa-evil",
                                            text=HOSTILE)], "evil", done=["aa-evil"])
    video = corpus.read("videos").to_pylist()[0]
    corpus.write_partitioned("videos", [dict(video, video_id="aa-evil", title=HOSTILE_TITLE)], "evil",
                             done=["aa-evil"])
    time = corpus.read("errors").column("time")[0].as_py()
    corpus.write_partitioned("errors", [{"stage": "download", "item_id": "aa-evil", "kind": "permanent",
                                         "message": HOSTILE, "attempt": 1, "time": time}], "evil")
    corpus.write_partitioned("errors", [{"stage": "transcribe", "item_id": item, "kind": "bad_input",
                                         "message": message, "attempt": 1, "time": time}
                                        for item, message in TRANSCRIBE_ERRORS.items()], "bad")
    write_report(StageContext(corpus, cfg))
    return corpus


class _Page(HTMLParser):
    """Each section's text, every tag, and every src and href of the page."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.links: list[str] = []
        self.sections: dict[str, str] = {}
        self._section: str | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if self._section:  # cells and paragraphs apart, as a browser shows them
            self.sections[self._section] += " "
        attrs = dict(attrs)
        self.links += [attrs[a] for a in ("src", "href") if a in attrs]
        if tag == "section":
            self._section = attrs["id"]
            self.sections[self._section] = ""

    def handle_endtag(self, tag):
        if self._section:
            self.sections[self._section] += " "
        if tag == "section":
            self._section = None

    def handle_data(self, data):
        if self._section:
            self.sections[self._section] += data


def _text(page: _Page, section: str) -> str:
    return re.sub(r"\s+", " ", page.sections[section]).strip()


def _page(corpus: Corpus) -> str:
    return corpus.fs.cat(corpus.path("report/report.html")).decode()


def test_stats_json_has_the_figures(reported):
    stats = json.loads(reported.fs.cat(reported.path("report/stats.json")))
    clips = reported.read("clips").num_rows
    assert stats["tables"]["clips"] == clips
    assert stats["stages"]["download"] == {"in": 5, "out": 2}
    assert stats["errors"]["by_kind"] == {"download": {"bad_input": 1, "permanent": 2},
                                          "transcribe": {"bad_input": 2}}
    assert sum(stats["clip_duration_s"]["histogram"]["counts"]) == clips
    assert 2 <= stats["clip_duration_s"]["min"] and stats["clip_duration_s"]["max"] <= 5
    assert stats["media_hours"] > 0
    (label, row), = stats["per_source"].items()
    assert label.startswith("list:") and row["videos"] == 5 and row["downloaded"] == 2
    assert message_class("HTTP Error 404 for https://x.org/v?id=3") == "HTTP Error … for …"
    (run,) = stats["download_runs"]  # the figures of the demo corpus's download run
    assert (run["videos"], run["downloaded"], run["errors"]) == (4, 2, {"bad_input": 1,
                                                                         "permanent": 1})
    assert run["per_minute"] > 0 and (run["pauses"], run["paused_s"], run["left"]) == (0, 0, 0)


def test_stats_json_has_timing_errors_shards_and_training(reported):
    stats = json.loads(reported.fs.cat(reported.path("report/stats.json")))
    timing, stamp = stats["timing"], _newest_build(reported)
    assert (timing["build"], timing["file"], timing["builds"]) == (stamp, f"runs/build/{stamp}.json", 2)
    rows = {r["part"]: r for r in timing["stages"]}
    assert list(rows) == ["download", "transcribe", "align", "featurize:resnet34", "featurize:text_minilm"]
    download, featurize = rows["download"], rows["featurize:resnet34"]
    assert [r["shared"] for r in rows.values()] == [False, False, False, True, True]
    assert (download["wall_s"], download["task_s"], download["partitions"], download["workers"]) == \
        (30.0, 30.0, 2, ["w1", "w2"])
    assert (download["done"], download["failed"], download["rate"], download["unit"]) == (2, 2, 4.0, "videos/min")
    clips = stats["stages"]["align"]["out"] - 1  # the hostile clip came after the build
    assert (featurize["done"], featurize["unit"]) == (clips, "clips/s")
    assert featurize["rate"] == pytest.approx(clips / 10, abs=1e-3)
    assert rows["transcribe"]["unit"] == "videos/s"

    groups = {(g["stage"], g["kind"]): g for g in stats["errors"]["groups"]}
    assert {k: g["items"] for k, g in groups.items()} == {
        ("download", "bad_input"): 1, ("download", "permanent"): 2, ("transcribe", "bad_input"): 2}
    # Both transcribe messages are one class (bytes and paths blanked), with 2 examples.
    transcribe_errors = groups["transcribe", "bad_input"]
    assert transcribe_errors["classes"] == [{"message": "ffprobe: invalid data at byte … in …", "items": 2}]
    assert {e["item_id"]: e["message"] for e in transcribe_errors["examples"]} == TRANSCRIBE_ERRORS
    permanent = groups["download", "permanent"]
    assert len(permanent["classes"]) == 2 and len(permanent["examples"]) == 2
    assert {"item_id": "aa-evil", "message": HOSTILE} in permanent["examples"]

    listing = json.loads(reported.fs.cat(reported.path("shards/webdataset/index.json")))["shards"]
    assert set(stats["shards"]) == {"webdataset", "parquet"}
    for fmt, shown in stats["shards"].items():
        assert shown["total"]["samples"] == clips and shown["folder"] == f"shards/{fmt}"
        assert [r["split"] for r in shown["splits"]] == sorted({e["split"] for e in listing},
                                                               key=["train", "val", "test"].index)
    webdataset = stats["shards"]["webdataset"]["total"]
    assert webdataset == {"files": len(listing), "samples": clips, "bytes": sum(e["bytes"] for e in listing)}

    (run,) = stats["training"]
    assert (run["model"], run["visual"], run["text"], run["folder"]) == (
        "wal", ["resnet34"], "text_all-MiniLM-L6-v2", "train/wal")
    assert run["pairs"] == {"test": 8, "train": 40, "val": 8} and run["dims"] == [512, 384]
    assert run["chance"] == {"R@1": 12.5, "R@5": 62.5, "R@10": 100.0, "medR": 4.5}
    assert [d["direction"] for d in run["directions"]] == ["t2v", "v2t"]
    assert run["directions"][0]["R@5"] == 75.0 and run["selected"] == {"by": "val_recall", "epoch": 2}
    assert [p["val"] for p in run["curve"]] == [20.0, 25.0, 30.0, 35.0]


def test_page_shows_each_section(reported):
    page = _Page(_page(reported))
    assert list(page.sections) == ["stages", "timing", "data", "sources", "downloads", "errors",
                                   "shards", "training", "samples"]
    timing = _text(page, "timing")
    finished = datetime.strptime(_newest_build(reported), "%Y%m%dT%H%M%SZ")
    assert f"Build finished {finished:%Y-%m-%d %H:%M:%S} UTC" in timing and "the newest of 2 builds" in timing
    assert "download 30.0 s 30.0 s 2 w1, w2 2 videos 2" in timing and "4.00 videos/min" in timing
    assert "clips/s" in timing and "videos/s" in timing
    assert "featurize:text_minilm 10.0 s * 10.0 s *" in timing and "same partition tasks" in timing
    errors = _text(page, "errors")
    assert "5 failed items in 3 groups" in errors
    assert "transcribe · bad_input 2 items" in errors and "download · bad_input 1 item " in errors
    assert "ffprobe: invalid data at byte … in … 2" in errors
    assert all(item in errors and message in errors for item, message in TRANSCRIBE_ERRORS.items())
    assert HOSTILE in errors  # as text
    shards = _text(page, "shards")
    assert "webdataset shards/webdataset" in shards and "parquet shards/parquet" in shards
    assert re.search(r"all \d+ \d+ [\d.]+ (KiB|MiB)", shards)
    training = _text(page, "training")
    assert "wal train/wal" in training and "resnet34" in training and "text_all-MiniLM-L6-v2" in training
    assert "train 40 · val 8 · test 8" in training and "from the corpus's features tables" in training
    assert "text → video 37.5 75.0 100.0 2.0" in training and "chance 12.5 62.5 100.0 4.5" in training
    assert "epoch 2, the best by val_recall on the val split" in training and "62.5 % (chance 20.0 %)" in training
    assert HOSTILE in _text(page, "samples") and HOSTILE_TITLE in _text(page, "samples")
    # Pictures: the histograms, drop reasons, errors, timing, recall and curve at least.
    assert sum(link.startswith("data:image/png;base64,") for link in page.links) >= 7


def test_page_says_when_training_was_skipped_or_not_run(reported):
    reported.write_text("train/wal/skipped.json", json.dumps({"reason": "too few <pairs>", "time": "x"}))
    write_report(StageContext(reported, None))
    training = _text(_Page(_page(reported)), "training")
    assert "The newest build's training was skipped (too few <pairs>)" in training
    assert "text → video 37.5" in training  # the earlier run's metrics, still shown
    reported.fs.rm(reported.path("train/wal/metrics.json"))
    write_report(StageContext(reported, None))
    assert "wal train/wal training was skipped: too few <pairs>" in _text(_Page(_page(reported)), "training")

    reported.fs.rm(reported.path("train"), recursive=True)
    reported.fs.rm(reported.path("runs/build"), recursive=True)
    write_report(StageContext(reported, None))
    page = _Page(_page(reported))
    assert "No training was run on this corpus" in _text(page, "training")
    assert "No build recorded yet" in _text(page, "timing")


def test_page_escapes_user_text_and_loads_nothing_external(reported):
    text = _page(reported)
    assert HOSTILE not in text and HOSTILE_TITLE not in text
    assert text.count(escape(HOSTILE)) == 2  # the grid and the error's example
    assert text.count(escape(HOSTILE_TITLE)) == 1  # the card's title
    assert "<script" not in text.lower()
    page = _Page(text)
    assert not page.tags & {"script", "link", "iframe", "object", "embed", "base", "form"}
    # Only inlined images and anchors within the page: nothing to load.
    assert page.links and all(link.startswith(("data:image/png;base64,", "#")) for link in page.links)
    assert "url(" not in text and "@import" not in text
    assert text.count("<img") >= 3


def test_page_renders_in_headless_chromium(reported, tmp_path):
    if not Path(CHROMIUM).exists():
        missing_system("needs Debian's chromium (apt-get install -y chromium)")
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
        scripts = page.evaluate("document.scripts.length")
        sections = page.evaluate("Array.from(document.querySelectorAll('section')).map(s => s.id)")
        training = page.inner_text("#training")
        timing = page.inner_text("#timing")
        errors_text = page.inner_text("#errors")
        samples = page.inner_text("#samples")
        shot = Path(reported.path("report")) / "screenshot.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert errors == [] and broken == [] and shown >= 7 and scripts == 0
    # The hostile title closed no element: every section is there, in order.
    assert sections == ["stages", "timing", "data", "sources", "downloads", "errors", "shards",
                        "training", "samples"]
    assert "text → video" in training and "chance" in training and "wal" in training
    assert "videos/min" in timing and "clips/s" in timing
    assert "transcribe · bad_input" in errors_text and HOSTILE in errors_text
    assert HOSTILE in samples and HOSTILE_TITLE in samples
    assert shot.stat().st_size > 10_000


def _part(name: str, done: int, seconds: float) -> dict:
    """A stage part's totals as a build records them (flows.partition_passes.StageTotals)."""
    return {**asdict(StageReport(name, items=done, ok=done, rows=done, total=done, todo=done)),
            "workers": ["w1"], "task_seconds": seconds, "wall_seconds": seconds, "partitions": 2}


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> Corpus:
    """A small corpus with a score table, made as tests/train/test_score.py makes one: trainkit's
    noisy pairs (12 videos of 5 clips, each sentence with hostile text), a WAL-att-adv trained for
    4 epochs (its discriminator from epoch 2) and the score stage; then the record of a build
    that scored (the shard stage in two passes around score) and the report."""
    import trainkit
    from flows.build import record_run
    from pipeline.score.stage import make_stage
    from pipeline.train.run import train_corpus

    root = tmp_path_factory.mktemp("scored") / "corpus"
    pairs, _ = trainkit.noisy_pairs(videos=12)
    pairs.captions = [f"{HOSTILE} {pair}" for pair in pairs.pair_ids]
    corpus = Corpus(str(root))
    pairs.to_corpus(corpus, "resnet34", "text:synthetic")
    cfg = parse_config({
        "name": "scored", "root": str(root), "sources": [{"type": "urls", "urls": ["http://x/"]}],
        "features": {"extractors": [{"name": "resnet34", "weights": "none"}, {"name": "text:synthetic"}]},
        "train": {"model": "wal", "visual": "resnet34", "text": "text:synthetic", "epochs": 4, "embed_dim": 32,
                  "batch_size": 32, "options": {"freeze_epochs": 2}},
        "score": {"device": "cpu"}})
    train_corpus(corpus, cfg, device="cpu")
    run_stage(make_stage(cfg), context(corpus, cfg), batch_size=16)
    record_run(corpus, {"featurize:resnet34": _part("featurize:resnet34", 60, 4.0),
                        "shard": {**_part("shard", 42, 2.0), "first_pass": _part("shard", 0, 1.0)},
                        "score:wal": _part("score:wal", 60, 3.0)})
    write_report(StageContext(corpus, cfg))
    return corpus


def test_scores_section_shows_the_distribution_and_both_ends(scored):
    stats = json.loads(scored.fs.cat(scored.path("report/stats.json")))
    assert list(stats["scores"]) == ["scores/wal"]
    wal = stats["scores"]["scores/wal"]
    assert wal == score_summary(scored, bins=20, examples=5)["scores/wal"]
    assert wal["clips"] == 60 and len(wal["similarity"]["histogram"]["counts"]) == 20
    assert wal["p_aligned"] is not None  # the discriminator trained
    assert stats["stages"]["score:wal"] == {"in": 60, "out": 60}
    top, bottom = wal["top"], wal["bottom"]
    assert len(top) == len(bottom) == 5
    assert [r["similarity"] for r in top] == sorted((r["similarity"] for r in top), reverse=True)
    assert top[0]["similarity"] == wal["similarity"]["max"] and bottom[0]["similarity"] == wal["similarity"]["min"]
    # The build that scored: its first shard pass, then score and the shards that waited for it.
    rows = [(r["part"], r["after_train"], r["shared"], r["unit"]) for r in stats["timing"]["stages"]]
    assert rows == [("featurize:resnet34", False, False, "clips/s"), ("shard (first pass)", False, False, "clips/s"),
                    ("score:wal", True, False, "clips/s"), ("shard (after score)", True, False, "clips/s")]

    text = _page(scored)
    assert HOSTILE not in text  # the sentences are escaped
    page = _Page(text)
    assert list(page.sections) == ["stages", "timing", "data", "sources", "errors", "shards", "training",
                                   "scores", "samples"]
    assert "#scores" in page.links
    scores = _text(page, "scores")
    assert "scores/wal 60 clips" in scores and "model wal" in scores
    assert f"median {wal['similarity']['quantiles']['0.5']:,.3f}" in scores
    assert f"rank 1 {wal['rank'].get('1', 0)} clips" in scores
    best, worst = scores.split("Best-scored pairs")[1].split("Worst-scored pairs")
    for shown, rows in ((best, top), (worst, bottom)):
        cells = [f"{r['clip_id']} {r['text']} {r['similarity']:,.3f} {r['rank']} of {r['sentences']}" for r in rows]
        positions = [shown.find(cell) for cell in cells]
        assert -1 not in positions and positions == sorted(positions), cells  # in order, worst first below
    pictures = re.findall(r'<img class="plot" alt="([^"]+)" src="data:image/png;base64,', text)
    assert {"similarity histogram of scores/wal", "p_aligned histogram of scores/wal"} <= set(pictures)
