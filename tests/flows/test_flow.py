"""build_corpus as a real Prefect flow run on a real (threaded, in-process) Dask cluster."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

import stagekit
from flows.build import run_build
from pipeline import graph
from pipeline.compose import stages
from pipeline.config import parse_config
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

pytestmark = pytest.mark.slow


@pytest.fixture
def kit_stages(monkeypatch):
    """Register the test stages as download and transcribe, as later issues' stages will be."""
    stagekit._flaky_seen.clear()
    monkeypatch.setitem(stages.BUILT, "discover", lambda cfg: [])
    monkeypatch.setitem(stages.BUILT, "download", lambda cfg: [stagekit.DOWNLOAD])
    monkeypatch.setitem(stages.BUILT, "transcribe", lambda cfg: [stagekit.TRANSCRIBE])


def _config(root: str, pipelined: bool = True):
    return parse_config({
        "name": "flowtest",
        "root": root,
        "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
        "execution": {"batch_size": 3, "retries": 1, "retry_backoff_s": 0, "n_workers": 2,
                      "pipelined": pipelined, "max_inflight_partitions": 2},
    })


def test_build_corpus_runs_built_stages_in_order_with_until(prefect_server, kit_stages,
                                                            memory_root):
    cfg = _config(memory_root)
    corpus = Corpus(memory_root)
    stagekit.make_videos(corpus, 8, extra=("bad1", "flaky1"), partitions=4)

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


def _runs(client, names: dict, **query) -> list:
    # Explicit limit and sort: Prefect 3.8.8's defaults (None) are refused by its own server.
    from prefect.client.schemas.sorting import FlowRunSort

    runs = client.read_flow_runs(limit=200, sort=FlowRunSort.START_TIME_ASC, **query)
    for run in runs:
        names.setdefault(run.flow_id, client.read_flow(run.flow_id).name)
    return runs


def test_each_stage_is_a_flow_and_a_build_is_a_chain_per_partition_with_work(prefect_server, kit_stages,
                                                                               memory_root):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import TaskRunSort

    from flows.build import STAGE_FLOWS

    assert list(STAGE_FLOWS) == list(graph.ORDER)
    started = datetime.now(UTC)
    corpus = Corpus(memory_root)
    stagekit.make_videos(corpus, 8, partitions=4)
    alone = run_build(_config(memory_root), stage="download")
    assert set(alone["stages"]) == {"download"} and alone["stages"]["download"]["ok"] == 8
    assert alone["stages"]["download"]["partitions"] == 4
    assert "segments" not in alone["tables"]
    staged = run_build(_config(memory_root, pipelined=False), until="transcribe")
    # Downloads are done everywhere: the partitions' summaries say so, and no task runs.
    assert staged["stages"]["download"]["items"] == 0 and staged["stages"]["download"]["skipped_done"] == 8
    assert staged["stages"]["transcribe"]["ok"] == 8
    new = "demo-new1"
    corpus.write_partitioned("videos", [{"video_id": new, "url": "http://127.0.0.1/n", "extractor": "demo",
                                         "source": "urls", "discovered_at": started}], "new", done=[new])
    whole = run_build(_config(memory_root), until="transcribe")
    assert whole["stages"]["download"]["ok"] == 1 and whole["stages"]["transcribe"]["ok"] == 1
    assert whole["stages"]["download"]["total"] == 9 and whole["stages"]["download"]["partitions"] == 1
    idle = run_build(_config(memory_root), until="transcribe")
    assert idle["stages"]["transcribe"]["items"] == 0 and idle["stages"]["transcribe"]["skipped_done"] == 9
    names: dict = {}
    with get_client(sync_client=True) as client:
        runs = [r for r in _runs(client, names) if r.start_time and r.start_time >= started]
        tasks = [t for t in client.read_task_runs(limit=200, sort=TaskRunSort.EXPECTED_START_TIME_ASC)
                 if t.start_time and t.start_time >= started]
    builds = [r for r in runs if names[r.flow_id] == "build_corpus"]
    children = {(r.parent_task_run_id is not None, names[r.flow_id]) for r in runs}
    # The pipelined builds ran one task per stage and partition with work (no flow per stage);
    # the staged one a subflow per partition stage; --stage download its stage flow alone.
    assert len(builds) == 3 and (False, "download") in children
    assert (True, "transcribe") in children and (True, "discover") not in children
    by_name = {}
    for run in tasks:
        by_name.setdefault(run.name, []).append(run)
    for label in corpus.labels():
        more = label == corpus.partition_of(new)
        downloads, transcribes = by_name[f"download p{label}"], by_name[f"transcribe p{label}"]
        assert len(downloads) == 1 + more and len(transcribes) == 1 + more  # alone/staged, new video
    chain = corpus.partition_of(new)
    assert by_name[f"download p{chain}"][1].end_time <= by_name[f"transcribe p{chain}"][1].start_time


def test_a_build_run_publishes_its_progress_and_summary_as_artifacts(prefect_server, kit_stages,
                                                                     memory_root):
    from prefect.client.orchestration import get_client

    corpus = Corpus(memory_root)
    stagekit.make_videos(corpus, 8, extra=("bad1",), partitions=4)
    started = datetime.now(UTC)
    run_build(_config(memory_root), until="transcribe")
    with get_client(sync_client=True) as client:
        names: dict = {}
        run = [r for r in _runs(client, names) if r.start_time and r.start_time >= started
               and names[r.flow_id] == "build_corpus"][-1]
        artifacts = {a.key: a for a in client.read_artifacts(limit=200) if a.flow_run_id == run.id}
    progress = {key: a for key, a in artifacts.items() if a.type == "progress"}
    assert set(progress) == {"stage-download", "stage-transcribe"}
    assert all(a.data == 100.0 for a in progress.values())
    assert progress["stage-download"].description.startswith("download: 4/4 partitions, 8 done, 1 failed")
    tables = json.loads(artifacts["tables"].data)
    assert {row["table"]: row["rows"] for row in tables}["videos"] == 9
    errors = json.loads(artifacts["errors"].data)
    assert errors == [{"stage": "download", "kind": "bad_input", "items": 1}]
    assert artifacts["build"].type == "markdown" and "1 failed items" in artifacts["build"].data
