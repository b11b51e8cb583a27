"""`vlcorpus check` on the starters of `vlcorpus init`, with what their comments ask for put
where a user puts it: for tests/cli/test_check.py, and for the container image's install
(tests/flows/test_image.py), which runs the same checks from a venv of its own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import conftest
from hubkit import cache_model, pinned_command, sha256

TSM_FILE = "TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth"
# What each starter names beside it (its comments say to put them there).
LISTS = {"apartment_tour": ("tours.txt", "https://www.youtube.com/watch?v=dQw4w9WgXcQ\n"),
         "spoken_moments": ("moments.csv", "url,start,end\nhttps://www.youtube.com/watch?v=dQw4w9WgXcQ,3,6\n")}


def vlcorpus(*args: str, env: dict[str, str] | None = None, python: str = sys.executable,
             pins: Mapping[str, str] = {}) -> subprocess.CompletedProcess:
    """``vlcorpus ARGS`` run by ``python``; with ``pins`` (file name -> sha256) taken for the
    published files' own."""
    launcher = pinned_command(pins, "pipeline.cli", python=python) if pins else (python, "-m", "pipeline.cli")
    return conftest.vlcorpus(*args, env=env, launcher=launcher)


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


def zero_state(build: Callable[[], object], prefix: str = "") -> dict:
    """A state dict of the model ``build`` makes, zeros: the right keys and shapes, quickly."""
    import torch

    with torch.device("meta"):
        model = build()
    return {prefix + k: torch.zeros(v.shape, dtype=v.dtype) for k, v in model.state_dict().items()}


@dataclass(frozen=True)
class Models:
    torch_home: Path
    hf_home: Path
    tsm: Path
    pins: dict[str, str]  # file name -> sha256 of the stand-ins in the torch cache


def put_models(folder: Path) -> Models:
    """The models the starters name, put where a user puts them: torchvision's weights in the
    torch cache, the Whisper model `small` in the Hugging Face cache (the tests' tiny.en under
    its name), a TSM checkpoint file; with the pins under which the stand-ins in the torch cache
    pass for the published files (``vlcorpus(..., pins=)``)."""
    import torch
    import torchvision
    from speech import tiny_model_path

    from pipeline.features.tsm import parse_settings, tsm_resnet50
    from pipeline.features.weights import cache_path

    torch_home = folder / "torch"
    pins = {}
    for weights, build in ((torchvision.models.ResNet34_Weights.DEFAULT, torchvision.models.resnet34),
                           (torchvision.models.ResNet152_Weights.DEFAULT, torchvision.models.resnet152),
                           (torchvision.models.video.S3D_Weights.DEFAULT, torchvision.models.video.s3d)):
        name = Path(cache_path(weights)).name
        path = torch_home / "hub" / "checkpoints" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(zero_state(build), path)
        pins[name] = sha256(path)
    hf_home = folder / "hf"
    cache_model(hf_home, "Systran/faster-whisper-small", tiny_model_path())
    tsm = folder / TSM_FILE
    state = zero_state(lambda: tsm_resnet50(parse_settings(TSM_FILE), 8), prefix="module.base_model.")
    torch.save({"state_dict": state}, tsm)
    return Models(torch_home, hf_home, tsm, pins)


def starter(style: str, folder: Path) -> Path:
    name = f"my_{style}"
    result = vlcorpus("init", name, "--style", style, "--out", str(folder))
    assert result.returncode == 0, result.stderr
    return folder / f"{name}.yaml"


def provide(style: str, config: Path, models: Models) -> None:
    """What the starter's comments ask for beside it: its list, the TSM checkpoint."""
    if style in LISTS:
        name, text = LISTS[style]
        (config.parent / name).write_text(text)
    if style == "spoken_moments":
        (config.parent / "models").mkdir()
        (config.parent / "models" / TSM_FILE).symlink_to(models.tsm)
