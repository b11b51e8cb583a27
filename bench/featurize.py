"""Featurize throughput, per extractor: the model alone, the decode ceilings, and the whole stage.

On test-pattern videos (854x480 25 fps H.264, a keyframe every 2 s, as web video has), with
clips of 3 s every 1.5 s (neighbours overlap), each extractor prints frames/s of
  (a) the model alone on prepared clips (pinned, copied to the GPU while the model runs),
  (b) the CPU decode ceiling: PyAV's plain decode of the videos in one process per CPU, one
      decoder thread each, as decoded frames/s and as the clip frames/s that rate could feed
      at this extractor's sampling,
  (c) the NVDEC ceiling: PyNvVideoCodec decoding the videos in `--workers` threads (when the
      library and a GPU decoder are there),
  (d) the whole stage (decode, convert, model, write), once per decode mode (cpu, nvdec where
      available, and auto: which of the two features.decode's default takes), with the GPU's
      utilisation sampled during it (nvidia-ml-py, when a GPU is there), and, to tell the
      decoding apart from the rest, the stage's decoding and preparing alone, without the model,
  (e) with NVDEC, how its frames agree with the CPU's on the same clips: whether each time got
      the same frame (not a neighbour), the pixels' difference, and the features' cosine,
  (f) with --sweep N..., the whole stage of the first extractor with N decode workers, on the
      CPU and on NVDEC: what a machine with fewer cores per GPU can expect.
Goals on one H100 with 16 cores: resnet50 at 2 fps >= 1,300 frames/s, s3d >= 3,000,
tsm_r50 >= 2,000 for (d).
Usage: python bench/featurize.py [--extractors resnet50 s3d tsm_r50] [--videos 16]
       [--seconds 60] [--batch N] [--workers N] [--size 854x480] [--crop 224] [--sweep 8 4 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from benchkit import make_test_video, pyav_decode

from pipeline.featurize import stage as featurize
from pipeline.config import Config, parse_config
from pipeline.features.extract import _host_buffer, decode_processes, extractor_for
from pipeline.ids import clip_id
from pipeline.media import FrameRequest, frame_times, sample_frames
from pipeline.media import nvdec
from pipeline.media.decode_pool import plan_jobs, shared_pool, usable_cpus
from pipeline.runner import run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus

FPS = 25
CLIP_S, STEP_S = 3.0, 1.5
# Each extractor's own frames, as in its paper's setting, and clips per model batch (about
# 1-2k frames through the model at once).
SAMPLING = {"resnet34": {"fps": 2}, "resnet50": {"fps": 2}, "resnet152": {"fps": 1},
            "s3d": {"frames": 16}, "tsm_r50": {"frames": 8}, "s3d_howto100m": {"frames": 32}}
BATCH = {"resnet34": 128, "resnet50": 128, "resnet152": 128, "s3d": 64, "tsm_r50": 128,
         "s3d_howto100m": 32}


def make_corpus(root: Path, videos: list[Path], seconds: int) -> list[dict]:
    """Downloads and clips rows over ``videos`` (a clip of CLIP_S every STEP_S); the clips with
    their media."""
    corpus = Corpus(str(root))
    corpus.init_partitions(1)
    now = datetime.now(UTC)
    downloads, clips = [], []
    for media in videos:
        video = f"bench-{media.stem}"
        downloads.append({"video_id": video, "media_path": str(media), "status": "ok",
                          "duration_s": float(seconds), "downloaded_at": now})
        start = 0.0
        while start + CLIP_S <= seconds:
            clips.append({"clip_id": clip_id(video, start, start + CLIP_S), "video_id": video,
                          "start_s": start, "end_s": start + CLIP_S, "text": "bench",
                          "source": "manual", "policy": "fixed", "split": "train",
                          "media_path": str(media)})
            start += STEP_S
    corpus.write_partitioned("downloads", downloads, "bench", done=[d["video_id"] for d in downloads])
    rows = [{k: v for k, v in c.items() if k != "media_path"} for c in clips]
    corpus.write_partitioned("clips", rows, "bench", done=[d["video_id"] for d in downloads])
    return clips


def config(name: str, args: argparse.Namespace, decode: str, workers: int | None = None) -> Config:
    return parse_config({
        "name": "bench", "sources": [{"type": "urls", "urls": ["http://x/"]}],
        "frames": {"short_side": args.crop * 256 // 224, "crop": args.crop},
        "features": {"extractors": [{"name": name, "weights": "none",
                                     "batch_size": args.batch or BATCH.get(name, 32),
                                     **SAMPLING.get(name, {})}],
                     "decode": decode, "decode_workers": workers or args.workers,
                     "clips_per_commit": 100_000}})


def model_alone(cfg: Config, name: str, clips: list[dict], batch: int) -> float:
    """Frames/s of the extractor on prepared clips (at most 8 batches of them)."""
    extractor = extractor_for(cfg, name)
    prepared = []
    for media in sorted({c["media_path"] for c in clips}):
        requests = [FrameRequest(c["clip_id"], c["start_s"], c["end_s"], extractor.spec)
                    for c in clips if c["media_path"] == media]
        prepared += [extractor.prepare(frames) for _, frames in sample_frames(media, requests)]
        if len(prepared) >= 8 * batch:
            break
    batches = [prepared[i:i + batch] for i in range(0, len(prepared), batch)]
    list(extractor.run_batches(batches[:1]))  # warm-up: kernels chosen, memory allocated
    _sync()
    start = time.perf_counter()
    for _ in extractor.run_batches(batches):
        pass
    _sync()
    return sum(len(c) for c in prepared) / (time.perf_counter() - start)


def cpu_ceiling(videos: list[Path]) -> tuple[float, int]:
    """Decoded frames/s of PyAV's plain decode, one process per CPU, one decoder thread each."""
    processes = usable_cpus()
    work = [str(v) for v in videos] * max(1, -(-processes // len(videos)))  # every process busy
    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(pyav_decode, work[:processes], [1] * processes))  # start and warm up
        start = time.perf_counter()
        frames = sum(pool.map(pyav_decode, work, [1] * len(work)))
    return frames / (time.perf_counter() - start), processes


def nvdec_decode(path: str) -> int:
    """Every frame of ``path`` decoded to RGB on the GPU and nothing else done with them."""
    stream = torch.cuda.Stream()
    torch.empty(1, device="cuda")  # torch's context current on this thread, for the decoder
    demuxer, decoder = nvdec.open_decoder(path, stream)
    frames = 0
    while True:
        packet = demuxer.Demux()  # empty at the end: decoding it flushes the decoder
        frames += len(decoder.Decode(packet))
        if packet.bsl == 0:
            stream.synchronize()
            return frames


def nvdec_ceiling(videos: list[Path], threads: int) -> float:
    """Decoded frames/s of PyNvVideoCodec (RGB out, on the GPU) in ``threads`` threads."""
    work = [str(v) for v in videos] * max(1, -(-threads // len(videos)))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(nvdec_decode, work[:threads]))  # decoders made once, the GPU warm
        start = time.perf_counter()
        frames = sum(pool.map(nvdec_decode, work))
    return frames / (time.perf_counter() - start)


@contextmanager
def gpu_busy() -> Iterator[list[int]]:
    """Samples of the GPU's utilisation (%) every 50 ms while the block runs; none without a
    GPU or nvidia-ml-py."""
    samples: list[int] = []
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - no GPU, no driver or no nvidia-ml-py: nothing to sample
        yield samples
        return
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()
        pynvml.nvmlShutdown()


def nvdec_agreement(cfg: Config, name: str, clips: list[dict]) -> str:
    """NVDEC's frames against the CPU's for the first 32 clips: at how many times NVDEC's frame
    is nearer the CPU's frame of that time than the CPU's frames one frame earlier and later
    (the same frame), the pixels' mean and 99th percentile difference, and the cosine of the
    extractor's features of the two."""
    extractor = extractor_for(cfg, name)
    stream = torch.cuda.Stream()
    same = times = 0
    pixels, cosines = [], []
    for media in sorted({c["media_path"] for c in clips[:32]}):
        mine = [c for c in clips[:32] if c["media_path"] == media]
        shifted = {shift: [FrameRequest(f"{c['clip_id']}|{shift}", c["start_s"] + shift / FPS,
                                        c["end_s"] + shift / FPS, extractor.spec) for c in mine]
                   for shift in (-1, 0, 1)}
        cpu = dict(sample_frames(media, [r for rs in shifted.values() for r in rs]))
        gpu = dict(nvdec.sample_frames_gpu(media, shifted[0], stream))
        for request in shifted[0]:
            key = request.key[:-2]
            ours = gpu[request.key].float().cpu()
            near = {shift: torch.from_numpy(cpu[f"{key}|{shift}"]).float() for shift in (-1, 0, 1)}
            for i in range(len(ours)):
                far = {shift: (ours[i] - frames[i]).abs().mean().item() for shift, frames in near.items()}
                same += far[0] == min(far.values())
                times += 1
            pixels.append((ours - near[0]).abs().flatten())
            a, b = extractor.run([extractor.prepare(gpu[request.key]),
                                  extractor.prepare(cpu[f"{key}|0"])])
            cosines.append(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item())
    diff = torch.cat(pixels).numpy()
    return (f"the same frame at {same}/{times} times; pixels |diff| mean {diff.mean():.2f}, "
            f"p99 {np.percentile(diff, 99):.0f}; features cosine min {min(cosines):.4f}, "
            f"mean {np.mean(cosines):.4f}")


def sampling_alone(cfg: Config, name: str, clips: list[dict]) -> float:
    """Clip frames/s of the stage's decoding and preparing (``extractor.prepare``) without the
    model, on the pool the stage would take for ``cfg``."""
    extractor = extractor_for(cfg, name)
    workers = decode_processes(cfg.features)
    videos: dict[str, list[FrameRequest]] = {}
    for c in clips:
        videos.setdefault(c["media_path"], []).append(
            FrameRequest(c["clip_id"], c["start_s"], c["end_s"], extractor.spec))
    if nvdec.use_nvdec(cfg.features.decode, extractor.device):
        pool, jobs = nvdec.shared_pool(workers, extractor.device), plan_jobs(videos, 1)
    else:
        pool = shared_pool(workers)
        jobs = plan_jobs(videos, pool.size, cfg.frames.skip_nonref)
    for _ in range(2):  # the second: the pool started and warm, as in a build
        start, frames = time.perf_counter(), 0
        for _, prepared in pool.sample(jobs, nullcontext,
                                       cfg.features.queue_size, _host_buffer(extractor.device),
                                       extractor.prepare):
            frames += len(prepared)
        _sync()
    return frames / (time.perf_counter() - start)


def whole_stage(root: Path, cfg: Config) -> tuple[float, list[int]]:
    """Seconds of the featurize stage over every clip, and the GPU's utilisation meanwhile: the
    second of two runs (a build starts its decode workers and warms the model once, then keeps
    them for every batch)."""
    stage = featurize.stages(cfg)[0]
    ctx = context(Corpus(str(root)), cfg)
    for _ in range(2):
        shutil.rmtree(root / stage.output, ignore_errors=True)
        with gpu_busy() as busy:
            start = time.perf_counter()
            report = run_stage(stage, ctx, batch_size=stage.batch_size)
            seconds = time.perf_counter() - start
        assert report.ok == report.total and not report.errors, report
    return seconds, busy


def stage_line(decode: str, cfg: Config, work: Path, frames: int, alone: float,
               label: str = "(d)") -> str:
    """The whole stage's line for ``cfg``: frames/s, its share of the model alone, the GPU's
    utilisation meanwhile."""
    seconds, busy = whole_stage(work / "corpus", cfg)
    gpu_line = (f"; GPU busy {sum(busy) / len(busy):.0f}% (median {sorted(busy)[len(busy) // 2]}%)"
                if busy else "")
    return (f"  {label} whole stage, decode {decode:5s} ({decode_processes(cfg.features):2d} workers)"
            f"    {frames / seconds:9.0f} frames/s = {frames / seconds / alone:.2f} of (a){gpu_line}")


@contextmanager
def reported(label: str) -> Iterator[None]:
    """The block's failure is printed (its traceback on standard error) and the bench goes on:
    one run on a GPU machine shows all it can."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - reported, and the next measurement runs
        print(f"  {label} failed: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extractors", nargs="+", default=["resnet50", "s3d", "tsm_r50"])
    parser.add_argument("--videos", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--size", default="854x480")
    parser.add_argument("--batch", type=int, default=None, help="clips per model batch "
                        "(default: 128, s3d 64, s3d_howto100m 32)")
    parser.add_argument("--workers", type=int, default=None,
                        help="features.decode_workers (default: one per CPU)")
    parser.add_argument("--crop", type=int, default=224, help="model input (short side 256/224 of it)")
    parser.add_argument("--sweep", type=int, nargs="*", default=[],
                        help="decode workers to run the first extractor's whole stage with, too")
    args = parser.parse_args()
    have_nvdec = nvdec.unavailable() is None
    with tempfile.TemporaryDirectory(prefix="vlcorpus-bench-") as tmp:
        work = Path(tmp)
        (work / "media").mkdir()
        videos = [work / "media" / f"v{i:03d}.mp4" for i in range(args.videos)]
        print(f"making {args.videos} videos of {args.seconds} s ...", flush=True)
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(lambda v: make_test_video(str(v), args.seconds, keyframe_s=2,
                                                    size=args.size), videos))
        clips = make_corpus(work / "corpus", videos, args.seconds)
        decoded, processes = cpu_ceiling(videos)
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
        print(f"{usable_cpus()} CPUs, {gpu}, torch {torch.__version__}; {args.videos} videos x "
              f"{args.seconds} s {args.size}, {len(clips)} clips of {CLIP_S:g} s every {STEP_S:g} s")
        print(f"NVDEC: {'yes' if have_nvdec else 'no, ' + str(nvdec.unavailable())}")
        video_frames = args.videos * args.seconds * FPS
        nv_decoded = None
        firsts: tuple[str, int, float] | None = None  # the first extractor's, for --sweep
        for name in args.extractors:
            cfg = config(name, args, "cpu")
            extractor = extractor_for(cfg, name)
            frames = sum(len(frame_times(FrameRequest(c["clip_id"], c["start_s"], c["end_s"],
                                                      extractor.spec))) for c in clips)
            per_decoded = frames / video_frames  # clip frames each decoded frame feeds
            batch = cfg.features.extractors[0].batch_size
            print(f"\n{name} ({extractor.spec.fps or extractor.spec.frames}"
                  f"{' fps' if extractor.spec.fps else ' frames'} a clip, batch {batch}) on "
                  f"{extractor.device.type}, autocast {extractor.dtype}: {frames} clip frames")
            alone = float("nan")
            with reported("(a)"):
                alone = model_alone(cfg, name, clips, batch)
                print(f"  (a) model alone                                {alone:9.0f} frames/s")
            print(f"  (b) CPU decode ceiling, PyAV, {processes:2d} processes      {decoded:9.0f} "
                  f"decoded frames/s = {decoded * per_decoded:.0f} clip frames/s")
            if have_nvdec:
                with reported("(c)"):
                    nv_decoded = nv_decoded or nvdec_ceiling(videos, decode_processes(cfg.features))
                    print(f"  (c) NVDEC ceiling, {decode_processes(cfg.features):2d} threads"
                          f"                   {nv_decoded:9.0f} decoded frames/s = "
                          f"{nv_decoded * per_decoded:.0f} clip frames/s")
            for decode in ["cpu", "nvdec", "auto"] if have_nvdec else ["cpu", "auto"]:
                with reported(f"(d) decode {decode}"):
                    cfg = config(name, args, decode)
                    print(stage_line(decode, cfg, work, frames, alone), flush=True)
                    print(f"      decoding and preparing alone {sampling_alone(cfg, name, clips):9.0f} "
                          "frames/s", flush=True)
            if have_nvdec:
                with reported("(e)"):
                    print(f"  (e) NVDEC against the CPU: {nvdec_agreement(cfg, name, clips)}")
            firsts = firsts or (name, frames, alone)
        if args.sweep:
            name, frames, alone = firsts
            print(f"\n{name} with fewer decode workers:")
        for workers in args.sweep:
            for decode in ["cpu", "nvdec"] if have_nvdec else ["cpu"]:
                with reported(f"(f) decode {decode}"):
                    cfg = config(name, args, decode, workers)
                    print(stage_line(decode, cfg, work, frames, alone, "(f)"), flush=True)


if __name__ == "__main__":
    main()
