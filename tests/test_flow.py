"""build_corpus as a real Prefect flow run on a real (threaded, in-process) Dask cluster."""

from __future__ import annotations

import pytest

import stagekit
from flows.build import run_build
from pipeline import stages
from pipeline.config import parse_config
from pipeline.storage import Corpus
from pipeline.validate import validate

pytestmark = pytest.mark.slow


@pytest.fixture
def kit_stages(monkeypatch):
    """Register the test stages as download and transcribe, as later issues' stages will be."""
    stagekit._flaky_seen.clear()
    monkeypatch.delitem(stages.BUILT, "discover")
    monkeypatch.setitem(stages.BUILT, "download", lambda cfg: [stagekit.DOWNLOAD])
    monkeypatch.setitem(stages.BUILT, "transcribe", lambda cfg: [stagekit.TRANSCRIBE])


def _config(root: str):
    return parse_config({
        "name": "flowtest",
        "root": root,
        "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
        "execution": {"batch_size": 3, "retries": 1, "retry_backoff_s": 0, "n_workers": 2},
    })


def test_build_corpus_runs_built_stages_in_order_with_until(prefect_harness, kit_stages,
                                                            memory_root):
    cfg = _config(memory_root)
    corpus = Corpus(memory_root)
    stagekit.make_videos(corpus, 8, extra=("bad1", "flaky1"))

    first = run_build(cfg, until="download")
    assert first["stages"]["download"]["ok"] == 9
    assert first["stages"]["download"]["errors"] == {"bad_input": 1}
    assert "transcribe" not in first["stages"] and "segments" not in first["tables"]
    assert corpus.fs.exists(corpus.path("config.yaml"))

    second = run_build(cfg)
    assert second["stages"]["download"]["items"] == 0  # resumed: nothing left to do
    assert second["stages"]["transcribe"]["ok"] == 9
    assert second["tables"]["segments"] == sum(corpus.done("segments").values())
    assert second["errors"] == {"download": {"bad_input": 1}}
    assert validate(corpus) == []
