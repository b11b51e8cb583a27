"""Whether a build's train step trains: what the checkpoint in ``train/<model>/`` was trained on,
recorded beside it (``trained_on.json``), against what the corpus holds now.

Training costs hours at scale, and a new checkpoint has the score stage score every clip again
(while shards already written keep the scores they were written with). So a build trains when
there is no checkpoint, when the train section changed, or, when ``train.retrain_growth`` is set,
when the pairs grew or shrank by that fraction or more since the checkpoint was trained (0: on
any change of the tables it read); otherwise the checkpoint is kept and only new clips are scored.
The inputs are measured without reading the tables' files: a fingerprint of the clips and
feature tables from one recursive listing each, the pairs from the partitions' summaries (row
counts). A checkpoint the record does not name (a training cut off, one from before records, or
one ``vlcorpus train`` made) is resumed, which finishes it or only evaluates it, then recorded.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pipeline import graph
from pipeline.corpus import partsummary, summary
from pipeline.config import Config, TrainConfig
from pipeline.ids import feature_key
from pipeline.score.stage import trained_checkpoint_id
from pipeline.corpus.storage import Corpus

RECORD = "trained_on.json"


@dataclass(frozen=True)
class Decision:
    """What the train step does: nothing (``train`` false), or train, from scratch when
    ``start_over``, else resuming the checkpoints there; ``inputs`` are recorded once it trained."""

    train: bool
    start_over: bool
    reason: str
    inputs: dict[str, Any]


def decide(corpus: Corpus, cfg: Config, folder: str) -> Decision:
    """Whether to train ``cfg.train`` into ``folder`` (``train/<model>``), and why."""
    train = cfg.train
    assert train is not None
    checkpoint = trained_checkpoint_id(corpus, train.model)
    then = _recorded(corpus, folder) or {}
    tables = input_tables(train)
    inputs = {"config": _settings(train), "fingerprint": _fingerprint(corpus, tables)}
    name = (checkpoint or "").split("#")[0].removeprefix("file:")
    pairs = None
    if checkpoint is None:
        start, why = True, "no checkpoint yet"
    elif then.get("checkpoint") != checkpoint:
        start, why = False, f"no record of what {name} was trained on: resumed"
    elif then.get("config") != inputs["config"]:
        old = then.get("config") or {}
        changed = sorted(k for k in {*inputs["config"], *old} if inputs["config"].get(k) != old.get(k))
        start, why = True, f"the train section changed since {name} was trained ({', '.join(changed)})"
    elif then.get("fingerprint") == inputs["fingerprint"]:
        return Decision(False, False, f"its inputs have not changed since {name} was trained", inputs)
    elif train.retrain_growth is None:
        return Decision(False, False, f"its tables changed since {name} was trained, and train.retrain_growth "
                        f"is unset: kept", inputs)
    else:
        pairs, before = count_pairs(corpus, tables), int(then.get("pairs") or 0)
        change = abs(pairs - before) / max(before, 1)
        how = f"the pairs went from {before} to {pairs} ({change:.1%}) since {name} was trained"
        if change < train.retrain_growth:
            return Decision(False, False, f"{how}, under train.retrain_growth ({train.retrain_growth:.1%}): "
                            f"kept", inputs)
        start, why = True, f"{how}, train.retrain_growth {train.retrain_growth:.1%}"
    return Decision(True, start, why, {**inputs, "pairs": count_pairs(corpus, tables) if pairs is None else pairs})


def start_over(corpus: Corpus, folder: str) -> None:
    """Remove the previous training's folder: resume would otherwise continue its checkpoints, and
    epochs beyond the new run's last would outlive it as the newest."""
    path = corpus.path(folder)
    if corpus.fs.exists(path):
        corpus.fs.rm(path, recursive=True)


def record(corpus: Corpus, cfg: Config, folder: str, decision: Decision) -> None:
    """Record, once training succeeded, the checkpoint it selected and what it was trained on."""
    assert cfg.train is not None
    doc = {"checkpoint": trained_checkpoint_id(corpus, cfg.train.model), **decision.inputs,
           "time": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())}
    corpus.write_text(posixpath.join(folder, RECORD), json.dumps(doc, indent=2, sort_keys=True) + "\n")


def input_tables(train: TrainConfig) -> list[str]:
    """The tables training reads its pairs from: clips and the features of its extractors."""
    names = [*train.visual_names, train.text]
    return ["clips", *(f"{graph.FEATURES}/{feature_key(n)}" for n in dict.fromkeys(names))]


def count_pairs(corpus: Corpus, tables: list[str]) -> int:
    """Clips with a row in every table, at most: per partition the fewest rows of the tables, from
    the partitions' summaries (only a partition whose summary is stale is read, its footers)."""
    found = partsummary.gather(corpus, {summary.SECTION: summary.partition_figures}, write=True)
    total = 0
    for sections in found.values():
        rows = sections[summary.SECTION]["tables"]
        total += min(rows.get(t, {}).get("rows", 0) for t in tables)
    return total


def _settings(train: TrainConfig) -> dict[str, Any]:
    # retrain_growth decides when to train, not what: changing it alone trains nothing.
    return train.model_dump(mode="json", exclude={"retrain_growth"})


def _fingerprint(corpus: Corpus, tables: list[str]) -> str:
    with ThreadPoolExecutor(len(tables)) as pool:
        prints = partsummary.fingerprints(corpus, pool, tables)
    return hashlib.sha256(json.dumps(prints, sort_keys=True).encode()).hexdigest()[:16]


def _recorded(corpus: Corpus, folder: str) -> dict[str, Any] | None:
    path = corpus.path(folder, RECORD)
    if not corpus.fs.exists(path):
        return None
    try:
        doc = json.loads(corpus.fs.cat(path))
    except ValueError:  # cut off: as if none, so the checkpoint is resumed and recorded again
        return None
    return doc if isinstance(doc, dict) else None
