"""Logging and progress bars: rich for people, JSON lines for scheduled runs, or quiet; and the
beat by which a batch shows the runner's watchdog that it is not stuck (pipeline/runner/watchdog.py)."""

from __future__ import annotations

import contextvars
import json
import logging
import time
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypeVar

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

LogFormat = Literal["rich", "json", "quiet"]
T = TypeVar("T")

log = logging.getLogger("vlcorpus")
_mode: LogFormat = "rich"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with whatever ``extra=`` fields the call passed."""

    _RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update({k: v for k, v in record.__dict__.items() if k not in self._RESERVED})
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def setup_logging(mode: LogFormat = "rich", level: int = logging.INFO) -> None:
    """Configure the ``vlcorpus`` logger once per process; progress bars follow the mode."""
    global _mode
    _mode = mode
    handler: logging.Handler
    if mode == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    else:
        handler = RichHandler(console=terminal(), show_path=False, rich_tracebacks=False, markup=False)
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING if mode == "quiet" else level)
    log.propagate = False


# The console people read. While a build's logs go to a file, standard error is that file (so
# the processes it starts write there too) and this is the terminal it replaced.
_terminal: Console | None = None


def stdout_console() -> Console:
    """A console for tables on stdout: at a terminal, its width; into a pipe or a file, wide
    enough that rows stay whole instead of wrapping at 80 columns."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def terminal() -> Console:
    return _terminal or Console(stderr=True)


def _as_new_process() -> None:
    """A forked process (a local cluster's worker) logs as a new process would: to its
    standard error (a build's log file), not to the terminal of the process it came from."""
    global _mode, _terminal
    _mode, _terminal = "rich", None
    log.handlers[:] = []
    log.setLevel(logging.NOTSET)
    log.propagate = True


os.register_at_fork(after_in_child=_as_new_process)


@contextmanager
def logs_to_file(path: Path) -> Iterator[Path]:
    """Standard error of this process and of every process it starts (Prefect's server and
    logs, Dask's workers, ffmpeg) goes to ``path``; the ``vlcorpus`` logger writes its warnings
    to the terminal and everything to the file."""
    global _terminal
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a", encoding="utf-8") as file:
        os.dup2(file.fileno(), 2)
    stream = os.fdopen(os.dup(saved), "w", encoding="utf-8", buffering=1)
    terminal_before, handlers_before, level_before = _terminal, list(log.handlers), log.level
    _terminal = Console(file=stream, force_terminal=stream.isatty() or None)
    to_file = logging.StreamHandler(sys.stderr)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_people = RichHandler(console=_terminal, show_path=False, rich_tracebacks=False, markup=False)
    to_people.setLevel(logging.WARNING)
    log.handlers[:] = [to_people, to_file]
    log.setLevel(min(log.level, logging.INFO))
    try:
        yield path
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        _terminal = terminal_before
        log.handlers[:] = handlers_before
        log.setLevel(level_before)
        stream.close()


def progress_enabled() -> bool:
    """Live bars: for a person at a terminal, in the default mode."""
    return _mode == "rich" and terminal().is_terminal


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar when a person is watching; silently otherwise."""
    if not progress_enabled():
        yield from items
        return
    with _progress() as progress:
        task = progress.add_task(description, total=total)
        for item in items:
            yield item
            progress.advance(task)


class StepProgress:
    """A progress bar advanced by hand (for work that completes in uneven steps)."""

    def __init__(self, description: str, total: int) -> None:
        self._progress = _progress() if progress_enabled() else None
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task(description, total=total)

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _progress() -> Progress:
    return Progress(*COLUMNS, console=terminal())


COLUMNS = (
    TextColumn("{task.description}"),
    BarColumn(),
    MofNCompleteColumn(),
    TimeElapsedColumn(),
    TimeRemainingColumn(),
)


# The running batch's last sign of progress, in the context that the watchdog runs it in.
batch_clock: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("vlcorpus_batch_clock", default=None)


def beat() -> None:
    """The running batch made progress (an item done, an ASR segment, a download's progress);
    a no-op outside a watched batch."""
    clock = batch_clock.get()
    if clock is not None:
        clock[0] = time.monotonic()


def carried(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` for another thread (a pool's), whose ``beat()`` counts for the batch that called
    this: a pool's threads do not share the batch's context."""
    clock = batch_clock.get()

    def run(*args: object) -> T:
        token = batch_clock.set(clock)
        try:
            return fn(*args)
        finally:
            batch_clock.reset(token)

    return run
