"""The stage graph, declared once: the stages in build order, what each reads and writes, and
whether it runs once per corpus or once per partition. Storage's table list, validate's
lineage, the flows and the splits all read it from here.

Item keys come from the output tables' schemas (``schemas.tables.key_column``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SPLITS: tuple[str, ...] = ("train", "val", "test")
FEATURES = "features"  # features/<extractor key>: one table per extractor
SCORES = "scores"  # scores/<model key>: one table per score model
# Table families: one table per member, ``<family>/<key>``, each written by the stage
# ``<stage>:<key>`` (featurize:resnet34 writes features/resnet34, score:wal writes scores/wal).
FAMILIES: dict[str, str] = {FEATURES: "featurize", SCORES: "score"}


@dataclass(frozen=True)
class StageSpec:
    name: str
    inputs: tuple[str, ...]
    output: str | None  # the table it writes; None when its output is not a table
    scope: Literal["corpus", "partition"]
    media: bool = False  # reads the videos' media files (they must be on disk)


GRAPH: tuple[StageSpec, ...] = (
    StageSpec("discover", (), "videos", "corpus"),
    StageSpec("download", ("videos",), "downloads", "partition"),
    StageSpec("transcribe", ("downloads",), "segments", "partition", media=True),
    StageSpec("align", ("segments", "downloads", "videos"), "clips", "partition"),
    StageSpec("featurize", ("clips", "downloads"), FEATURES, "partition", media=True),
    StageSpec("shard", ("clips", FEATURES), None, "partition", media=True),
    StageSpec("train", ("clips", FEATURES), None, "corpus"),
    # After train: the trained model (or the MIL-NCE checkpoint) scores every clip's pair. A
    # partition stage that a build runs as a pass of its own once train is done (flows/build.py).
    StageSpec("score", ("clips", FEATURES), SCORES, "partition"),
    # Last, so that the page shows this build's training and scores too.
    StageSpec("report", ("videos", "downloads", "segments", "clips", FEATURES, SCORES), None, "corpus"),
)
ORDER: tuple[str, ...] = tuple(spec.name for spec in GRAPH)
SPECS: dict[str, StageSpec] = {spec.name: spec for spec in GRAPH}
# The stages a partition goes through, in order, in a pipelined build; score, which needs the
# trained model, comes after the corpus-wide train step instead.
AFTER_TRAIN: tuple[str, ...] = ("score",)
PARTITION_STAGES: tuple[str, ...] = tuple(s.name for s in GRAPH if s.scope == "partition"
                                          and s.name not in AFTER_TRAIN)

# Every per-video table is stored partition by partition; errors too (corpus-level errors in
# the ``corpus`` partition).
ERRORS = "errors"
TABLES: tuple[str, ...] = tuple(s.output for s in GRAPH if s.output and s.output not in FAMILIES) + (ERRORS,)

# Columns that identify a row: duplicates mean a rerun duplicated work; compaction sorts by them.
PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "videos": ("video_id",),
    "downloads": ("video_id",),
    "segments": ("video_id", "index"),
    "clips": ("clip_id",),
    FEATURES: ("clip_id",),
    SCORES: ("clip_id",),
    ERRORS: ("stage", "item_id", "attempt", "time"),
}

# (stage, upstream table, downstream table): every upstream key is done downstream or is in the
# stage's errors. Family tables add theirs (`family_lineage`): ("featurize:<key>", "clips",
# "features/<key>"), ("score:<key>", "clips", "scores/<key>").
LINEAGE: tuple[tuple[str, str, str], ...] = (
    ("download", "videos", "downloads"),
    ("transcribe", "downloads", "segments"),
    ("align", "segments", "clips"),
)


def base(table: str) -> str:
    """``features/resnet34`` -> ``features``."""
    return table.split("/", 1)[0]


def family_lineage(table: str) -> tuple[str, str, str] | None:
    """(stage, upstream, table) of a family table (``scores/wal`` -> ``score:wal`` from clips);
    None for other tables."""
    family, _, key = table.partition("/")
    if family not in FAMILIES or not key:
        return None
    return (f"{FAMILIES[family]}:{key}", "clips", table)


def check_name(name: str) -> str:
    if name not in SPECS:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(ORDER)}")
    return name


def stages_until(until: str | None) -> list[str]:
    """Stage names from the first up to and including ``until`` (all when None)."""
    if until is None:
        return list(ORDER)
    return list(ORDER[: ORDER.index(check_name(until)) + 1])
