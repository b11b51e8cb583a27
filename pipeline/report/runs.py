"""What the report reads besides the tables: the newest build's timing (``runs/build/``), the
shard listings (``shards/<format>/index.json``) and the training runs (``train/<model>/``)."""

from __future__ import annotations

import json
import posixpath
from typing import Any

from pipeline.graph import AFTER_TRAIN, ORDER, SPLITS
from pipeline.shards.index import FORMATS, listing_path, load_listing
from pipeline.corpus.storage import Corpus

# A part's items and how its throughput reads: (noun, factor, unit).
_RATES = {
    "download": ("videos", 60.0, "videos/min"),
    "transcribe": ("videos", 1.0, "videos/s"),
    "align": ("videos", 1.0, "videos/s"),
    "featurize": ("clips", 1.0, "clips/s"),
    "shard": ("clips", 1.0, "clips/s"),
    "score": ("clips", 1.0, "clips/s"),
}
KS = (1, 5, 10)
MC_CHOICES = 5  # Torabi's multiple-choice test: 1 true caption, 4 distractors
SUBSET_SIZE = 1000  # the subsets protocol's set size (pipeline/train/evaluation.py)


def _json(corpus: Corpus, path: str) -> Any:
    return json.loads(corpus.fs.cat(path))


def build_timing(corpus: Corpus) -> dict[str, Any] | None:
    """Per part of the newest build: wall and task seconds, partitions, workers, items done
    and failed, and throughput (videos/min for download, clips/s for each featurize extractor,
    items/s else). Times are per stage: featurize's extractors share theirs (``shared``). A
    build that scores has a second partition pass after train (``after_train``): score, and
    shard again for the clips that waited for their scores (its first pass kept under
    ``first_pass``)."""
    paths = sorted(corpus.fs.glob(corpus.path("runs/build/*.json")))
    if not paths:
        return None
    record = _json(corpus, paths[-1])
    rows = []
    for name, part in record.get("stages", {}).items():
        stage = name.split(":", 1)[0]
        # A pass that did not run (score without its model) holds why: "skipped".
        if stage not in _RATES or not isinstance(part, dict) or "skipped" in part:
            continue
        if isinstance(part.get("first_pass"), dict):
            rows.append(_timing_row(f"{name} (first pass)", stage, part["first_pass"], False))
            rows.append(_timing_row(f"{name} (after score)", stage, part, True))
        else:
            rows.append(_timing_row(name, stage, part, stage in AFTER_TRAIN))
    # In the order they ran: the first pass in stage order; the pass after train runs score,
    # then shard again.
    rows.sort(key=lambda r: (r["after_train"], r["after_train"] and r["stage"] not in AFTER_TRAIN,
                             ORDER.index(r["stage"]), r["part"]))
    for row in rows:  # featurize's extractors run in the same tasks: their time is the stage's
        row["shared"] = sum((r["stage"], r["after_train"]) == (row["stage"], row["after_train"]) for r in rows) > 1
    return {"build": record.get("finished", posixpath.basename(paths[-1])[:-5]),
            "file": posixpath.relpath(paths[-1], corpus.path()), "builds": len(paths), "stages": rows}


def _timing_row(label: str, stage: str, part: dict[str, Any], after_train: bool) -> dict[str, Any]:
    noun, factor, unit = _RATES[stage]
    wall, done = part.get("wall_seconds") or 0.0, part.get("ok", 0)
    return {
        "part": label, "stage": stage, "after_train": after_train, "noun": noun,
        "wall_s": wall, "task_s": part.get("task_seconds") or 0.0,
        "partitions": part.get("partitions", 0), "workers": part.get("workers", []),
        "items": part.get("items", 0), "done": done, "failed": sum(part.get("errors", {}).values()),
        "skipped": part.get("skipped_done", 0),
        "rate": round(done / wall * factor, 3) if wall > 0 and done else None, "unit": unit,
        "stopped": part.get("stopped"),
    }


def _split_key(split: str) -> tuple[int, str]:
    return (SPLITS.index(split) if split in SPLITS else len(SPLITS), split)


def _in_split_order(counts: dict[str, int]) -> dict[str, int]:
    return {split: counts[split] for split in sorted(counts, key=_split_key)}


def shard_listing(corpus: Corpus) -> dict[str, dict[str, Any]]:
    """Per format with a listing: per split, shard files, samples and bytes, and the totals."""
    out = {}
    for fmt in FORMATS:
        if not corpus.fs.exists(corpus.path(listing_path(fmt))):
            continue
        splits: dict[str, dict[str, int]] = {}
        for entry in load_listing(corpus, fmt):
            row = splits.setdefault(entry["split"], {"files": 0, "samples": 0, "bytes": 0})
            row["files"] += 1
            row["samples"] += entry["count"]
            row["bytes"] += entry["bytes"]
        order = sorted(splits, key=_split_key)
        total = {key: sum(row[key] for row in splits.values()) for key in ("files", "samples", "bytes")}
        out[fmt] = {"folder": f"shards/{fmt}", "splits": [{"split": s, **splits[s]} for s in order],
                    "total": total}
    return out


def training_runs(corpus: Corpus) -> list[dict[str, Any]]:
    """Each ``train/<model>/``: from its metrics.json, the model, its features and pairs, the
    test metrics with chance levels, and the curve; with ``skipped.json`` (the newest build
    had too little data to train), why."""
    folders = sorted({posixpath.dirname(path) for name in ("metrics.json", "skipped.json")
                      for path in corpus.fs.glob(corpus.path("train", "*", name))})
    runs = []
    for folder in folders:
        relative = posixpath.relpath(folder, corpus.path())
        name = posixpath.basename(folder)
        try:
            skipped = _optional_json(corpus, posixpath.join(folder, "skipped.json"))
            metrics = _optional_json(corpus, posixpath.join(folder, "metrics.json"))
        except (OSError, ValueError) as exc:  # written by hand, or cut off
            runs.append(_problem(name, relative, f"unreadable: {exc}"))
            continue
        skip = skipped.get("reason", "") if skipped else None
        if metrics is None:
            runs.append(_problem(name, relative, f"training was skipped: {skip}"))
        else:
            runs.append({**_training_run(name, relative, metrics), "skipped": skip})
    return runs


def _optional_json(corpus: Corpus, path: str) -> Any:
    return _json(corpus, path) if corpus.fs.exists(path) else None


def _problem(name: str, folder: str, problem: str) -> dict[str, Any]:
    return {"model": name, "folder": folder, "problem": problem, "directions": []}


def _training_run(name: str, folder: str, metrics: dict[str, Any]) -> dict[str, Any]:
    config = metrics.get("config") or {}
    data = metrics.get("data") or {}
    protocol = metrics.get("protocol") or ""
    n = SUBSET_SIZE if protocol.startswith("subsets") else metrics.get("n_test") or 0
    visual = config.get("visual")
    directions = [{"direction": d, "label": label, **{k: metrics[d].get(k) for k in (*(f"R@{k}" for k in KS), "medR")}}
                  for d, label in (("t2v", "text → video"), ("v2t", "video → text")) if d in metrics]
    chance = ({**{f"R@{k}": min(100.0, 100.0 * k / n) for k in KS}, "medR": (n + 1) / 2} if n else None)
    selected = metrics.get("selected") or {}
    return {
        "model": config.get("model", name), "folder": folder, "problem": None,
        "visual": [visual] if isinstance(visual, str) else list(visual or []),
        "text": config.get("text"),
        "config": {k: config[k] for k in ("epochs", "batch_size", "lr", "embed_dim", "select", "eval_protocol",
                                          "finetune", "seed") if k in config},
        "source": data.get("source"), "pairs": _in_split_order(data.get("pairs") or {}),
        "dims": [data["visual_dim"], data["text_dim"]] if "visual_dim" in data else None,
        "split": metrics.get("split"), "n_test": metrics.get("n_test"), "protocol": protocol,
        "protocol_note": metrics.get("protocol_note"), "directions": directions, "chance": chance,
        "mc_acc": metrics.get("mc_acc"), "mc_chance": 100.0 / MC_CHOICES,
        "selected": {"by": selected.get("by"), "epoch": selected.get("epoch")},
        "device": metrics.get("device"),
        "curve": [{"epoch": p["epoch"], "loss": p.get("loss"), "val": p.get("val"), "z0_share": p.get("z0_share")}
                  for p in metrics.get("curve") or []],
    }
