"""Decoding on the GPU (media.nvdec), as far as a machine without one can tell: where frames are
decoded for each features.decode, the one log line of auto's fallback, the setup error of an
nvdec that cannot be had, and the GPU path's image steps (resize, crop, turn) run on CPU tensors
against the CPU path. The decode itself, NVDEC's frames against the CPU path's, is in the GPU
layer (marked gpu: make test-gpu) and bench/featurize.py."""

# ruff: noqa: E402
from __future__ import annotations

import logging

import av
import numpy as np
import pytest

# The NVDEC path hands frames over as torch tensors; the Python 3.12 run (make test-py312) has no
# torch: skipped there, so the imports below come after this line.
torch = pytest.importorskip("torch")

from pipeline.featurize import stage as featurize
from pipeline.config import parse_config
from pipeline.errors import SetupError
from pipeline.media import FrameRequest, FrameSpec, frame_times, nvdec, sample_frames
from pipeline.media.frames import Collector
from pipeline.setup import stage_problems

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")


@pytest.fixture(autouse=True)
def fresh_choice():
    nvdec.say_once.cache_clear()
    yield
    nvdec.say_once.cache_clear()


def test_cpu_is_never_nvdec_and_auto_says_once_why_not(caplog):
    cpu = torch.device("cpu")
    assert nvdec.use_nvdec("cpu", cpu) is False
    with caplog.at_level(logging.INFO, logger="vlcorpus"):
        assert nvdec.use_nvdec("auto", cpu) is False
        assert nvdec.use_nvdec("auto", cpu) is False
    lines = [r.getMessage() for r in caplog.records if "decoding frames on the CPU" in r.getMessage()]
    assert lines == ["decoding frames on the CPU (features.decode auto): the features run on the CPU"]


@NO_GPU
def test_auto_on_a_gpu_without_nvdec_falls_back_with_the_reason(caplog):
    # What a GPU worker without PyNvVideoCodec (or its driver libraries) says; here the reason
    # is the missing GPU itself, found the same way.
    reason = nvdec.unavailable()
    assert reason == "torch sees no CUDA device"
    with caplog.at_level(logging.INFO, logger="vlcorpus"):
        assert nvdec.use_nvdec("auto", torch.device("cuda")) is False
    assert [r.getMessage() for r in caplog.records] == [
        f"decoding frames on the CPU (features.decode auto): {reason}"]


def test_auto_keeps_to_the_cpu_where_nvdec_is_there_and_says_why(monkeypatch, caplog):
    """On a GPU worker with NVDEC (as unavailable() finds it there), auto still decodes on the
    CPU, the faster on every machine measured; nvdec takes NVDEC."""
    monkeypatch.setattr(nvdec, "unavailable", lambda: None)
    gpu = torch.device("cuda")
    assert nvdec.use_nvdec("nvdec", gpu) is True
    with caplog.at_level(logging.INFO, logger="vlcorpus"):
        assert nvdec.use_nvdec("auto", gpu) is False
    assert [r.getMessage() for r in caplog.records] == [
        f"decoding frames on the CPU (features.decode auto): {nvdec.AUTO_ON_CPU}"]


@NO_GPU
def test_nvdec_asked_for_but_missing_is_a_setup_problem():
    with pytest.raises(SetupError, match="features.decode is 'nvdec' but the features run on the CPU"):
        nvdec.use_nvdec("nvdec", torch.device("cpu"))
    with pytest.raises(SetupError, match="features.decode is 'nvdec' but torch sees no CUDA device"):
        nvdec.use_nvdec("nvdec", torch.device("cuda"))
    base = {"name": "t", "sources": [{"type": "urls", "urls": ["http://x/"]}]}
    visual = {"extractors": [{"name": "resnet34", "weights": "none"}], "device": "cpu"}
    cfg = parse_config({**base, "features": {**visual, "decode": "nvdec"}})
    assert stage_problems(cfg, featurize.stages(cfg)) == (
        ["features.decode is 'nvdec' but the features run on the CPU"], [])
    cfg = parse_config({**base, "features": {**visual, "decode": "auto"}})
    assert stage_problems(cfg, featurize.stages(cfg)) == ([], [])


def _encode(path: str, filters: list[tuple[str, str]], pix_fmt: str, **options: str) -> str:
    """A 25 fps H.264 video of FFmpeg's source ``filters`` (a chain), made with PyAV: the GPU
    machines have no ffmpeg binary."""
    graph = av.filter.Graph()
    nodes = [graph.add(name, args) for name, args in filters] + [graph.add("buffersink")]
    for a, b in zip(nodes, nodes[1:]):
        a.link_to(b)
    graph.configure()
    frames = []
    while True:
        try:
            frames.append(graph.pull().reformat(format=pix_fmt))
        except (av.error.EOFError, av.error.BlockingIOError):
            break
    with av.open(path, "w") as out:
        stream = out.add_stream("libx264", rate=25, options={"g": "50", "bf": "2", **options})
        stream.pix_fmt, stream.width, stream.height = pix_fmt, frames[0].width, frames[0].height
        for frame in frames:
            frame.pict_type = av.video.frame.PictureType.NONE  # the source marks each a keyframe
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return path


@pytest.fixture(scope="module")
def moving(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("nvdec") / "moving.mp4")
    return _encode(path, [("testsrc2", "size=320x180:rate=25:duration=8")], "yuv444p")


def test_the_gpu_paths_image_steps_match_the_cpu_path(moving):
    """Full-size RGB frames (what NVDEC hands over) through the GPU path's resize, crop and
    stacking, here on CPU tensors: the same frames as sample_frames for every time, the
    pixels within resampling noise of swscale's. The video is 4:4:4, so this measures the
    resize; 4:2:0 chroma, which swscale rebuilds while it scales, differs more on this
    pattern's sharp colour edges (mean 1.3-3 levels), and NVDEC's own RGB conversion is
    measured against the CPU on a GPU machine (bench/featurize.py's check)."""
    specs = [FrameSpec(fps=2), FrameSpec(frames=8, short_side=128, crop=112),
             FrameSpec(fps=5, short_side=90, crop=None)]
    requests = [FrameRequest(f"c{i}|{j}", start, start + 3.0, spec)
                for i, start in enumerate([0.2, 1.7, 4.9]) for j, spec in enumerate(specs)]
    expected = dict(sample_frames(moving, requests))
    collector: Collector[torch.Tensor] = Collector(requests, nvdec._GpuImages(turns=0))
    got = {}
    with av.open(moving) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            rgb = torch.from_numpy(frame.to_ndarray(format="rgb24"))
            got.update(collector.add(frame.pts * float(stream.time_base), rgb))
    got.update(collector.finish())
    assert set(got) == set(expected)
    for request in requests:
        ours, theirs = got[request.key].numpy().astype(int), expected[request.key].astype(int)
        assert ours.shape == theirs.shape == (len(frame_times(request)), *theirs.shape[1:])
        error = np.abs(ours - theirs)
        assert error.mean() < 1.0 and np.percentile(error, 99) < 16, (request.key, error.mean())


NEEDS_NVDEC = pytest.mark.skipif(nvdec.unavailable() is not None, reason=f"NVDEC: {nvdec.unavailable()}")
# NVDEC's colour conversion and resize against swscale's, in mean levels: 2.2-2.8 measured on
# this 320x180 video on an H100 (driver 580), 1.0-1.2 on 854x480 (bench/featurize.py).
NVDEC_PIXEL_MEAN = 3.0


@pytest.mark.gpu
@NEEDS_NVDEC
def test_nvdec_takes_the_frame_shown_at_each_time(tmp_path):
    """Frame n of the counter video has luma 16 + 2n (qp 1 keeps every level, and B-frames,
    which a lossless encode has none of): the frame NVDEC's path gives at each time is the one
    the CPU path gives (the last with pts <= t)."""
    path = _encode(str(tmp_path / "counter.mp4"), [("color", "c=black:s=160x96:r=25:d=4"),
                                                   ("geq", "lum='16+2*N':cb=128:cr=128")], "yuv420p", qp="1")
    spec = FrameSpec(frames=1, short_side=96, crop=None)
    times = [0.0, 0.039, 0.04, 0.5, 1.99, 2.61, 3.98]
    requests = [FrameRequest(str(t), t, t, spec) for t in times]
    got = dict(nvdec.sample_frames_gpu(path, requests, torch.cuda.Stream()))
    for t in times:
        grey = got[str(t)].float().mean().item() * 219 / 255 / 2
        assert round(grey) == int(t * 25 + 1e-6), (t, grey)


@pytest.fixture(scope="module")
def moving420(tmp_path_factory) -> str:
    """The pattern as web video has it (4:2:0), tagged BT.601 as swscale reads untagged video."""
    path = str(tmp_path_factory.mktemp("nvdec") / "moving420.mp4")
    return _encode(path, [("testsrc2", "size=320x180:rate=25:duration=8")], "yuv420p",
                   **{"x264-params": "colormatrix=smpte170m:colorprim=smpte170m:transfer=smpte170m"})


@pytest.mark.gpu
@NEEDS_NVDEC
def test_nvdec_frames_match_the_cpu_path(moving420):
    specs = [FrameSpec(fps=2), FrameSpec(frames=8, short_side=128, crop=112)]
    requests = [FrameRequest(f"c{i}|{j}", start, start + 3.0, spec)
                for i, start in enumerate([0.2, 1.7, 4.9]) for j, spec in enumerate(specs)]
    cpu = dict(sample_frames(moving420, requests))
    gpu = dict(nvdec.sample_frames_gpu(moving420, requests, torch.cuda.Stream()))
    for request in requests:
        assert gpu[request.key].is_cuda and gpu[request.key].shape == cpu[request.key].shape
        error = np.abs(gpu[request.key].cpu().numpy().astype(int) - cpu[request.key].astype(int))
        assert error.mean() < NVDEC_PIXEL_MEAN, (request.key, error.mean())


@pytest.mark.gpu
@NEEDS_NVDEC
def test_a_video_nvdec_refuses_is_sampled_on_the_cpu(moving, caplog):
    """H.264 4:4:4, which the decoder's capabilities may accept but NVDEC cannot decode."""
    requests = [FrameRequest("c", 0.2, 3.2, FrameSpec(fps=2))]
    with caplog.at_level(logging.INFO, logger="vlcorpus"):
        got = dict(nvdec.sample_frames_gpu(moving, requests, torch.cuda.Stream()))
    assert np.array_equal(np.asarray(got["c"]), dict(sample_frames(moving, requests))["c"])
    assert any("decoded on the CPU" in r.getMessage() for r in caplog.records)
