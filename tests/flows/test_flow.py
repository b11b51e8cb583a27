"""build_corpus and the stage flows as a user runs them: `vlcorpus build` as typed, on a local
root, through the default local cluster (worker processes) and the real stages, against the demo
site on 127.0.0.1. The builds report to a Prefect server of this module's own, as a user points a
build at theirs (PREFECT_API_URL), and the flow runs, task runs and artifacts are read back from
it: `--stage NAME` runs that stage's flow alone; a config with `execution.pipelined: false` runs
each partition stage's flow over the whole corpus in turn, as subflows of build_corpus; each
stage's progress and the build's summary are artifacts of those runs. While its downloads wait on
the site, the cluster of one build is looked into: it listens on 127.0.0.1 only (TLS is
tests/flows/test_closed_doors.py's). Last, a build on an in-memory root, whose workers are
threads of the caller's process, with stand-in stages."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pytest
import yaml

import stagekit
from buildkit import Build, build, listening, summary
from conftest import own_prefect_server
from sitekit import copy_site, held_site, spread_pages
from flows.build import run_build
from pipeline.compose import stages
from pipeline.config import parse_config
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

# Three builds in the module fixture, more on a loaded machine than the default bound allows.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
VIDEOS, PARTITIONS, WORKERS = 4, 2, 2
# The demo site's broken page (media without its moov atom) and gone one (its media 404s).
FAILED = [{"stage": "download", "kind": "bad_input", "items": 1},
          {"stage": "download", "kind": "permanent", "items": 1}]


@pytest.fixture(scope="module")
def builds(demo_corpus, tmp_path_factory) -> dict:
    """Three builds of one config (`execution.pipelined: false`) on one root: `--stage discover`,
    `--stage download` (looked into while its downloads wait on the site), then the whole build;
    with what each printed, when each started, and what the server holds of them after."""
    from flows.services import use_api

    folder = tmp_path_factory.mktemp("flow")
    site = copy_site(demo_corpus, folder)
    root = folder / "corpus"
    out: dict = {"root": root}
    with own_prefect_server() as server, held_site(site) as served:
        pages = [*spread_pages(site, served.base, VIDEOS, PARTITIONS),
                 f"{served.base}pages/broken.html", f"{served.base}pages/gone.html"]
        (folder / "pages.txt").write_text("".join(f"{url}\n" for url in pages))
        config = folder / "flow.yaml"
        config.write_text(yaml.safe_dump({
            "name": "flow", "root": str(root),
            "sources": [{"type": "list", "path": "pages.txt"}],
            "download": {"subtitle_langs": ["en"], "rate_limit": None, "per_host": None},
            "transcribe": {"prefer": ["manual"]},
            "execution": {"pipelined": False, "partitions": PARTITIONS, "n_workers": WORKERS,
                          "retry_backoff_s": 0}}, sort_keys=False))
        env = {**os.environ, "PREFECT_API_URL": server.api_url}
        out["discover_at"] = datetime.now(UTC)
        out["discover"] = summary(build(str(config), "--stage", "discover", "--json", env=env, folder=folder))
        out["download_at"] = datetime.now(UTC)
        served.hold()
        downloading = Build.start(str(config), "--stage", "download", "--json", env=env, folder=folder)
        served.wait_for_download(downloading.process)
        out["listening"] = listening(downloading.process.pid)
        out["build_pid"] = downloading.process.pid
        served.release()
        done = downloading.finish()
        assert done.returncode == 0, done.stderr[-3000:]
        out["download"] = summary(done)
        out["whole_at"] = datetime.now(UTC)
        out["whole"] = build(str(config), env=env, folder=folder)
        with use_api(server.api_url):
            out.update(_server_records())
    return out


def _server_records() -> dict:
    """What the server holds: flow runs (with their flow's name), task runs, artifacts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort, TaskRunSort

    def every(read, **query) -> list:
        # Pages of 200, the server's most; explicit sorts: Prefect 3.8.8's default (None) is
        # refused by its own server.
        found: list = []
        while page := read(limit=200, offset=len(found), **query):
            found += page
        return found

    with get_client(sync_client=True) as client:
        flow_runs = every(client.read_flow_runs, sort=FlowRunSort.START_TIME_ASC)
        names = {run.flow_id: client.read_flow(run.flow_id).name for run in flow_runs}
        return {"flow_runs": [(names[run.flow_id], run) for run in flow_runs],
                "task_runs": every(client.read_task_runs, sort=TaskRunSort.EXPECTED_START_TIME_ASC),
                "artifacts": every(client.read_artifacts)}


def _runs_of(builds: dict, since: str, until: str | None = None) -> list:
    """(flow name, flow run) of the runs that started between two builds' starts."""
    return [(name, run) for name, run in builds["flow_runs"] if run.start_time
            and builds[since] <= run.start_time and (until is None or run.start_time < builds[until])]


def _tasks_of(builds: dict, run) -> dict[str, object]:
    """The task runs of one flow run, by name."""
    return {task.name: task for task in builds["task_runs"] if task.flow_run_id == run.id}


def _artifacts_of(builds: dict, run) -> dict[str, object]:
    return {artifact.key: artifact for artifact in builds["artifacts"] if artifact.flow_run_id == run.id}


def test_a_stage_alone_runs_that_stages_flow_and_nothing_else(builds):
    corpus = Corpus(str(builds["root"]))
    labels = corpus.labels()
    assert len(labels) == PARTITIONS
    discover, download = builds["discover"], builds["download"]
    assert set(discover["stages"]) == {"discover"} and discover["tables"] == {"videos": VIDEOS + 2}
    assert set(download["stages"]) == {"download"}
    report = download["stages"]["download"]
    assert (report["ok"], report["errors"], report["partitions"]) == (VIDEOS, {"bad_input": 1, "permanent": 1},
                                                                     PARTITIONS)
    assert "segments" not in download["tables"] and download["tables"]["downloads"] == VIDEOS
    # On the server: each stage's flow run alone, with no build_corpus run around it; the
    # download flow ran one task per partition.
    (alone,) = _runs_of(builds, "discover_at", "download_at")
    assert alone[0] == "discover" and alone[1].parent_task_run_id is None
    (alone,) = _runs_of(builds, "download_at", "whole_at")
    assert alone[0] == "download" and alone[1].parent_task_run_id is None
    assert set(_tasks_of(builds, alone[1])) == {f"download p{label}" for label in labels}


def test_pipelined_false_runs_each_stage_flow_over_the_whole_corpus_in_turn(builds):
    corpus = Corpus(str(builds["root"]))
    labels = corpus.labels()
    assert len(labels) == PARTITIONS
    runs = _runs_of(builds, "whole_at")
    (whole,) = [run for name, run in runs if name == "build_corpus"]
    steps = {task.id for task in builds["task_runs"] if task.flow_run_id == whole.id}
    subflows = [(name, run) for name, run in runs if run.parent_task_run_id in steps]
    # Every partition stage a subflow of the build, over every partition, one after the other.
    assert [name for name, _ in subflows] == ["download", "transcribe", "align", "featurize", "shard"]
    assert len(runs) == 1 + len(subflows)
    tasks = {name: _tasks_of(builds, run) for name, run in subflows}
    # The downloads were done (their partitions' summaries say so) and no extractor is named:
    # no task in either flow.
    assert tasks["download"] == tasks["featurize"] == {}
    for stage in ("transcribe", "align", "shard"):
        assert {f"{stage} p{label}" for label in labels} <= set(tasks[stage])
    for before, after in (("transcribe", "align"), ("align", "shard")):
        ended = max(t.end_time for name, t in tasks[before].items() if name.startswith(f"{before} p"))
        assert ended <= min(t.start_time for name, t in tasks[after].items() if name.startswith(f"{after} p"))
    # What the person at the terminal saw (plain lines: not a terminal): the stages with work,
    # one after the other, each ending with all its partitions; the report and the shards.
    last = {line.split(":")[0]: line for line in builds["whole"].stderr.strip().splitlines()[1:]}
    assert list(last) == ["transcribe", "align", "shard"]
    assert all(f": {PARTITIONS}/{PARTITIONS} partitions," in line for line in last.values())
    assert f"report: {builds['root'] / 'report' / 'report.html'}" in builds["whole"].stdout
    assert "parquet shards:" in builds["whole"].stdout
    assert corpus.read("clips").num_rows > 0 and validate(corpus) == []


def test_each_stage_publishes_its_progress_and_the_build_its_summary_as_artifacts(builds):
    corpus = Corpus(str(builds["root"]))
    (download,) = [run for name, run in _runs_of(builds, "download_at", "whole_at")]
    progress = _artifacts_of(builds, download)["stage-download"]
    assert progress.type == "progress" and progress.data == 100.0
    assert progress.description.startswith(f"download: {PARTITIONS}/{PARTITIONS} partitions, {VIDEOS} done, "
                                           "2 failed, 0 done before")
    runs = dict(_runs_of(builds, "whole_at"))
    for stage in ("transcribe", "align", "shard"):
        progress = _artifacts_of(builds, runs[stage])[f"stage-{stage}"]
        assert progress.data == 100.0 and progress.description.startswith(f"{stage}: {PARTITIONS}/{PARTITIONS} ")
    published = _artifacts_of(builds, runs["build_corpus"])
    assert set(published) == {"tables", "errors", "build"}
    tables = {row["table"]: row["rows"] for row in json.loads(published["tables"].data)}
    assert tables == {name: corpus.read(name).num_rows for name in corpus.tables()}
    assert tables["videos"] == VIDEOS + 2 and tables["segments"] > 0
    assert sorted(json.loads(published["errors"].data), key=lambda e: e["kind"]) == FAILED
    page = builds["root"] / "report" / "report.html"
    text = published["build"].data
    assert published["build"].type == "markdown" and "2 failed items" in text
    assert f"[The corpus report]({page.resolve().as_uri()})" in text and page.exists()


def test_a_builds_cluster_listens_on_loopback_only(builds):
    """Every socket the build's processes listen on while its workers download, on 127.0.0.1:
    the scheduler's, each nanny's and each worker's (the workers in processes of their own
    below the build's), and their HTTP pages."""
    found = builds["listening"]
    assert {ip for addresses in found.values() for ip, _ in addresses} == {"127.0.0.1"}
    assert sum(map(len, found.values())) >= 1 + 2 * WORKERS  # the scheduler, each nanny and worker
    assert len([process for process in found if process.pid != builds["build_pid"]]) >= WORKERS


# ------------------------------------------------------------------ an in-memory root


@pytest.fixture
def kit_stages(monkeypatch):
    """stagekit's stand-in download and transcribe (no network, no media), no discover."""
    stagekit._flaky_seen.clear()
    monkeypatch.setitem(stages.BUILT, "discover", lambda cfg: [])
    monkeypatch.setitem(stages.BUILT, "download", lambda cfg: [stagekit.DOWNLOAD])
    monkeypatch.setitem(stages.BUILT, "transcribe", lambda cfg: [stagekit.TRANSCRIBE])


def test_a_build_on_an_in_memory_root_runs_on_threads_in_its_process(prefect_server, kit_stages, memory_root):
    """A `memory://` root is seen only inside the process that holds it, so its build's local
    cluster is threads of that process (a worker process would find no videos). With stand-in
    stages: `until`, resuming, and an item that fails for good."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import TaskRunSort

    cfg = parse_config({
        "name": "flowtest", "root": memory_root,
        "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
        "execution": {"batch_size": 3, "retries": 1, "retry_backoff_s": 0, "n_workers": 2,
                      "max_inflight_partitions": 2},
    })
    corpus = Corpus(memory_root)
    stagekit.make_videos(corpus, 8, extra=("bad1", "flaky1"), partitions=4)

    first = run_build(cfg, until="download")
    assert first["stages"]["download"]["ok"] == 9
    assert first["stages"]["download"]["errors"] == {"bad_input": 1}
    assert "transcribe" not in first["stages"] and "segments" not in first["tables"]
    assert corpus.fs.exists(corpus.path("config.yaml"))

    started = datetime.now(UTC)
    second = run_build(cfg)
    assert second["stages"]["download"]["items"] == 0  # resumed: nothing left to do
    assert second["stages"]["transcribe"]["ok"] == 9
    assert second["tables"]["segments"] == sum(corpus.done("segments").values())
    assert second["errors"] == {"download": {"bad_input": 1}}
    assert validate(corpus) == []
    # A partition's chain is one task (no stage goes to a GPU worker here): its stages in order.
    with get_client(sync_client=True) as client:
        names = [t.name for t in client.read_task_runs(limit=200, sort=TaskRunSort.EXPECTED_START_TIME_ASC)
                 if t.start_time and t.start_time >= started and " p" in t.name]
    assert sorted(names) == [f"download..shard p{label}" for label in corpus.labels()], names
