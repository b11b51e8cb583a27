"""``vlcorpus train`` and ``vlcorpus eval``: the retrieval model on a corpus's features."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import Root, _error, _on_target, app
from pipeline.errors import SetupError

Device = Annotated[str, typer.Option(help="auto, cpu or cuda.")]
Pairs = Annotated[str | None, typer.Option(help="An external pairs file (parquet) instead of "
                                                 "the corpus's features; its columns: docs/training.md.")]
Shards = Annotated[str | None, typer.Option(help="Read features from shards (a WebDataset or "
                                                  "Parquet shard folder) instead of the tables.")]
EvalOn = Annotated[str, typer.Option("--eval-on", help="test: the test split (an error when there is "
                                     "none); all: every pair, training pairs included, recorded as "
                                     "split: all in metrics.json.")]


def _require_training() -> None:
    from pipeline.setup import require_package

    try:
        require_package("torch", "training", extra="train")
    except SetupError as exc:
        _error(exc)
        raise typer.Exit(2) from None


@app.command()
def train(
    target: Annotated[str, typer.Argument(help="A config file or a corpus root.")],
    root: Root = None,
    out: Annotated[Path | None, typer.Option(help="Checkpoints and metrics (default: "
                                                  "ROOT/train/<model>).")] = None,
    device: Device = "auto",
    resume: Annotated[bool, typer.Option(help="Continue from the newest checkpoint (--no-resume: start over, the "
                                               "previous run's checkpoints removed).")] = True,
    pairs: Pairs = None,
    shards: Shards = None,
    eval_on: EvalOn = "test",
) -> None:
    """Train the config's retrieval model on a corpus's features; prints metrics.json."""
    _require_training()
    from pipeline.train.run import train_corpus

    metrics = _on_target(target, root, lambda corpus, cfg: train_corpus(
        corpus, cfg, out, device=device, resume=resume, pairs_file=pairs, shards=shards, eval_on=eval_on))
    print(json.dumps({k: v for k, v in metrics.items() if k != "curve"}, default=str))


@app.command(name="eval")
def evaluate(
    target: Annotated[str, typer.Argument(help="A config file or a corpus root.")],
    checkpoint: Annotated[Path | None, typer.Option(help="Training folder or .pt file "
                                                         "(default: ROOT/train/<model>).")] = None,
    root: Root = None,
    device: Device = "auto",
    pairs: Pairs = None,
    shards: Shards = None,
    eval_on: EvalOn = "test",
) -> None:
    """Evaluate a trained retrieval model on the test split; prints its metrics."""
    _require_training()
    from pipeline.train.run import evaluate_corpus

    metrics = _on_target(target, root, lambda corpus, cfg: evaluate_corpus(
        corpus, cfg, checkpoint, device=device, pairs_file=pairs, shards=shards, eval_on=eval_on))
    print(json.dumps(metrics, default=str))
