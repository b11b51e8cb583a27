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
    monkeypatch.setitem(stages.BUILT, "discover", lambda cfg: [])
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


def test_each_stage_is_a_flow_of_its_own(prefect_harness, kit_stages, memory_root):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    from flows.build import STAGE_FLOWS

    assert list(STAGE_FLOWS) == list(stages.ORDER)
    cfg = _config(memory_root)
    corpus = Corpus(memory_root)
    stagekit.make_videos(corpus, 4)
    alone = run_build(cfg, stage="download")
    assert set(alone["stages"]) == {"download"} and alone["stages"]["download"]["ok"] == 4
    assert "segments" not in alone["tables"]
    whole = run_build(cfg, until="transcribe")
    assert whole["stages"]["download"]["items"] == 0 and whole["stages"]["transcribe"]["ok"] == 4
    # build_corpus ran every stage as a subflow of its own flow run.
    # Explicit limit and sort: Prefect 3.8.8's defaults (None) are refused by its own server.
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(limit=200, sort=FlowRunSort.START_TIME_ASC)
        names = {r.flow_id: client.read_flow(r.flow_id).name for r in runs}
    parent = {r.id: r for r in runs if names[r.flow_id] == "build_corpus"}
    children = [names[r.flow_id] for r in runs if r.parent_task_run_id is not None]
    assert parent and {"discover", "download", "transcribe"} <= set(children)
