"""The container image (infra/docker/Dockerfile) installs what every role runs, from the lock.

One image serves every role: the Prefect server and worker (whose flow process trains, scores
and reports), CPU Dask workers (download, ASR, align, shard) and GPU workers (featurize). A venv
of exactly the image's packages (its Python, its extras, the lock's export) runs `vlcorpus check`
clean on every starter, whose stages together are every role's; its torch is a CUDA build. What no
test can run here (docker build needs an engine) is read from the Dockerfile against the lock."""

from __future__ import annotations

import platform
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from checkkit import listing, provide, put_models, starter, vlcorpus
from conftest import ROOT, locked_pins
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


def image_packages() -> dict[str, str]:
    """What the image's install brings on this machine's platform and Python (name -> version):
    the lock's export for the image's extras, the set pip resolves from its constraints."""
    export = subprocess.run([str(ROOT / ".venv" / "bin" / "uv"), "export", "--quiet", "--frozen",
                             "--no-emit-project", "--no-hashes", "--no-annotate", "--format", "requirements.txt",
                             *[f"--extra={e}" for e in extras(install_args())]],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    return locked_pins(export)


def image_venv(folder: Path, packages: dict[str, str]) -> tuple[str, set[str]]:
    """A venv holding only the image's packages, as this suite's venv installed them (the same
    lock), linked rather than installed; its python and the packages the suite's venv lacks."""
    from importlib.metadata import distributions

    from packaging.utils import canonicalize_name

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    (target,) = folder.glob("lib/python*/site-packages")
    wanted = {**packages, "vlcorpus": None}
    found: dict[str, str] = {}
    for dist in distributions(path=[p for p in sys.path if p.endswith("site-packages")]):
        name = canonicalize_name(dist.metadata["Name"])
        if name not in wanted or name in found:
            continue
        found[name] = dist.version
        for top in {f.parts[0] for f in dist.files or () if f.parts[0] != ".."}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (target / top).exists():
                (target / top).symlink_to(source)
    assert all(found[n] == v for n, v in packages.items() if n in found), "the suite's venv is not the lock's"
    return str(folder / "bin" / "python"), set(packages) - set(found)


# What the image has and this suite's venv cannot: torch's CUDA libraries (its torch is the CPU
# wheel of the same version) and the `gpu` extra, which `make venv` leaves out. None is imported
# by a check on a machine without a GPU.
CUDA_ONLY = re.compile(r"^(nvidia-.*|cuda-.*|triton|pynvvideocodec)$")


@pytest.mark.slow
def test_the_image_packages_check_every_role_clean(tmp_path_factory):
    """`vlcorpus check` on every starter, in a venv of exactly the image's packages: a module a
    role imports that only the suite's extras (dev, demo, test) bring fails here. The packages
    are linked from the suite's venv, not installed: installing the image's set (6 GB with
    CUDA) took 10 of the suite's 25 minutes, and added to this only the CUDA build of torch,
    whose lock entry the test above reads."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" != base_python():
        pytest.skip(f"the image runs Python {base_python()}, this suite {platform.python_version()}")
    python, missing = image_venv(tmp_path_factory.mktemp("image") / "venv", image_packages())
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


def test_compose_and_kubernetes_run_the_one_image():
    text = "\n".join((ROOT / "infra" / p).read_text() for p in
                     ("docker-compose.yaml", "k8s/dask-values.yaml", "k8s/prefect-worker.yaml"))
    images = set(re.findall(r"image: (vlcorpus\S*)", text)) | set(re.findall(r"repository: (vlcorpus\S*?),", text))
    assert images == {"vlcorpus:latest", "vlcorpus"}
    assert "dockerfile: infra/docker/Dockerfile}" in text and "Dockerfile." not in text
