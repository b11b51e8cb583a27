"""NVDEC's frames converted in torch have the CPU path's colours: NV12 to RGB with the matrix
and range swscale uses (BT.601 limited for untagged video, the stream's tags otherwise), within
1.5 levels of swscale's own pixels on average. Runs on CPU tensors; on a GPU the same code runs
on the decoder's surfaces."""

from __future__ import annotations

import subprocess

import av
import numpy as np
import pytest

# The conversion runs on torch tensors; the Python 3.12 run (make test-py312) has no torch.
torch = pytest.importorskip("torch")

from conftest import require_binaries  # noqa: E402
from pipeline.media.frames import _PyAVImages  # noqa: E402
from pipeline.media.nv12 import full_range_of, matrix_of, nv12_to_rgb  # noqa: E402

# (name, ffmpeg output options): untagged as most uploads are, tagged BT.709, and JPEG range.
VIDEOS = {
    "untagged": ["-pix_fmt", "yuv420p"],
    "bt709": ["-pix_fmt", "yuv420p", "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709"],
    "full_range": ["-pix_fmt", "yuvj420p"],
}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    require_binaries("ffmpeg")
    folder = tmp_path_factory.mktemp("nv12")
    paths = {}
    for name, options in VIDEOS.items():
        paths[name] = folder / f"{name}.mp4"
        subprocess.run(["ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc2=size=320x240:rate=10",
                        "-f", "lavfi", "-i", "mandelbrot=size=320x240:rate=10",
                        "-filter_complex", "blend=all_mode=average",
                        "-t", "1", "-c:v", "libx264", *options, str(paths[name])], check=True)
    return paths


def _differences(path, matrix: str | None = None) -> list[np.ndarray]:
    images = _PyAVImages()
    out = []
    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i >= 5:
                break
            cpu = images.resize(frame, (frame.width, frame.height)).astype(np.int16)
            nv12 = torch.from_numpy(frame.reformat(format="nv12").to_ndarray())
            gpu_path = nv12_to_rgb(nv12, frame.height, frame.width, matrix or matrix_of(frame.colorspace),
                                   full_range_of(frame.color_range))
            assert gpu_path.dtype == torch.uint8 and tuple(gpu_path.shape) == (frame.height, frame.width, 3)
            out.append(np.abs(gpu_path.numpy().astype(np.int16) - cpu))
    return out


@pytest.mark.parametrize("name", sorted(VIDEOS))
def test_nv12_frames_have_the_cpu_paths_colours(videos, name):
    diffs = _differences(videos[name])
    assert diffs
    for diff in diffs:
        assert diff.mean() <= 1.5 and diff.max() <= 3, (name, diff.mean(), diff.max())


def test_the_streams_tags_decide_the_matrix_and_range(videos):
    with av.open(str(videos["bt709"])) as tagged, av.open(str(videos["untagged"])) as untagged:
        assert matrix_of(next(tagged.decode(video=0)).colorspace) == "bt709"
        assert matrix_of(next(untagged.decode(video=0)).colorspace) == "bt601"
    with av.open(str(videos["full_range"])) as jpeg:
        assert full_range_of(next(jpeg.decode(video=0)).color_range)
    # BT.709 video converted as BT.601 (NVDEC's mistake the other way round) is far off.
    assert np.mean([d.mean() for d in _differences(videos["bt709"], matrix="bt601")]) > 3


def test_odd_sizes_are_refused():
    with pytest.raises(ValueError, match="even-sized"):
        nv12_to_rgb(torch.zeros(4, 5, dtype=torch.uint8), 3, 5)
