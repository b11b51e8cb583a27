"""The GPU layer (`make test-gpu`; skipped on a machine without CUDA). Its videos are made
in-process with PyAV's own encoders; the build below needs an ffmpeg binary all the same (its
download stage checks each file's end with one) and is skipped without one (docs/contributing.md
says what to carry to a GPU machine):
- the copy stream: the features of batches copied on their own stream and read one batch later
  are those of a CPU run of the same model;
- NVDEC's frames against the CPU decoder's, on the same untagged clips: a strict xfail until
  the NV12 path converts them as the CPU does (tests/stages/test_nvdec.py, marked gpu too,
  checks them on tagged video);
- `vlcorpus build` through the local cluster featurizing on the GPU worker, with resnet and s3d.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import SCRIPT, require_binaries, vlcorpus

torch = pytest.importorskip("torch")
av = pytest.importorskip("av")

pytestmark = pytest.mark.gpu


def write_video(path: Path, seconds: float = 4.0, fps: int = 10, size: tuple[int, int] = (320, 240),
                codec: str = "libx264") -> Path:
    """A moving colour pattern, untagged yuv420p, as most uploads are."""
    width, height = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        y, x = np.mgrid[0:height, 0:width]
        for i in range(int(seconds * fps)):
            rgb = np.stack([(x + 7 * i) % 256, (y + 3 * i) % 256, (x + y + 5 * i) % 256], axis=-1).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_the_copy_stream_gives_the_cpu_runs_features(tmp_path):
    from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig
    from pipeline.features import build_extractor

    ecfg = ExtractorConfig(name="resnet34", weights="none", fps=2, frames=4)
    frames = FramesConfig(short_side=128, crop=112)
    torch.manual_seed(0)
    gpu = build_extractor(ecfg, frames, FeaturesConfig(device="cuda", precision="fp32"))
    torch.manual_seed(0)
    cpu = build_extractor(ecfg, frames, FeaturesConfig(device="cpu"))
    assert gpu.copy_stream is not None
    rng = np.random.default_rng(0)
    batches = [[rng.integers(0, 256, (4, 144, 192, 3), dtype=np.uint8) for _ in range(n)] for n in (3, 2, 4)]
    looped = list(gpu.run_batches([gpu.prepare(c) for c in batch] for batch in batches))
    assert [len(got) for got in looped] == [3, 2, 4]
    for got, batch in zip(looped, batches):
        want = cpu.run([cpu.prepare(c) for c in batch])
        for g, w in zip(got, want):
            assert g.device.type == "cpu"
            torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2)


# A known defect, strict: the run goes red when NVDEC's frames come within the bound (then the
# mark goes) and when the path fails any other way than this bound; tests/stages/test_nvdec.py
# holds NVDEC to its frames on tagged video meanwhile.
@pytest.mark.xfail(reason="NVDEC's RGB output uses BT.709 for untagged video (7.9 levels off); "
                          "the NV12 path of pipeline/media/nv12.py is not wired in yet (issue 61)",
                   strict=True, raises=AssertionError)
def test_nvdec_frames_match_the_cpu_decoders(tmp_path):
    from pipeline.media import FrameRequest, FrameSpec, nvdec, sample_frames

    if nvdec.unavailable():
        pytest.skip(nvdec.unavailable())
    video = write_video(tmp_path / "v.mp4")
    requests = [FrameRequest(f"c{i}", float(i), float(i) + 1.0, FrameSpec(frames=4, short_side=240, crop=None))
                for i in range(3)]
    cpu = dict(sample_frames(str(video), requests))
    gpu = dict(nvdec.sample_frames_gpu(str(video), requests, torch.cuda.Stream()))
    for key, frames in cpu.items():
        diff = np.abs(gpu[key].cpu().numpy().astype(np.int16) - np.asarray(frames).astype(np.int16))
        assert diff.mean() <= 1.5, (key, diff.mean())


def test_a_build_featurizes_on_the_gpu_worker(tmp_path):
    require_binaries("ffmpeg")
    folder = tmp_path / "videos"
    folder.mkdir()
    for i in range(2):
        write_video(folder / f"v{i}.mp4")
        (folder / f"v{i}.en.vtt").write_text("WEBVTT\n\n00:00:00.500 --> 00:00:02.900\nA pattern moves.\n\n"
                                             "00:00:03.000 --> 00:00:03.900\nIt keeps moving.\n")
    config = tmp_path / "gpu.yaml"
    config.write_text(
        f"name: gpu\nroot: corpus\nsources: [{{type: folder, path: {folder}}}]\n"
        "transcribe: {prefer: [manual]}\nalign: {policy: subtitle_span, min_s: 0.5, max_s: 5.0}\n"
        "features:\n  extractors:\n    - {name: resnet34, weights: none, fps: 2}\n"
        "    - {name: s3d, weights: none, fps: 10, frames: 16}\n")
    done = vlcorpus("build", str(config), "--until", "featurize", "--json", timeout=900, cwd=tmp_path,
                    env={**os.environ, "PYTHONFAULTHANDLER": "1"}, launcher=(SCRIPT,))
    assert done.returncode == 0, done.stderr[-4000:]
    stages = json.loads(done.stdout.strip().splitlines()[-1])["stages"]
    for name in ("featurize:resnet34", "featurize:s3d"):
        assert stages[name]["ok"] >= 2 and stages[name]["workers"] == ["gpu-0"], stages[name]
