"""The ``vlcorpus`` script: the command line imported with the garbage collector paused, its full
passes spaced out after (pipeline/gc_pause.py), and a process that ends as soon as its command
has."""

from __future__ import annotations

import atexit
import logging
import os
import sys

from pipeline.gc_pause import collector_paused


def main() -> None:
    # Registered first, so it runs after every other exit handler: then the interpreter would
    # only free the modules and objects of the command, half a second after a build.
    code: list[int] = [0]
    atexit.register(_exit_now, code)
    with collector_paused():
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
