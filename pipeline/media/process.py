"""The one way vlcorpus runs an ffmpeg process (decoding in-process goes through PyAV instead):
quiet, no stdin, overwriting, bounded in time, its error lines kept for the errors table."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import InternalError

# What ffmpeg exits with when it caught SIGTERM or SIGINT and stopped (errors exit 1).
SIGNALLED = 255


@dataclass(frozen=True)
class FfmpegRun:
    returncode: int | None  # None: stopped at the timeout
    errors: list[str]  # what ffmpeg printed at log level "error"
    timeout_s: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    @property
    def reason(self) -> str:
        """Why it failed, in one line: the timeout, or ffmpeg's last error line or exit code."""
        if self.timed_out:
            return f"ffmpeg took over {self.timeout_s:.0f}s"
        return self.errors[-1] if self.errors else f"ffmpeg exit {self.returncode}"


def run_ffmpeg(args: Sequence[str], timeout_s: float) -> FfmpegRun:
    """``ffmpeg <args>`` (the arguments after the binary, e.g. an ffmpeg-python graph's
    ``get_args()``), killed after ``timeout_s``. An ffmpeg that a signal stopped (a SLURM job
    ended by its walltime or preempted, the OOM killer) says nothing of the media: InternalError,
    which the next run retries."""
    cmd = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y", *args]
    try:
        result = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return FfmpegRun(None, [], timeout_s)
    if result.returncode < 0:
        raise InternalError(f"ffmpeg was stopped by {signal.Signals(-result.returncode).name}")
    if result.returncode == SIGNALLED:
        raise InternalError(f"ffmpeg was stopped by a signal (it exits {SIGNALLED} then)")
    errors = result.stderr.decode(errors="replace").strip().splitlines()
    return FfmpegRun(result.returncode, errors, timeout_s)
