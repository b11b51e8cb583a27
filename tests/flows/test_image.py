"""The container image (infra/docker/Dockerfile) installs what every role runs, from the lock.

One image serves every role: the Prefect server and worker (whose flow process trains, scores
and reports), CPU Dask workers (download, ASR, align, shard) and GPU workers (featurize). A venv
of exactly the image's packages (its Python, its extras, the lock's export) runs `vlcorpus check`
clean on every starter, whose stages together are every role's, and has every command that a
container of compose or Kubernetes runs; its torch is a CUDA build. What no test can run here
(docker build needs an engine) is read from the Dockerfile against the lock."""

from __future__ import annotations

import itertools
import os
import platform
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from checkkit import listing, provide, put_models, starter, vlcorpus
from conftest import ROOT
from hubkit import hub_env, unreachable_hub
from infrakit import PREFECT_VALUES, container_commands, dask_pods, documents
from venvkit import linked_venv, locked_packages

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


def image_packages() -> dict[str, str]:
    """What the image's install brings on this machine's platform and Python (name -> version)."""
    return locked_packages(extras(install_args()))


@pytest.fixture(scope="module")
def image_env(tmp_path_factory) -> tuple[str, set[str]]:
    """The venv of exactly the image's packages (made once a session), with their commands in
    its bin/: its python and the packages the suite's venv lacks."""
    return linked_venv(tmp_path_factory, image_packages())


# What the image has and this suite's venv cannot: torch's CUDA libraries (its torch is the CPU
# wheel of the same version) and the `gpu` extra, which `make venv` leaves out. None is imported
# by a check on a machine without a GPU.
CUDA_ONLY = re.compile(r"^(nvidia-.*|cuda-.*|triton|pynvvideocodec)$")


@pytest.mark.slow
def test_the_image_packages_check_every_role_clean(image_env, tmp_path_factory):
    """`vlcorpus check` on every starter, in a venv of exactly the image's packages: a module a
    role imports that only the suite's extras (dev, demo, test) bring fails here. The packages
    are linked from the suite's venv, not installed: installing the image's set (6 GB with
    CUDA) took 10 of the suite's 25 minutes, and added to this only the CUDA build of torch,
    whose lock entry the test above reads."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" != base_python():
        pytest.skip(f"the image runs Python {base_python()}, this suite {platform.python_version()}")
    python, missing = image_env
    assert all(CUDA_ONLY.match(name) for name in missing), sorted(missing)

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


# A command's subcommands: the words before its first option or address.
SUBCOMMAND = re.compile(r"^[a-z][a-z-]*$")


@pytest.mark.slow
def test_every_container_command_runs_in_the_image(image_env):
    """The first word of every command a container of the image runs (compose's, Kubernetes',
    the image's default) is a command of the image's packages; its subcommand answers --help
    there, and that help names every option the container passes. (distributed 2026.6 and later
    installs no `dask-scheduler` or `dask-worker`, which the Dask Helm chart ran.)"""
    bin_dir = Path(image_env[0]).parent
    helps: dict[tuple[str, ...], str] = {}
    commands = container_commands()
    assert {where.split()[0] for where, _ in commands} == {"compose", "dask", "prefect-worker", "Dockerfile"}
    for where, argv in commands:
        assert (bin_dir / argv[0]).is_file(), (where, argv)
        words = (argv[0], *itertools.takewhile(SUBCOMMAND.match, argv[1:]))
        if words not in helps:
            shown = subprocess.run([str(bin_dir / argv[0]), *words[1:], "--help"], capture_output=True, text=True,
                                   timeout=120, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
            assert shown.returncode == 0, (where, shown.stderr[-500:])
            helps[words] = shown.stdout
        for option in argv:
            if option.startswith("--"):
                assert re.search(rf"{re.escape(option)}(?![\w-])", helps[words]), (where, option)


def test_compose_and_kubernetes_run_the_one_image():
    """Compose builds the image as `vlcorpus:latest`; every Kubernetes pod runs it from one
    registry reference, tagged with the project's version, whose pull policy takes a copy that
    a node already holds."""
    (compose,) = documents(ROOT / "infra" / "docker-compose.yaml")
    built = {s["image"] for s in compose["services"].values() if s["image"].startswith("vlcorpus")}
    assert built == {"vlcorpus:latest"}
    assert compose["services"]["prefect-server"]["build"] == {"context": "..", "dockerfile": "infra/docker/Dockerfile"}
    containers = [c for spec in dask_pods().values() for c in spec["containers"]]
    (values,) = documents(PREFECT_VALUES)
    chart = values["worker"]["image"]
    containers += [{"image": f"{chart['repository']}:{chart['prefectTag']}", "imagePullPolicy": chart["pullPolicy"]},
                   *values["worker"]["initContainer"]["extraContainers"]]
    (image,) = {c["image"] for c in containers}
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    registry, _, name = image.rpartition("/")
    assert "." in registry.split("/")[0] and name == f"vlcorpus:{version}", image
    assert {c["imagePullPolicy"] for c in containers} == {"IfNotPresent"}
