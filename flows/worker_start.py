"""What a build's Dask worker process imports when it starts (a Dask preload, imported once by
the fork server the workers come from): the flows, with the garbage collector paused while they
load (pipeline/gc_pause.py: its passes were a quarter of the import) and its full passes spaced
out after, and yt-dlp's URL patterns compiled (each worker compiled them again when it first
downloaded)."""

from __future__ import annotations

from pipeline.gc_pause import collector_paused

with collector_paused():
    import flows.build  # noqa: F401
    from pipeline.download.ytdlp import compile_url_patterns

    compile_url_patterns()


def dask_setup(worker: object) -> None:
    """Prefect read its settings when the fork server imported it; the worker's environment
    (the build's, from its nanny: the Prefect server's address among it) is newer. A close that
    hangs ends the process (flows/clusters/worker_exit.py)."""
    from prefect.context import refresh_global_settings_context

    from flows.clusters.worker_exit import exit_if_closing_hangs

    refresh_global_settings_context()
    exit_if_closing_hangs(worker)
