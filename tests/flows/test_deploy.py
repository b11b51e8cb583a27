"""`vlcorpus deploy` refuses, in one line and before contacting any server, a working directory
that workers could not run the deployments in; and, in one line, to register without a Prefect
server to keep the deployments."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT


def _deploy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # An API address nothing listens on: a check that passed would fail to connect instead.
    base = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "deploy", *args], cwd=ROOT,
                          env={**base, **(env or {})}, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_missing_working_directory_is_one_line_at_deploy_time(tmp_path, how):
    missing = tmp_path / "opt" / "vlcorpus"
    if how == "option":
        result = _deploy("--working-dir", str(missing))
    else:
        result = _deploy(env={"VLCORPUS_WORKING_DIR": str(missing)})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"vlcorpus deploy: working directory {missing} does not exist;")
    assert "--working-dir" in lines[0]


def test_a_working_directory_without_the_configs_is_refused(tmp_path):
    from flows.deploy import DeployError, deploy

    with pytest.raises(DeployError, match=r"^apartment-tour-weekly: config configs/apartment_tour.yaml "
                                          rf"not found in working directory {tmp_path};"):
        deploy(ROOT / "infra" / "prefect.yaml", tmp_path)


def test_an_unknown_entrypoint_is_refused(tmp_path):
    from flows.deploy import DeployError, deploy

    deployments = tmp_path / "deployments.yaml"
    deployments.write_text(yaml.safe_dump({"deployments": [{
        "name": "old-style", "entrypoint": "flows/build.py:rebuild_corpus",
        "parameters": {"config": "configs/demo.yaml"}, "work_pool": {"name": "vlcorpus"}}]}))
    with pytest.raises(DeployError, match="^old-style: unknown entrypoint flows/build.py:rebuild_corpus; "
                                          "use flows.build.rebuild_corpus"):
        deploy(deployments, ROOT)


@pytest.mark.parametrize("api", ["", "http://127.0.0.1:9/api"])
def test_without_a_prefect_server_deploy_refuses_in_one_line(api):
    """No PREFECT_API_URL (Prefect would register on a temporary server that stops with the
    command) or none answering: one line that says how to start one, exit 2."""
    result = _deploy(env={"PREFECT_API_URL": api})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vlcorpus deploy: no Prefect server")
    assert "prefect server start" in lines[0] and "ERROR" not in result.stderr
