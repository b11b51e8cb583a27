"""What a SLURM GPU job's worker imports when it starts (its Dask preload): the flows, with the
garbage collector paused while they load (pipeline/gc_pause.py), and its own GPU alone.

SLURM gives a job of N GPUs their N indices in CUDA_VISIBLE_DEVICES; the job's N workers are
named ``<job>-0`` ... ``<job>-<N-1>``, and each keeps the index at its place. The worker has
initialised no CUDA yet (the flows load none), so its models see that GPU as cuda:0. Unlike the
CPU workers' start (flows.worker_start) it compiles no URL patterns: a GPU worker downloads
nothing, and its start is time the GPU is held without work.
"""

from __future__ import annotations

import os

from pipeline.gc_pause import collector_paused

with collector_paused():
    import flows.build  # noqa: F401
    from flows.clusters.worker_exit import exit_if_closing_hangs


def own_gpu(worker_name: str, visible: str) -> str:
    """The GPU that the worker named ``worker_name`` keeps of the job's ``visible`` ones."""
    gpus = [gpu for gpu in visible.split(",") if gpu]
    if len(gpus) <= 1:
        return visible
    _, _, place = worker_name.rpartition("-")
    return gpus[int(place) % len(gpus)] if place.isdigit() else visible


def dask_setup(worker: object) -> None:
    exit_if_closing_hangs(worker)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        os.environ["CUDA_VISIBLE_DEVICES"] = own_gpu(str(getattr(worker, "name", "")), visible)
    print(f"vlcorpus: worker {getattr(worker, 'name', '?')} sees GPU "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
