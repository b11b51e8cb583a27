"""``vlcorpus check``: whether a build of a config could start, and what it would do, without a
build and without writing anything.

It loads the config as ``build`` does, then runs what a build checks before any work (every
stage's setup check: extras, models, binaries, credentials; the root: reachable, and creatable
without creating it), and prints the plan of pipeline/compose/plan.py. Unlike a build, which stops
at the first problem, it reports every problem, each the build's own line. It downloads no
model: one a build would download on first use is a warning, one that cannot be had a problem.

JSON shape (``--json``): ``{"config": str, "root": str, "ready": bool, "problems": [str],
"lock": str | None, ...}`` plus the plan's keys (pipeline/compose/plan.py), whose ``warnings``
here also name each model a build would download on first use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.common import _error, app
from pipeline.config import Config, ConfigError, load_config
from pipeline.progress import setup_logging, stdout_console


@app.command()
def check(
    config: Annotated[Path, typer.Argument(help="YAML config file.", exists=True, dir_okay=False)],
    root: Annotated[str | None, typer.Option(help="Corpus root (path or fsspec URL).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object (shape: pipeline/cli/check.py).")] = False,
) -> None:
    """Check CONFIG as a build would before any work and say what the build would do; writes
    nothing. Exit 0 when a build could start, 2 with one line per problem otherwise."""
    setup_logging("quiet")
    try:
        cfg = load_config(config)
        url = cfg.corpus_root(root)
    except (ConfigError, ValueError) as exc:
        _error(exc)
        raise typer.Exit(2) from None
    result = {"config": str(config), **_check(cfg, url)}
    if json_out:
        print(json.dumps(result))
    else:
        _print(result, f"vlcorpus build {config}" + (f" --root {root}" if root else ""))
    for problem in result["problems"]:
        _error(problem)
    if result["problems"]:
        raise typer.Exit(2)


def _check(cfg: Config, url: str) -> dict[str, Any]:
    from pipeline.compose.plan import build_plan
    from pipeline.graph import ORDER
    from pipeline.corpus.rootlock import RootLock, stale_reason
    from pipeline.setup import root_problem, stage_problems
    from pipeline.compose.stages import parts
    from pipeline.corpus.storage import Corpus, LayoutError

    corpus = Corpus(url)
    unreachable = root_problem(corpus)
    problems = [unreachable] if unreachable else []
    try:
        plan = build_plan(cfg, None if unreachable else corpus)
    except LayoutError as exc:
        problems.append(str(exc))
        plan = build_plan(cfg, None)
    # The stages of a full build, as `vlcorpus build` checks them (flows/build.py, run_build);
    # a model the build would download on first use is a warning.
    stage_lines, downloads = stage_problems(cfg, [part for name in ORDER for part in parts(name, cfg)])
    problems += stage_lines
    plan["warnings"] += downloads
    holder = None if unreachable else RootLock(url, "vlcorpus check").holder()
    lock = holder.describe() if holder is not None and stale_reason(holder) is None else None
    return {"root": url, "ready": not problems, "problems": problems, "lock": lock, **plan}


def _print(result: dict[str, Any], build: str) -> None:
    out = stdout_console()

    def line(text: str, style: str | None = None) -> None:
        out.print(text, style=style, soft_wrap=True, markup=False, highlight=False)

    partitions = result["partitions"]
    line(f"config: {result['config']}")
    line(f"root: {result['root']}")
    line(f"partitions: {partitions['count']} ({partitions['from']})" if partitions["count"]
         else f"partitions: {partitions['from']}")
    for stage in result["stages"]:
        if stage["skipped"]:
            line(f"{stage['name']:<10} skipped: {stage['skipped']}")
            continue
        settings = "; ".join(f"{key}: {', '.join(value) if isinstance(value, list) else value}"
                             for key, value in stage["settings"].items())
        line(f"{stage['name']:<10} {settings}")
        for part, counts in (stage["todo"] or {}).items():
            final = f", {counts['final']} failed for good" if counts["final"] else ""
            line(f"{'':<10} {part}: {counts['todo']} to do of {counts['upstream']}{final}")
    line("health: " + ", ".join(f"{key} {value}" for key, value in result["health"].items()))
    if result["lock"]:
        line(f"the root is held by {result['lock']}: a build started now waits for it", "yellow")
    for warning in result["warnings"]:
        line(f"warning: {warning}", "yellow")
    if result["ready"]:
        line(f"a build could start: {build}", "green")
