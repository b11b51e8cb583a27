"""What a build's Dask worker process imports when it starts (a Dask preload, imported once by
the fork server the workers come from): the flows, with the garbage collector off while they
load (importing them makes a million objects and next to no garbage: the collector's passes
were a quarter of the import), and yt-dlp's URL patterns compiled (each worker compiled them
again when it first downloaded)."""

from __future__ import annotations

import gc

gc.disable()
import flows.build  # noqa: E402,F401
from pipeline.download.ytdlp import compile_url_patterns  # noqa: E402

compile_url_patterns()
gc.freeze()
gc.enable()


def dask_setup(worker: object) -> None:
    """Prefect read its settings when the fork server imported it; the worker's environment
    (the build's, from its nanny: the Prefect server's address among it) is newer."""
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()
