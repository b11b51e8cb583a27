"""NV12 to RGB in torch, with the CPU path's colours: the frames NVDEC decodes are converted on
the GPU (only those sampled), and must match what swscale makes of the same video on the CPU,
or a corpus whose videos fall back to the CPU mixes two colour conventions.

swscale converts with the stream's own matrix and range where the stream is tagged, and with
BT.601 in limited range where it is not, at any size (the CPU path never guesses BT.709 from
the height, so neither does this). Each chroma sample covers its 2x2 block of pixels and values
are truncated, not rounded, as in swscale's fixed-point conversion: on the demo's and FFmpeg's
test videos the mean difference from swscale's pixels is 0.4 to 0.6 levels, at most 2
(tests/stages/test_nv12.py).
"""

from __future__ import annotations

import torch

# (Kr, Kb) of each matrix; Kg = 1 - Kr - Kb.
_COEFFICIENTS = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722), "bt2020": (0.2627, 0.0593),
                 "smpte240m": (0.212, 0.087), "fcc": (0.30, 0.11)}

# FFmpeg's AVColorSpace numbers (what PyAV's frame.colorspace and a stream's tags hold).
_BY_TAG = {1: "bt709", 4: "fcc", 5: "bt601", 6: "bt601", 7: "smpte240m", 9: "bt2020", 10: "bt2020"}


def matrix_of(colorspace: int | None) -> str:
    """The matrix swscale uses for a stream tagged ``colorspace`` (AVColorSpace); untagged or
    unknown: BT.601."""
    return _BY_TAG.get(colorspace or 0, "bt601")


def full_range_of(color_range: int | None) -> bool:
    """Whether a stream tagged ``color_range`` (AVColorRange: 2 is JPEG/full) uses the full
    0-255 range; untagged is limited, as swscale takes it."""
    return color_range == 2


def nv12_to_rgb(nv12: torch.Tensor, height: int, width: int, matrix: str = "bt601",
                full_range: bool = False) -> torch.Tensor:
    """uint8 [H, W, 3] RGB of an NV12 image (uint8 [H * 3 / 2, W]: the luma plane, then the
    interleaved chroma plane at half size; H and W even, as decoders' surfaces are), on
    ``nv12``'s device."""
    if height % 2 or width % 2 or tuple(nv12.shape) != (height * 3 // 2, width):
        raise ValueError(f"expected NV12 of an even-sized {width}x{height} image, got {list(nv12.shape)}")
    kr, kb = _COEFFICIENTS[matrix]
    kg = 1.0 - kr - kb
    y = nv12[:height].float()
    uv = nv12[height:height + height // 2].reshape(height // 2, width // 2, 2).permute(2, 0, 1).float()
    # Each chroma sample covers its 2x2 block, as in swscale's unscaled conversion.
    uv = uv.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)[:, :height, :width]
    if full_range:
        luma, cb, cr = y / 255.0, (uv[0] - 128.0) / 255.0, (uv[1] - 128.0) / 255.0
    else:
        luma, cb, cr = (y - 16.0) / 219.0, (uv[0] - 128.0) / 224.0, (uv[1] - 128.0) / 224.0
    r = luma + 2.0 * (1.0 - kr) * cr
    b = luma + 2.0 * (1.0 - kb) * cb
    g = luma - (2.0 * kb * (1.0 - kb) / kg) * cb - (2.0 * kr * (1.0 - kr) / kg) * cr
    return torch.stack([r, g, b], dim=-1).mul_(255.0).floor_().clamp_(0, 255).to(torch.uint8)
