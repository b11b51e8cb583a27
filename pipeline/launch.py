"""The ``vlcorpus`` script, outside ``pipeline.cli`` so that it starts without importing the
command line (about 0.5 s). For ``build`` it starts Prefect's temporary server before that:
that server's start is the longest part of a small build's set-up, and the build adopts it
(or stops it, when a server is configured)."""

from __future__ import annotations

import atexit
import logging
import os
import sys


def main() -> None:
    # Registered first, so it runs after every other exit handler: then the interpreter would
    # only free the modules and objects of the command, half a second after a build.
    code: list[int] = [0]
    atexit.register(_exit_now, code)
    if sys.argv[1:2] == ["build"]:
        from flows.temporary_server import start_early

        start_early()
    from pipeline.cli import app

    try:
        app()
    except SystemExit as done:
        code[0] = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        raise
    except KeyboardInterrupt:
        code[0] = 130
        raise
    except BaseException:
        code[0] = 1
        raise


def _exit_now(code: list[int]) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code[0])
