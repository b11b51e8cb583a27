"""Frame sampling on the GPU's video decoder (NVDEC), with PyNvVideoCodec (the ``gpu`` extra).

The same frames as ``frames.sample_frames``: each sample time takes the frame shown then (the
last with pts <= t, times from the media start as ffmpeg counts them), resized so the short side
is the spec's (antialiased bilinear, as swscale's bilinear downscale) and centre cropped, but
decoded, converted to RGB and resized on the GPU: requests get uint8 [T, H, W, 3] CUDA tensors.
A video whose codec this GPU's decoder lacks is sampled on the CPU instead (``sample_frames``,
in the feeder's thread), and the log says so once per codec.

    if use_nvdec(config.features.decode, device):   # "nvdec" asked for, and there
        pool = shared_pool(threads, device)  # decoding threads, each with its CUDA stream
    for key, value in pool.sample(jobs, localize, depth, finish=prepare): ...
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from typing import Any

import av
import torch
from torchvision.transforms import functional as TF

from pipeline.errors import BadInputError, SetupError
from pipeline.media.decode_pool import FeederPool, Job, _Call
from pipeline.media.frames import Collector, FrameRequest, sample_frames
from pipeline.progress import log


@cache
def unavailable() -> str | None:
    """Why frames cannot be decoded on a GPU here (one line), or None when they can: torch sees
    a CUDA device, PyNvVideoCodec loads (it needs the driver's video libraries: in containers,
    NVIDIA_DRIVER_CAPABILITIES must include "video") and the GPU has an H.264 decoder."""
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        import PyNvVideoCodec as nvc
    except ImportError:
        return "PyNvVideoCodec is not installed (pip install 'vlcorpus[gpu]')"
    except Exception as exc:  # noqa: BLE001 - it raises RuntimeError when the driver's libraries are missing
        return f"PyNvVideoCodec does not load: {str(exc).strip().splitlines()[0]}"
    try:  # its defaults: H.264, 4:2:0, 8 bits
        caps = nvc.GetDecoderCaps(gpuid=torch.cuda.current_device())
    except Exception as exc:  # noqa: BLE001 - no decoder library or engine
        return f"the GPU's decoder does not answer: {exc}"
    if not caps.get("supported"):
        return "this GPU has no H.264 decoder"
    return None


# Measured with bench/featurize.py on one H100 with 16 cores (docs/benchmarks.md): NVDEC's path
# fed 310-390 clip frames/s with 2 to 16 threads, CPU decoding 949 with 2 workers and 1,703 with
# 16; so "auto" decodes on the CPU, and NVDEC is there for whoever asks for it.
AUTO_ON_CPU = ("NVDEC's path feeds fewer frames than the CPU's decoders on every machine "
               "measured (docs/benchmarks.md); features.decode: nvdec takes it anyway")


def use_nvdec(decode: str, device: torch.device) -> bool:
    """Whether to decode on the GPU for ``features.decode`` (auto, cpu, nvdec) when the model
    runs on ``device``. "nvdec" that cannot be had is a SetupError saying what is missing (the
    build stops before any work, and ``vlcorpus check`` reports it); "auto" decodes on the CPU,
    and the log says why, once."""
    if decode == "cpu":
        return False
    reason = "the features run on the CPU" if device.type != "cuda" else unavailable()
    if decode == "nvdec":
        if reason is not None:
            raise SetupError(f"features.decode is 'nvdec' but {reason}")
        return True
    say_once(f"decoding frames on the CPU (features.decode auto): {reason or AUTO_ON_CPU}")
    return False


@cache
def say_once(message: str) -> None:
    """``message`` in the log, the first time this process says it."""
    log.info(message)


def unsupported(path: str, gpu: int) -> str | None:
    """Why this GPU's decoder cannot decode the video of ``path`` (codec, chroma format, bit
    depth or size), or None."""
    import PyNvVideoCodec as nvc

    demuxer = nvc.CreateDemuxer(filename=path)
    codec, chroma, depth = demuxer.GetNvCodecId(), demuxer.ChromaFormat(), demuxer.BitDepth()
    caps = nvc.GetDecoderCaps(gpuid=gpu, codec=codec, chromaformat=chroma, bitdepth=depth)
    what = f"{_label(codec)} {_label(chroma)} {depth}-bit"
    if not caps.get("supported"):
        return f"{what} is not supported by this GPU's decoder"
    width, height = demuxer.Width(), demuxer.Height()
    if not (caps["width_min"] <= width <= caps["width_max"]
            and caps["height_min"] <= height <= caps["height_max"]):
        return f"{what} at {width}x{height} is outside this GPU's decoder's sizes"
    return None


def _label(member: object) -> str:
    """The name of one of PyNvVideoCodec's enum members ("H264" of cudaVideoCodec.H264)."""
    return str(member).rsplit(".", 1)[-1]


class _GpuImages:
    """Images of RGB frames already on the GPU ([H, W, 3] uint8 tensors)."""

    def __init__(self, turns: int) -> None:
        self.turns = turns

    def size(self, frame: torch.Tensor) -> tuple[int, int]:
        return frame.shape[1], frame.shape[0]

    def resize(self, frame: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        chw = TF.resize(frame.permute(2, 0, 1), [size[1], size[0]], antialias=True)
        return chw.permute(1, 2, 0)

    def upright(self, image: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        return torch.rot90(image, k=self.turns, dims=(0, 1))

    def stack(self, images: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(images)


def _stream_facts(path: str) -> tuple[float, int]:
    """The media's start (the time origin ffmpeg counts from) and the quarter turns of its
    display rotation, which NVDEC does not apply (read from its first frame, with PyAV)."""
    with av.open(path) as container:
        stream = container.streams.video[0]
        first = next(container.decode(stream), None)
        turns = round(first.rotation / 90) if first is not None else 0
        return (container.start_time or 0) / 1e6, turns


def open_decoder(path: str, stream: torch.cuda.Stream) -> tuple[Any, Any]:
    """PyNvVideoCodec's demuxer of ``path`` and a decoder for it that writes RGB frames to
    device memory on ``stream``, in torch's CUDA context (called on a thread where it is
    current): its frames are then plain device memory to torch."""
    import PyNvVideoCodec as nvc

    demuxer = nvc.CreateDemuxer(filename=path)
    decoder = nvc.CreateDecoder(
        gpuid=_gpu(stream), codec=demuxer.GetNvCodecId(), cudacontext=_current_context(),
        cudastream=stream.cuda_stream, usedevicememory=True, outputColorType=nvc.OutputColorType.RGB)
    return demuxer, decoder


def _gpu(stream: torch.cuda.Stream) -> int:
    return stream.device.index if stream.device.index is not None else torch.cuda.current_device()


def _decoded(path: str, stream: torch.cuda.Stream, offset: float,
             next_time: Callable[[], float | None]) -> Iterator[tuple[float, torch.Tensor]]:
    """Frames in display order with their time from the media start, as RGB tensors of their
    own (the decoder reuses its buffers), until nothing more is wanted. Every frame is decoded
    (no seeking): NVDEC decodes far faster than the CPU converts."""
    demuxer, decoder = open_decoder(path, stream)
    base = demuxer.GetTimebaseNum() / demuxer.GetTimebaseDen()
    position = float("-inf")
    while True:
        packet = demuxer.Demux()  # at the end, an empty packet: decoding it flushes the decoder
        for frame in decoder.Decode(packet):
            time_s = frame.getPTS() * base - offset
            if time_s <= position:
                continue
            position = time_s
            yield time_s, torch.from_dlpack(frame).clone()
            if next_time() is None:
                return
        if packet.bsl == 0:
            return


def _current_context() -> int:
    """The CUDA context current on this thread (torch's primary one)."""
    handle = ctypes.c_void_p()
    ctypes.CDLL("libcuda.so.1").cuCtxGetCurrent(ctypes.byref(handle))
    return handle.value or 0


def sample_frames_gpu(path: str, requests: Sequence[FrameRequest], stream: torch.cuda.Stream,
                      ) -> Iterator[tuple[str, torch.Tensor | BadInputError]]:
    """``frames.sample_frames`` of ``path`` decoded on the GPU of ``stream``, frames as uint8
    [T, H, W, 3] CUDA tensors, ready to use on any stream when handed out. A file the GPU's
    decoder cannot take (or that does not open) goes to ``sample_frames``: CPU frames, or the
    same error rows as there."""
    try:
        reason = unsupported(path, _gpu(stream))
        offset, turns = _stream_facts(path)
    except Exception:  # noqa: BLE001 - the file does not open: sample_frames makes its error rows
        yield from sample_frames(path, requests)
        return
    if reason is not None:
        say_once(f"NVDEC: {reason}; videos like it are decoded on the CPU")
        yield from sample_frames(path, requests)
        return
    collector: Collector[torch.Tensor] = Collector(requests, _GpuImages(turns))
    decoded = False
    with torch.cuda.stream(stream):
        try:
            for time_s, frame in _decoded(path, stream, offset, collector.next_time):
                decoded = True
                for key, frames in collector.add(time_s, frame):
                    stream.synchronize()  # another thread's stream takes it from here
                    yield key, frames
            finished = list(collector.finish())
        except Exception as exc:  # noqa: BLE001 - PyNvVideoCodec's errors have no common base
            if not decoded:  # the decoder refused the stream (caps can say yes to what it
                # cannot decode, e.g. H.264 4:4:4): the CPU takes the whole video
                say_once(f"NVDEC: {str(exc).strip()[:200]}; such videos are decoded on the CPU")
                finished = None
            else:
                finished = list(collector.fail(f"decoding failed: {exc}"))
        stream.synchronize()
    yield from sample_frames(path, requests) if finished is None else finished


class NvdecPool(FeederPool):
    """``threads`` threads decoding on the GPU of ``device``, each on a CUDA stream of its own."""

    def __init__(self, threads: int, device: torch.device) -> None:
        self.gpu = device.index if device.index is not None else torch.cuda.current_device()
        super().__init__(threads)

    def _open(self) -> torch.cuda.Stream:
        torch.cuda.set_device(self.gpu)
        torch.empty(1, device=f"cuda:{self.gpu}")  # torch's context made current on this thread
        return torch.cuda.Stream(f"cuda:{self.gpu}")

    def _run(self, stream: torch.cuda.Stream, call: _Call, path: str, job: Job) -> Iterator[tuple[str, Any]]:
        # NVDEC decodes every frame: skip_nonref is for the CPU's decoder.
        for key, frames in sample_frames_gpu(path, job.requests, stream):
            prepared = call.result(frames)  # on `stream` too (current while the generator waits)
            stream.synchronize()
            yield key, prepared

    def _abandon(self, stream: torch.cuda.Stream) -> None:
        stream.synchronize()  # the abandoned job's decoder goes with its generator; the stream stays


_pools: dict[tuple[int, str], NvdecPool] = {}
_pools_lock = threading.Lock()


def shared_pool(threads: int, device: torch.device) -> NvdecPool:
    """This process's pool of ``threads`` decoding threads on ``device``, kept for later batches."""
    with _pools_lock:
        key = (threads, str(device))
        if key not in _pools:
            _pools[key] = NvdecPool(threads, device)
        return _pools[key]
