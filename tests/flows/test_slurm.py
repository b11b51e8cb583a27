"""Builds on a real SLURM (tests/slurmkit.py: one node, two fake GPUs), typed as docs/scale.md
shows them: the page's execution section in a config of the demo site, its commands run as
written. Transcribe (ASR) and featurize run only in GPU jobs, on GPU=1 workers that see their
GPU alone (the models run on the CPU here), every other stage in CPU jobs, and the queue is
empty afterwards. A Prefect deployment's run, on a process worker of the login node, builds the
same way, and loses nothing when its GPU job is cancelled mid-task, as walltime or a preemption
would end it: the build completes on another job, which resumes the task's committed batches,
with the tables of the clean build. A partition SLURM refuses, a missing sbatch and jobs that cannot
start fail the build in one line with exit 2; a pending job shows on the progress line, and
SIGTERM or Ctrl-C leave no job behind."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, SCRIPT, ended, require_binaries, stop_group
from docskit import DOCS, code_blocks, commands
import slurmkit
from slurmkit import queue, slurm_cluster, unavailable, wait_gone
from speech import tiny_model_path
from tablekit import tables

# A test's builds and, for the first, the module's clean build: minutes each on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NAME = "tours"
JOBS = [f"vlcorpus-{NAME}-cpu", f"vlcorpus-{NAME}-gpu"]
BIN = Path(sys.executable).parent
# A pool small enough for the refusals and the waits: no models to check.
LIGHT = {"kind": "slurm", "walltime": "00:10:00", "cpu": {"cores": 1, "memory": "1GB", "max_jobs": 1}}


def _page() -> tuple[dict, list[str]]:
    """docs/scale.md's SLURM section: its execution section, and its commands."""
    blocks = code_blocks(DOCS / "scale.md")
    [section] = [b for b in blocks if b.title == "execution section of corpus.yaml"]
    [shell] = [b for b in blocks if b.language == "sh" and "squeue" in b.text]
    return yaml.safe_load(section.text)["execution"], commands(shell)


@pytest.fixture(scope="module")
def slurm():
    require_binaries(*slurmkit.BINARIES)
    if (why := unavailable()) is not None:
        pytest.skip(why)
    with slurm_cluster() as env:
        yield env


@pytest.fixture(scope="module")
def site(demo_corpus):
    """The demo site on one server for the module: page URLs are part of the videos' ids, so
    two builds of it can be compared."""
    from pipeline.demo import serve_demo

    _, folder = demo_corpus
    with serve_demo(folder):
        yield folder


def _env(slurm: dict[str, str]) -> dict[str, str]:
    # As a user types the page's commands: vlcorpus from the venv on the PATH.
    return {**os.environ, **slurm, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def _config(folder: Path, site: Path, execution: dict, models: bool = True) -> Path:
    """``folder``/corpus.yaml, a config of the demo site's urls.txt (one file for every build:
    the list's path is in the videos table) with ``execution``; with ``models``, ASR for every
    video and ResNet features of random weights (the two GPU stages), else subtitles alone."""
    stages = {
        "transcribe": {"prefer": ["asr"], "asr": {"model": tiny_model_path(), "language": "en"}},
        "frames": {"short_side": 64, "crop": 56},
        "features": {"extractors": [{"name": "resnet34", "weights": "none", "fps": 1, "frames": 2}]},
    } if models else {"download": {"subtitle_langs": ["en"]}, "transcribe": {"prefer": ["manual"]}}
    config = {"name": NAME, "root": f"{NAME}-corpus", "sources": [{"type": "list", "path": str(site / "urls.txt")}],
              **stages, "execution": {"retry_backoff_s": 0, **execution}}
    path = folder / "corpus.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _build(config: Path, slurm: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([SCRIPT, "build", config.name], cwd=config.parent, env=_env(slurm),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _job_logs(root: Path, pool: str, suffix: str) -> list[str]:
    folder = root / "logs" / "slurm"
    return [p.read_text(errors="replace") for p in sorted(folder.glob(f"vlcorpus-{NAME}-{pool}-*.{suffix}"))]


def _stages(root: Path) -> dict:
    [record] = sorted((root / "runs" / "build").glob("*.json"))
    return json.loads(record.read_text())["stages"]


@pytest.fixture(scope="module")
def clean(slurm, site, tmp_path_factory):
    """docs/scale.md's commands, as written, in the folder of a config with its execution
    section: the build, squeue in another shell while it runs, then status and the job logs."""
    execution, (build, squeue, status, logs) = _page()
    folder = tmp_path_factory.mktemp("slurm-clean")
    _config(folder, site, execution)
    assert build == "vlcorpus build corpus.yaml" and squeue.startswith(f"squeue --me --name={','.join(JOBS)} ")
    proc = subprocess.Popen(shlex.split(build), cwd=folder, env=_env(slurm), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    listed: list[str] = []
    while proc.poll() is None and not listed:
        shown = subprocess.run(shlex.split(squeue), cwd=folder, env=_env(slurm), capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        listed = shown.stdout.splitlines()[1:]
        time.sleep(0.2)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-4000:]
    after = {command: subprocess.run(shlex.split(command), cwd=folder, env=_env(slurm), capture_output=True, text=True)
             for command in (status, logs)}
    return {"root": folder / f"{NAME}-corpus", "progress": err, "squeue": listed, "status": after[status],
            "ls": after[logs], "execution": execution}


def test_the_build_of_docs_scale_runs_each_stage_in_the_jobs_of_its_pool(clean):
    assert any(re.search(r"vlcorpus-tours-(cpu|gpu)\s+(PENDING|CONFIGURING|RUNNING)", line)
               for line in clean["squeue"]), clean["squeue"]
    stages = _stages(clean["root"])
    for stage in ("transcribe", "featurize:resnet34"):
        assert stages[stage]["ok"] > 0 and stages[stage]["workers"], (stage, stages[stage])
        assert all(w.startswith("gpu-") for w in stages[stage]["workers"]), (stage, stages[stage]["workers"])
    for stage in ("download", "align", "shard"):
        assert stages[stage]["workers"] and all(w.startswith("cpu-") for w in stages[stage]["workers"]), \
            (stage, stages[stage]["workers"])
    assert clean["status"].returncode == 0 and "featurize" in clean["status"].stdout, clean["status"].stderr
    # Each job's log under the root, named for the corpus and its pool; each GPU worker says
    # which GPU it sees alone; the corpus-wide steps ran in CPU jobs, not in the build's process.
    listed = clean["ls"].stdout.split()
    assert any(re.fullmatch(r"vlcorpus-tours-cpu-\d+\.err", name) for name in listed), listed
    gpu_out = _job_logs(clean["root"], "gpu", "out")
    assert gpu_out and all(re.search(r"^vlcorpus: worker gpu-\d+ sees GPU CUDA_VISIBLE_DEVICES=[01]$", text, re.M)
                           for text in gpu_out), gpu_out
    cpu_err = "".join(_job_logs(clean["root"], "cpu", "err"))
    for step in ("discover", "report"):
        assert f"Task run '{step}' - Finished in state Completed()" in cpu_err
    assert re.search(r"^SLURM: .*GPU job", clean["progress"], re.M), clean["progress"]
    assert not queue(JOBS)


def test_a_deployments_run_builds_on_slurm_through_a_gpu_job_cancelled_mid_task(clean, slurm, site, tmp_path,
                                                                                   prefect_server):
    """A Prefect process worker on the login node runs the rebuild deployment, as infra/README.md
    registers and runs it, with the page's execution section, its scheduler on the interface
    the config names and TLS with `make secrets`' certificates; its GPU job is cancelled (as
    walltime or a preemption would end it) once its transcribe task has committed one video's
    sentences and has the other's to do: another job takes the task, does only what is left,
    and the run completes with the tables of the clean build."""
    from prefect.client.orchestration import get_client

    assert subprocess.run(["make", "secrets"], cwd=ROOT, capture_output=True).returncode == 0
    cluster = {**clean["execution"]["cluster"], "interface": "lo", "tls": str(ROOT / "infra" / "tls")}
    config = _config(tmp_path, site, {**clean["execution"], "cluster": cluster, "batch_size": 1})
    root = tmp_path / f"{NAME}-corpus"
    env = {**_env(slurm), "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(ROOT),
           "PREFECT_WORKER_QUERY_SECONDS": "1"}
    deployed = subprocess.run([SCRIPT, "deploy", "--name", "rebuild"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stderr
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "vlcorpus"], cwd=ROOT, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ran = subprocess.run([str(BIN / "prefect"), "deployment", "run", "rebuild_corpus/rebuild", "-p",
                              f"config={config}", "-p", f"root={root}"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=300)
        assert ran.returncode == 0, ran.stderr
        run_id = re.search(r"UUID: ([0-9a-f-]{36})", ran.stdout).group(1)
        with get_client(sync_client=True) as client:
            while not list((root / "segments").rglob("*.parquet")):
                assert not ended(client.read_flow_run(run_id).state), (tmp_path / "worker.log").read_text()[-4000:]
                time.sleep(0.1)
        [job] = [line.split()[0] for line in queue(JOBS) if f"{NAME}-gpu" in line]
        script = subprocess.run(["scontrol", "write", "batch_script", job, "-"], env=env, capture_output=True,
                                text=True, check=True).stdout
        subprocess.run(["scancel", job], env=env, check=True)
        # The job's worker reaches the scheduler on lo's address, over TLS with the worker's
        # certificate of `make secrets`.
        tls = ROOT / "infra" / "tls"
        assert re.search(rf"dask_worker tls://127\.0\.0\.1:\d+ .*--interface lo --protocol tls:// "
                         rf"--tls-ca-file {tls}/ca\.pem --tls-cert {tls}/worker\.pem --tls-key {tls}/worker-key\.pem",
                         script), script
        with get_client(sync_client=True) as client:
            while not ended((run := client.read_flow_run(run_id)).state):
                time.sleep(1)
        assert run.state.is_completed(), (run.state, (tmp_path / "worker.log").read_text()[-4000:])
    finally:
        stop_group(worker)
    # Another GPU job ran the task again, with only what was left to do: the cancelled one's
    # SIGTERM stopped it mid-video, or let it finish the video in hand but not report back.
    others = "".join(p.read_text() for p in (root / "logs" / "slurm").glob(f"vlcorpus-{NAME}-gpu-*.err")
                     if not p.name.endswith(f"-{job}.err"))
    again = re.search(r"transcribe p\d+: 2 items, ([12]) done before, 0 failed before, ([01]) to do", others)
    assert again and int(again[1]) + int(again[2]) == 2, others[-3000:]
    # The same tables as the clean build's, but for the errors row of the stopped attempt (its
    # ffmpeg had SIGTERM too): internal, which the next job retried.
    built, want = tables(root), tables(clean["root"])
    stopped = [row for row in built["errors"] if row not in want["errors"]]
    assert [(row["stage"], row["kind"]) for row in stopped] in ([], [("transcribe", "internal")]), stopped
    assert all(row["message"].startswith("ffmpeg was stopped by ") for row in stopped), stopped
    assert {**built, "errors": [row for row in built["errors"] if row not in stopped]} == want
    assert not queue(JOBS)
    wait_gone()  # the workers of its jobs, which held Prefect's download slots, too


def test_a_partition_slurm_refuses_fails_the_build_at_once_in_its_words(slurm, site, tmp_path):
    config = _config(tmp_path, site, {"cluster": {**LIGHT, "cpu": {**LIGHT["cpu"], "partition": "nope"}}},
                     models=False)
    proc = _build(config, slurm)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert err.strip().splitlines() == ["SLURM refuses the cpu pool's jobs: invalid partition specified: nope"]
    assert not (tmp_path / f"{NAME}-corpus").exists()


def test_without_sbatch_the_build_fails_in_one_line(slurm, site, tmp_path):
    config = _config(tmp_path, site, {"cluster": LIGHT}, models=False)
    done = subprocess.run([SCRIPT, "build", config.name], cwd=tmp_path, capture_output=True, text=True,
                          env={**_env(slurm), "PATH": str(Path(sys.executable).parent)}, timeout=300)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("execution.cluster is slurm, but there is no sbatch on the PATH")
    assert not (tmp_path / f"{NAME}-corpus").exists()


def test_jobs_that_cannot_start_fail_the_build_with_their_last_words(slurm, site, tmp_path):
    config = _config(tmp_path, site, {"cluster": {**LIGHT, "python": "/nonexistent/python"}}, models=False)
    proc = _build(config, slurm)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    *progress, line = err.strip().splitlines()
    assert re.fullmatch(r"SLURM job \d+ of the cpu pool ended \(FAILED\) before its worker started: "
                        r".*/nonexistent/python: No such file or directory", line), err
    assert all(shown.startswith(("logs: ", "SLURM: ")) for shown in progress), err
    assert not queue(JOBS)
    assert not list((tmp_path / f"{NAME}-corpus").glob("videos/**/*.parquet"))


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_pending_job_shows_and_a_signal_leaves_no_job(slurm, site, tmp_path, signum, code):
    """A job that SLURM holds (here until an hour from now) is on the progress line with
    SLURM's reason, and the build stopped by a signal cancels it."""
    held = {**LIGHT, "cpu": {**LIGHT["cpu"], "extra_directives": ["--begin=now+3600"]}}
    proc = _build(_config(tmp_path, site, {"cluster": held}, models=False), slurm)
    shown = ""
    # squeue's first answer for a job just submitted can carry no reason yet (None); the line
    # changes when SLURM gives one.
    for line in proc.stderr:
        if line.startswith("SLURM: "):
            shown = line.strip()
            if "pending (" in shown:
                break
    assert shown == "SLURM: 1 CPU job pending (BeginTime)", shown
    assert queue(JOBS)
    proc.send_signal(signum)
    assert proc.wait(timeout=120) == code
    assert not queue(JOBS)
