"""The container image (infra/docker/Dockerfile) installs what every role runs, from the lock.

One image serves every role: the Prefect server and worker (whose flow process trains, scores
and reports), CPU Dask workers (download, ASR, align, shard) and GPU workers (featurize). A venv
installed as the image installs (its Python, its extras, the lock's export) runs `vlcorpus check`
clean on every starter, whose stages together are every role's; its torch is a CUDA build. What no
test can run here (docker build needs an engine) is read from the Dockerfile against the lock."""

from __future__ import annotations

import platform
import re
import shlex
import subprocess
import sys
import tomllib

import pytest
from checkkit import listing, provide, put_models, starter, vlcorpus
from conftest import ROOT
from hubkit import hub_env, unreachable_hub

from pipeline.starter import STYLES

DOCKERFILE = ROOT / "infra" / "docker" / "Dockerfile"
TESTED_PYTHONS = ("3.11", "3.12")  # the suite's, and make test-py312's (docs/getting-started.md)


def base_python() -> str:
    """The Python of the image's base (python:X.Y-...)."""
    (base,) = re.findall(r"^FROM python:(\d+\.\d+)-", DOCKERFILE.read_text(), flags=re.M)
    return base


def install_args() -> list[str]:
    """The arguments of the image's one `pip install`."""
    (line,) = re.findall(r"^RUN pip install (.+)$", DOCKERFILE.read_text(), flags=re.M)
    return shlex.split(line)


def extras(args: list[str]) -> list[str]:
    (project,) = [a for a in args if a.startswith(".[")]
    return project[2:-1].split(",")


def test_the_image_installs_the_lock_on_a_tested_python():
    args = install_args()
    assert base_python() in TESTED_PYTHONS
    # The lock's export, copied in before the install; no other index that could swap a build.
    assert args[args.index("-c") + 1] == "constraints.txt"
    assert re.search(r"^COPY .*\bconstraints\.txt\b", DOCKERFILE.read_text(), flags=re.M)
    assert not any("index-url" in a or "find-links" in a for a in args)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras(args)) <= set(declared)
    # Every role's packages: torch for featurize and train, the ASR backends, NVML, S3.
    assert {"all", "gpu", "s3"} <= set(extras(args))


def test_the_locked_torch_for_x86_64_is_a_cuda_build():
    """PyPI's torch for Linux x86_64 brings CUDA's libraries as packages of its own; a CPU build
    would not (it would come from another index, which the image does not name)."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (torch,) = [p for p in lock["package"] if p["name"] == "torch"]
    cuda = [d for d in torch["dependencies"] if d["name"].startswith("nvidia-cu")]
    assert cuda and all("x86_64" in d.get("marker", "x86_64") for d in cuda)
    assert torch["source"] == {"registry": "https://pypi.org/simple"}


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the CUDA check needs PyPI's x86_64 torch")
# The install alone may take up to its own timeout (1200 s) on a busy machine: beside three
# other test processes, install and checks together passed the suite's 600 s.
@pytest.mark.timeout(1800)
def test_a_venv_installed_as_the_image_checks_every_role_clean(tmp_path_factory):
    if f"{sys.version_info.major}.{sys.version_info.minor}" != base_python():
        pytest.skip(f"the image runs Python {base_python()}, this suite {platform.python_version()}")
    venv = tmp_path_factory.mktemp("image") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    # As the image runs it, in the repository as the image holds it; --no-compile and the
    # download cache only make it quicker, and install the same files.
    args = [a for a in install_args() if a != "--no-cache-dir"]
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-compile", *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=1200)
    assert install.returncode == 0, install.stderr[-3000:]
    cuda = subprocess.run([python, "-c", "import torch; print(torch.version.cuda)"], capture_output=True,
                          text=True, timeout=120)
    assert cuda.returncode == 0 and cuda.stdout.strip() not in ("", "None"), cuda.stdout + cuda.stderr

    models = put_models(tmp_path_factory.mktemp("models"))
    for style in STYLES:
        folder = tmp_path_factory.mktemp(style)
        config = starter(style, folder / "configs")
        provide(style, config, models)
        before = listing(folder)
        with unreachable_hub() as hub:
            env = hub_env(models.hf_home, hub, TORCH_HOME=str(models.torch_home))
            result = vlcorpus("check", str(config), env=env, python=python, pins=models.pins)
        assert result.returncode == 0, (style, result.stderr)
        assert result.stdout.splitlines()[-1] == f"a build could start: vlcorpus build {config}"
        assert not result.stderr.strip() and listing(folder) == before


def test_compose_and_kubernetes_run_the_one_image():
    text = "\n".join((ROOT / "infra" / p).read_text() for p in
                     ("docker-compose.yaml", "k8s/dask-values.yaml", "k8s/prefect-worker.yaml"))
    images = set(re.findall(r"image: (vlcorpus\S*)", text)) | set(re.findall(r"repository: (vlcorpus\S*?),", text))
    assert images == {"vlcorpus:latest", "vlcorpus"}
    assert "dockerfile: infra/docker/Dockerfile}" in text and "Dockerfile." not in text
