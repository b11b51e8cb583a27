"""A build's setup checks (``stages.check_build``) in an interpreter of their own, for the
command line: they load what the stages need (torch and each extractor's model, a Whisper
model, a transformers model), about 700 MB that the command's process, which runs the flow and
reads the corpus's summaries for the whole build, would otherwise hold to its end. Their log
records come back to this process, which logs them as its own, and a problem is a SetupError
here as it would be there."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from pipeline.config import Config
from pipeline.errors import SetupError
from pipeline.progress import log


class ChecksApart:
    """``check_build(cfg, until, stage)`` started in a new interpreter, so that its seconds
    overlap what the caller does meanwhile (the command line: Prefect's server starting, the
    flows imported); ``wait`` for its verdict."""

    def __init__(self, cfg: Config, until: str | None = None, stage: str | None = None) -> None:
        # Its standard error is this process's: the libraries' own warnings, and a traceback.
        self.process = subprocess.Popen([sys.executable, "-m", "pipeline.compose.checks"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        request = json.dumps({"config": cfg.model_dump(mode="json"), "until": until, "stage": stage})
        with self.process.stdin:  # read whole before the child writes a byte: no deadlock
            self.process.stdin.write(request)

    def wait(self) -> None:
        """The checks' log records, logged here; a problem raised as the SetupError it was."""
        with self.process.stdout:
            out = self.process.stdout.read()
        if self.process.wait():
            raise RuntimeError(f"the setup checks' process ended with exit code {self.process.returncode}")
        answer = json.loads(out.splitlines()[-1])
        for level, message in answer["records"]:
            log.log(level, "%s", message)
        if answer["problem"] is not None:
            raise SetupError(answer["problem"])

    def stop(self) -> None:
        """No verdict wanted (the build stops before it): the process ended, if it still runs."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdout.close()


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))


def main() -> None:
    """The checks of the request on standard input; their records and problem on standard
    output, as one JSON line."""
    from pipeline.compose.stages import check_build

    request = json.loads(sys.stdin.read())
    kept = _Kept()
    log.addHandler(kept)
    log.setLevel(logging.INFO)
    log.propagate = False
    problem = None
    try:
        check_build(Config.model_validate(request["config"]), request["until"], request["stage"])
    except SetupError as exc:
        problem = str(exc)
    print(json.dumps({"records": kept.records, "problem": problem}))


if __name__ == "__main__":
    main()
