"""Every corpus style builds as typed: each starter (`vlcorpus init NAME --style STYLE`) is
taken as a user gets it, changed only where this machine needs it (local sources from the demo
site, the shipped tiny.en Whisper model, no published weights, small frames, no YouTube pacing,
duration filters the short demo videos can meet), then built with `vlcorpus build CONFIG` through
the default local cluster, to shards and a report that `vlcorpus validate` accepts."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml

from conftest import SCRIPT, require_binaries, vlcorpus
from speech import tiny_model_path

pytestmark = pytest.mark.slow

# A build's bound; VLCORPUS_TEST_BUILD_TIMEOUT_S overrides every one (to see a hang's report).
BUILD_TIMEOUT_S = 360


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Three narrated demo videos with caption tracks, served on 127.0.0.1: (site dir, the
    good pages' URLs)."""
    require_binaries("ffmpeg", "ffprobe", "espeak-ng")
    from pipeline.demo import make_demo_media, serve_demo

    folder = tmp_path_factory.mktemp("site")
    make_demo_media(folder, n_videos=3, seed=3, quiet=True)
    with serve_demo(folder):
        urls = [u for u in (folder / "urls.txt").read_text().split() if "/tour-" in u]
        yield folder, urls


def _init(tmp_path: Path, style: str) -> tuple[Path, dict]:
    """`vlcorpus init my_corpus --style STYLE` in tmp_path: the starter's path and its keys."""
    done = vlcorpus("init", "my_corpus", "--style", style, cwd=tmp_path, timeout=120, launcher=(SCRIPT,))
    assert done.returncode == 0, done.stderr[-3000:]
    config = tmp_path / "my_corpus.yaml"
    return config, yaml.safe_load(config.read_text())


def _this_machine(starter: dict, side: int = 64, crop: int = 56) -> None:
    """What every style needs changed here, and only that: no published weights to download
    (random weights), small frames so CPU featurize is quick, the shipped tiny.en model for ASR,
    no YouTube pacing."""
    for extractor in starter["features"]["extractors"]:
        extractor["weights"] = "none"
    starter["frames"] = {"short_side": side, "crop": crop}
    if "asr" in starter["transcribe"]["prefer"]:
        starter["transcribe"].setdefault("asr", {})["model"] = tiny_model_path()
    download = starter["download"]
    download.pop("preset", None)      # yt-dlp's `-t sleep` sleeps 10-20 s per video
    download["rate_limit"] = None     # about 5 videos a minute is for YouTube


def _write(config: Path, starter: dict) -> None:
    config.write_text(yaml.safe_dump(starter, sort_keys=False))


def _tail(text: str, n: int = 4000) -> str:
    return text[-n:]


def _build(config: Path, root: Path, timeout_s: float = BUILD_TIMEOUT_S) -> float:
    """`vlcorpus build CONFIG` as typed, in the config's folder; its seconds. A build still
    running after timeout_s gets SIGABRT (faulthandler prints every thread's stack), then
    its process group is killed, and the test fails with the stderr's tail and the log's.
    Its output goes to files, not pipes: a full pipe cannot block the stacks' dump, and the
    processes it started cannot hold the test waiting for the pipes to close."""
    timeout_s = float(os.environ.get("VLCORPUS_TEST_BUILD_TIMEOUT_S", timeout_s))
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    stdout, stderr = config.parent / "build.out", config.parent / "build.err"
    started = time.monotonic()
    with open(stdout, "w") as out, open(stderr, "w") as err:
        build = subprocess.Popen([SCRIPT, "build", str(config)], cwd=config.parent, env=env,
                                 stdout=out, stderr=err, start_new_session=True)
    try:
        build.wait(timeout=timeout_s)
        hung = False
    except subprocess.TimeoutExpired:
        hung = True
    if hung:
        build.send_signal(signal.SIGABRT)
        try:
            build.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(build.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            build.wait()
        pytest.fail(f"vlcorpus build still running after {timeout_s:g} s; stderr:\n"
                    f"{_tail(stderr.read_text(errors='replace'), 20000)}\n--- log:\n{_log_tail(root)}")
    assert build.returncode == 0, (f"stdout:\n{_tail(stdout.read_text(errors='replace'))}\nstderr:\n"
                                   f"{_tail(stderr.read_text(errors='replace'))}\n--- log:\n{_log_tail(root)}")
    return time.monotonic() - started


def _log_tail(root: Path) -> str:
    logs = sorted((root / "logs").glob("build-*.log"), key=lambda p: p.stat().st_mtime)
    return _tail(logs[-1].read_text(errors="replace"), 6000) if logs else "(no build log)"


def _check_corpus(root: Path, features: list[str]) -> ds.Dataset:
    """Shards in both formats, readable, with every feature; a report; `vlcorpus validate` 0.
    Returns the segments dataset."""
    from pipeline.ids import feature_key
    from pipeline.shards import open_parquet, open_webdataset

    samples = list(open_webdataset(str(root / "shards" / "webdataset"), features=features))
    assert samples, "no WebDataset sample"
    for sample in samples:
        assert sample["text"] and set(sample["features"]) == {feature_key(f) for f in features}
    table = open_parquet(str(root / "shards" / "parquet")).to_table()
    assert table.num_rows == len(samples)
    assert sorted(table.column("clip_id").to_pylist()) == sorted(s["clip_id"] for s in samples)
    report = root / "report"
    assert (report / "stats.json").exists() and (report / "report.html").exists()
    checked = vlcorpus("validate", str(root), launcher=(SCRIPT,))
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    return ds.dataset(str(root / "segments"), format="parquet")


@pytest.mark.timeout(600)
def test_apartment_tour_builds_as_typed(tmp_path, site):
    folder, urls = site
    config, starter = _init(tmp_path, "apartment_tour")
    _this_machine(starter)
    # The tours list stays the list source of the starter, with the demo's pages in it; the
    # YouTube channel cannot be reached offline.
    (tmp_path / starter["sources"][0]["path"]).write_text("".join(f"{u}\n" for u in urls))
    starter["sources"] = [s for s in starter["sources"] if s["type"] != "playlist"]
    # The demo's tours last 15-30 s, not the minute a real tour takes.
    starter["filters"]["min_duration_s"] = 5
    _write(config, starter)
    root = tmp_path / starter["root"]
    seconds = _build(config, root)
    segments = _check_corpus(root, ["resnet34"]).to_table()
    assert set(segments.column("source").to_pylist()) == {"manual"}
    clips = ds.dataset(str(root / "clips"), format="parquet").to_table().to_pylist()
    assert clips and all(2.0 <= c["end_s"] - c["start_s"] <= 5.0 for c in clips)
    print(f"apartment_tour: build {seconds:.0f} s")


@pytest.mark.timeout(600)
def test_spoken_moments_builds_as_typed(tmp_path, site):
    folder, urls = site
    config, starter = _init(tmp_path, "spoken_moments")
    _this_machine(starter)
    # The moments csv of the starter (url, start, end), 3 s moments of the demo's pages, each
    # downloaded as a section (download.partial stays true).
    source = starter["sources"][0]
    with open(tmp_path / source["path"], "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow([source["url_column"], source["start_column"], source["end_column"]])
        for url in urls:
            writer.writerow([url, 4.0, 7.0])
    _write(config, starter)
    root = tmp_path / starter["root"]
    seconds = _build(config, root)
    segments = _check_corpus(root, ["resnet152", "tsm_r50"]).to_table()
    assert {s.split(":")[0] for s in segments.column("source").to_pylist()} == {"asr"}
    # S-MiT's quality checks (5 words, 3 s of speech) stay: they drop one of the three moments
    # of the demo's speech, not all. Each clip is its whole moment, on the section's timeline:
    # 3 s after 0.5 s of padding.
    clips = ds.dataset(str(root / "clips"), format="parquet").to_table().to_pylist()
    assert clips and {(c["start_s"], c["end_s"]) for c in clips} == {(0.5, 3.5)}
    print(f"spoken_moments: build {seconds:.0f} s")


@pytest.mark.timeout(900)
def test_howto100m_builds_as_typed_and_falls_back_to_asr(tmp_path, site):
    folder, urls = site
    config, starter = _init(tmp_path, "howto100m")
    # S3D takes no frames under 224 px (its pooling): the smallest it takes.
    _this_machine(starter, side=224, crop=224)
    # YouTube searches cannot run offline: the demo's pages as a list instead, the one with the
    # fewest narrations (one S3D clip of 32 frames of 224 px each, seconds apiece on CPU).
    from pipeline.demo import DemoSite

    said = {v.page: sum(len(scene.sentences) for scene in v.scenes) for v in DemoSite.load(folder).videos}
    pages = sorted(urls, key=lambda url: said[url.split("/", 3)[3]])[:1]
    (tmp_path / "pages.txt").write_text("".join(f"{u}\n" for u in pages))
    starter["sources"] = [{"type": "list", "name": "tasks", "path": "pages.txt"}]
    # The demo's videos last 15-30 s, under the starter's 30 s minimum.
    starter["filters"]["min_duration_s"] = 5
    _write(config, starter)
    root = tmp_path / starter["root"]
    seconds = _build(config, root, timeout_s=600)
    segments = _check_corpus(root, ["s3d"]).to_table()
    # The site serves author captions only (the starter takes auto ones): narrations by ASR.
    assert set(segments.column("source").to_pylist()) == {"asr:faster-whisper"}
    clips = ds.dataset(str(root / "clips"), format="parquet").to_table().to_pylist()
    assert clips and all(abs(c["end_s"] - c["start_s"] - 3.2) < 1e-6 and c["candidates"] for c in clips)
    print(f"howto100m: build {seconds:.0f} s")
