"""infra/: the files parse and name things that exist; `vlcorpus deploy` registers the
deployments; a served deployment triggered through the Prefect API builds a corpus."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from conftest import ROOT, vlcorpus
from infrakit import INFRA, documents

# Commands the containers run (tests/flows/test_image.py runs each in the image's packages).
COMMANDS = {"dask", "prefect", "vlcorpus"}


def _entrypoint(spec: str):
    module_path, _, name = spec.rpartition(".")
    return getattr(importlib.import_module(module_path), name)


def test_prefect_yaml_deployments_point_at_real_flows_and_configs():
    (spec,) = documents(INFRA / "prefect.yaml")
    names, scheduled = set(), 0
    for deployment in spec["deployments"]:
        flow = _entrypoint(deployment["entrypoint"])
        assert flow.name == "rebuild_corpus"
        parameters = deployment.get("parameters") or {}
        assert set(parameters) <= {"config", "root", "until", "dask_address", "retry_failed"}
        if deployment.get("schedules"):  # a scheduled run has no one to give it a config
            scheduled += 1
            assert (ROOT / parameters["config"]).exists()
            # nor to start it again when its machine dies
            assert 0 <= deployment["rerun_crashed_after_s"] <= 300
        for schedule in deployment.get("schedules", []):
            assert len(schedule["cron"].split()) == 5
        names.add(deployment["name"])
    assert "rebuild" in names and len(names) == 4 and scheduled == 3
    # infra/README.md shows the liveness section as shipped
    readme = (INFRA / "README.md").read_text()
    shown = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", readme, re.S)]
    assert {"liveness": spec["liveness"]} in shown


def test_the_dockerfile_copies_what_exists_and_runs_dask():
    lines = (INFRA / "docker" / "Dockerfile").read_text().splitlines()
    sources = [source for line in lines if line.startswith("COPY ") for source in line.split()[1:-1]]
    assert {"pipeline", "flows", "pyproject.toml"} <= set(sources)
    assert [source for source in sources if not (ROOT / source).exists()] == []
    (cmd,) = [line for line in lines if line.startswith("CMD ")]
    assert yaml.safe_load(cmd[4:])[0] in COMMANDS


@pytest.mark.slow
def test_deploy_registers_every_deployment(prefect_server, tmp_path):
    """The shipped deployments once their lists are beside their configs and VLCORPUS_ROOT names
    where corpora live: all four register, each scheduled one with its root as a parameter."""
    import shutil

    from prefect.client.orchestration import get_client

    workdir = tmp_path / "checkout"
    shutil.copytree(ROOT / "configs", workdir / "configs")
    (workdir / "configs" / "spoken_moments.csv").write_text("url,start,end\n")
    (workdir / "configs" / "HowTo100M_v1.csv").write_text("video_id\n")
    deploy = ("deploy", "--working-dir", str(workdir))
    env = {**os.environ, "VLCORPUS_ROOT": "s3://corpora/nightly"}
    result = vlcorpus(*deploy, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    with get_client(sync_client=True) as client:
        # Defaults (null limit and sort) are what broke with FastAPI 0.151 (pyproject.toml).
        deployments = {d.name: d for d in client.read_deployments()}
        pool = client.read_work_pool("vlcorpus")
    assert set(deployments) == {"apartment-tour-weekly", "spoken-moments-weekly",
                                "howto100m-monthly", "rebuild"}
    assert pool.type == "process"
    weekly = deployments["apartment-tour-weekly"]
    assert weekly.parameters == {"config": "configs/apartment_tour.yaml",
                                 "root": "s3://corpora/nightly/apartment_tour"}
    assert weekly.schedules[0].schedule.cron == "0 3 * * 1"
    assert weekly.entrypoint == "flows.build.rebuild_corpus"
    assert weekly.job_variables == {"working_dir": str(workdir), "env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}
    assert weekly.tags == ["vlcorpus-heartbeats"]  # its runs are watched from their start
    assert deployments["rebuild"].parameters == {}  # config comes with each run
    again = vlcorpus(*deploy, cwd=ROOT, env=env)
    assert again.returncode == 0  # idempotent: updates in place
    with get_client(sync_client=True) as client:
        automations = sorted((a.name, _window(a.trigger)) for a in client.read_automations())
    # A silent run is Crashed after 90 s, and each scheduled deployment runs a Crashed run again,
    # once in the hour after its crash (flows/once.py).
    assert automations == [("vlcorpus-crashed-when-silent", 90), *(
        (f"vlcorpus-rerun-crashed {name}", 3600) for name in
        ["apartment-tour-weekly", "howto100m-monthly", "spoken-moments-weekly"])]


def _window(trigger) -> float:
    """A trigger's window in seconds; a compound trigger's triggers share one."""
    (window,) = {t.within.total_seconds() for t in getattr(trigger, "triggers", [trigger])}
    return window


SERVE = """
from flows.build import rebuild_corpus
rebuild_corpus.serve(name="served-test")
"""


@pytest.mark.slow
def test_served_deployment_triggered_through_the_api(prefect_server, demo_corpus, tmp_path):
    from prefect.deployments import run_deployment

    from pipeline.demo import serve_demo
    from pipeline.corpus.storage import Corpus

    _, site = demo_corpus
    server = subprocess.Popen([sys.executable, "-c", SERVE], cwd=ROOT)
    try:
        with serve_demo(site) as base:
            (tmp_path / "urls.txt").write_text(f"{base}pages/tour-0.html\n")
            config = tmp_path / "served.yaml"
            config.write_text(yaml.safe_dump({
                "name": "served", "sources": [{"type": "list", "path": str(tmp_path / "urls.txt")}],
                "execution": {"n_workers": 1}}))
            deadline = time.monotonic() + 120
            while True:
                try:
                    run = run_deployment("rebuild_corpus/served-test", timeout=300,
                                         parameters={"config": str(config),
                                                     "root": str(tmp_path / "corpus"),
                                                     "until": "download"})
                    break
                except Exception:  # noqa: BLE001 - the deployment is not registered yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
        assert run.state.is_completed(), run.state
        assert Corpus(str(tmp_path / "corpus")).done("downloads")
    finally:
        server.terminate()
        server.wait(timeout=60)
