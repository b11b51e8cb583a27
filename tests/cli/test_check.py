"""`vlcorpus check CONFIG`: what a build checks before any work and what it would do, without a
build and without writing. Every starter of `vlcorpus init` passes once what it names is there
(its list file, its models in the caches a user fills), and as written it says what is missing,
one line each, without waiting on a Hub it cannot reach; a model a build would download on
first use is a warning, and `check` downloads nothing."""

from __future__ import annotations

import json
import os
from urllib.parse import urlparse

import pytest
from conftest import moto_s3

import stagekit
from checkkit import LISTS, TSM_FILE, Models, listing, provide, put_models, starter, vlcorpus
from hubkit import hub_env, stand_in_hub, unreachable_hub
from pipeline.starter import STYLES
from pipeline.corpus.storage import Corpus


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    return put_models(tmp_path_factory.mktemp("models"))


@pytest.mark.slow
@pytest.mark.parametrize("style", list(STYLES))
def test_every_starter_passes_once_what_it_names_is_there(tmp_path, models, style):
    config = starter(style, tmp_path / "configs")
    provide(style, config, models)
    before = listing(tmp_path), listing(models.hf_home), listing(models.torch_home)
    with unreachable_hub() as hub:
        env = hub_env(models.hf_home, hub, TORCH_HOME=str(models.torch_home))
        result = vlcorpus("check", str(config), env=env, pins=models.pins)
        assert hub.connections == 0
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == f"a build could start: vlcorpus build {config}"
    assert f"root: {tmp_path / 'configs' / 'corpora' / config.stem}" in lines  # beside the config
    assert [line.split()[0] for line in lines[3:-2]] == ["discover", "download", "transcribe", "align",
                                                         "featurize", "shard", "train", "score", "report"]
    assert "warning" not in result.stdout and not result.stderr.strip()
    # Nothing written: no root, no logs, nothing in the caches.
    assert (listing(tmp_path), listing(models.hf_home), listing(models.torch_home)) == before


@pytest.mark.slow
@pytest.mark.parametrize("offline", [False, True], ids=["hub unreachable", "VLCORPUS_OFFLINE"])
def test_a_starter_as_written_says_what_is_missing_without_the_network(tmp_path, models, offline):
    """Empty caches and a Hub that cannot be reached (or downloads off): one line per missing
    model, at once (offline, the Whisper model's refusal took 19 s of connection retries)."""
    config = starter("spoken_moments", tmp_path)
    empty = tmp_path / "empty"
    with unreachable_hub() as hub:
        switch = {"VLCORPUS_OFFLINE": "1"} if offline else {}
        env = hub_env(empty / "hf", hub, TORCH_HOME=str(empty / "torch"), **switch)
        result = vlcorpus("check", str(config), env=env)
        # Offline, none; else one probe, after which the hub is known to be down.
        assert hub.connections == (0 if offline else 1)
    assert result.returncode == 2
    whisper, resnet, tsm = result.stderr.strip().splitlines()
    why = ("it cannot be downloaded here: VLCORPUS_OFFLINE=1 turns model downloads off" if offline
           else f"it cannot be downloaded: {hub.url} cannot be reached")
    assert whisper.startswith("faster-whisper model 'small' is neither a local directory nor in the local "
                              f"Hugging Face cache ({empty / 'hf' / 'hub'}), and {why}")
    assert "`hf download Systran/faster-whisper-small`" in whisper
    assert resnet.startswith(f"resnet152: ResNet152_Weights.IMAGENET1K_V2 is not in the local cache: {empty / 'torch'}")
    assert why in resnet and "`vlcorpus fetch-models CONFIG`" in resnet
    assert tsm.startswith(f"tsm_r50: weight file {tmp_path / 'models' / TSM_FILE} does not exist")
    assert f"warning: sources[0] (moments): {tmp_path / 'moments.csv'} does not exist" in result.stdout
    assert not (tmp_path / "corpora").exists() and not empty.exists()


@pytest.mark.slow
def test_a_model_a_build_would_download_is_a_warning_and_nothing_is_downloaded(tmp_path, models):
    """With the hubs reachable, models missing from the caches do not stop a build (it downloads
    them on first use): `check` says so, asks each hub whether it has them, and fetches nothing."""
    import torchvision

    from speech import tiny_model_path

    config = starter("spoken_moments", tmp_path)
    provide("spoken_moments", config, models)
    (tmp_path / "moments.csv").write_text(LISTS["spoken_moments"][1])
    resnet = urlparse(torchvision.models.ResNet152_Weights.DEFAULT.url).path
    empty = tmp_path / "empty"
    with stand_in_hub({"Systran/faster-whisper-small": tiny_model_path()}, {resnet: models.tsm}) as hub:
        result = vlcorpus("check", str(config), env=hub_env(empty / "hf", hub, TORCH_HOME=str(empty / "torch")))
        assert set(hub.requests) == {"GET /api/models/Systran/faster-whisper-small/revision/main", f"HEAD {resnet}"}
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: transcribe.asr.model: Hugging Face model 'Systran/faster-whisper-small' is not in the local cache "
        f"({empty / 'hf' / 'hub'}): a build downloads it there from {hub.url}/Systran/faster-whisper-small on first "
        f"use, once per machine; for workers without internet, `vlcorpus fetch-models CONFIG` fetches every model "
        f"a config needs",
        f"warning: resnet152: ResNet152_Weights.IMAGENET1K_V2 is not in the local cache "
        f"({empty / 'torch' / 'hub' / 'checkpoints'}): a build downloads it there from {hub.url}{resnet} on first "
        f"use, once per machine; for workers without internet, `vlcorpus fetch-models CONFIG` fetches every model "
        f"a config needs",
    ]
    assert result.stdout.splitlines()[-1] == f"a build could start: vlcorpus build {config}"
    assert not empty.exists()


SUBTITLES_ONLY = "sources:\n  - type: urls\n    urls: [http://127.0.0.1:9/x]\ntranscribe:\n  prefer: [manual, auto]\n"


def test_an_existing_root_says_what_is_left_and_stays_as_it_was(tmp_path):
    root = tmp_path / "corpus"
    stagekit.make_videos(Corpus(str(root)), 10, partitions=2)
    config = tmp_path / "c.yaml"
    config.write_text(f"name: c\nroot: corpus\n{SUBTITLES_ONLY}")
    before = listing(tmp_path)
    result = vlcorpus("check", str(config), "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert (plan["root"], plan["ready"], plan["problems"]) == (str(root), True, [])
    assert plan["partitions"] == {"count": 2, "from": "ROOT/_corpus.json"}
    stages = {s["name"]: s for s in plan["stages"]}
    assert list(stages) == ["discover", "download", "transcribe", "align", "featurize", "shard", "train",
                            "score", "report"]
    assert stages["download"]["todo"]["download"] == {"table": "downloads", "upstream": 10, "done": 0,
                                                      "failed": {}, "final": 0, "todo": 10}
    assert stages["discover"]["todo"] is None and stages["transcribe"]["settings"] == {"prefer": "manual > auto"}
    assert stages["train"]["skipped"] == "no train section"
    assert listing(tmp_path) == before
    # A partition count other than the root's: the build's own refusal.
    config.write_text(config.read_text() + "execution:\n  partitions: 4\n")
    result = vlcorpus("check", str(config))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"{root} has 2 partitions and the config asks for 4: set "
                                     f"execution.partitions to 2 (or leave it unset), or build into a new root")


def test_a_root_that_cannot_be_created_is_one_line(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"name: c\n{SUBTITLES_ONLY}")
    (tmp_path / "taken").write_text("a file where the root's parent would be")
    result = vlcorpus("check", str(config), "--root", str(tmp_path / "taken" / "corpus"))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"corpus root {tmp_path / 'taken' / 'corpus'} cannot be created: "
                                     f"{tmp_path / 'taken'} is a file")
    # No root anywhere: the build's message; $VLCORPUS_ROOT/<name> is one.
    result = vlcorpus("check", str(config), env={**os.environ, "VLCORPUS_ROOT": ""})
    assert result.returncode == 2 and "config 'c' has no corpus root" in result.stderr
    result = vlcorpus("check", str(config), env={**os.environ, "VLCORPUS_ROOT": str(tmp_path / "all")})
    assert result.returncode == 0, result.stderr
    assert f"root: {tmp_path / 'all' / 'c'}" in result.stdout.splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "taken"]


@pytest.mark.slow
def test_a_config_error_is_the_builds(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(f"name: bad\nroot: r\n{SUBTITLES_ONLY}download:\n  formt: best\n")
    checked, built = vlcorpus("check", str(config)), vlcorpus("build", str(config))
    assert checked.returncode == built.returncode == 2
    assert "download.formt: unknown key" in checked.stderr and checked.stderr == built.stderr


def test_an_s3_root_is_listed_not_written(tmp_path):
    with moto_s3() as endpoint:
        import s3fs

        env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
               "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="test", secret="test")
        fs.mkdir("corpora")
        config = tmp_path / "c.yaml"
        config.write_text(f"name: c\n{SUBTITLES_ONLY}")
        result = vlcorpus("check", str(config), "--root", "s3://corpora/c", env=env)
        assert result.returncode == 0, result.stderr
        fs.invalidate_cache()
        assert fs.ls("corpora") == []
        result = vlcorpus("check", str(config), "--root", "s3://no-such-bucket/c", env=env)
        assert result.returncode == 2
        assert result.stderr.strip().startswith("corpus root s3://no-such-bucket/c is not reachable: ")
