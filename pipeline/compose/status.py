"""`vlcorpus status`: per stage, the items upstream, done, failed by kind, and to do.

The figures are the runner's own planning (``runner.key_sets``: input keys − done keys − final
failures, with Arrow, over key columns), partition by partition, so status and a build agree on
what is left and memory follows one partition, not the corpus. Each partition's figures are kept
in its summary (pipeline/corpus/partsummary.py) and rescanned only where the partition's files
or the config changed since. A build chooses the partitions it has work for from the same
figures (``idle_partitions``): this module is the one home of what a corpus has left to do.
Nothing is written and no lock is taken: status reads committed files only, as planning does,
and may run while a build writes. A file that a compaction replaces between the listing and the
read is read again from a fresh listing.

JSON shape (``vlcorpus status ROOT --json``)::

    {"root": str, "partitions": int,
     "stages": {"download": COUNTS, "transcribe": COUNTS, "align": COUNTS,
                "featurize:<extractor>": COUNTS, ..., "shard": COUNTS,
                "score:<model>": COUNTS},            # with a score section
     "corpus_errors": {step: {kind: items}},         # discover, report, train
     "network_down": null | {"run": str, "left": int, "message": str},
                                                     # the newest download run stopped on an outage
     "by_partition": {"00000": {stage: COUNTS}}}     # only with --partitions

    COUNTS = {"table": str,        # what the stage writes (shards: the shard index)
              "upstream": int,     # distinct keys of its input table
              "done": int,         # done, and not to be done again
              "failed": {kind: int},  # not done, by the kind of the last failure
              "final": int,        # failed for good (permanent, bad_input): a build skips
                                   # them, `build --retry-failed` retries them
              "todo": int}         # what the next build runs: upstream - done - final;
                                   # transient and blocked failures are counted here too

Stages are in build order; per-partition stages only (discover, report and train run once
per corpus: their failures are under ``corpus_errors``).
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

from pipeline import graph
from pipeline.compose.stages import context, parts
from pipeline.corpus import partitions, partsummary
from pipeline.config import Config
from pipeline.errors import ErrorKind
from pipeline.runner import FINAL_KINDS, KeySets, Stage, StageContext, key_sets
from pipeline.progress import stdout_console
from pipeline.score.stage import checkpoint_id
from pipeline.corpus.storage import Corpus

# Final kinds first, then those a build tries again.
KINDS: tuple[str, ...] = FINAL_KINDS + tuple(k.value for k in ErrorKind if k.value not in FINAL_KINDS)
SECTION = "status"
# Config sections and settings that change no stage's counts (see ``status_key``). Retraining
# changes them through the checkpoint, which the key holds, so the setting that decides when is out.
_NOT_IN_STATUS: dict[str, Any] = {**dict.fromkeys(("name", "root", "sources", "filters", "download", "execution",
                                                   "health"), True), "train": {"retrain_growth": True}}


@dataclass
class Counts:
    """One stage's figures, for a partition or summed over several."""

    table: str
    upstream: int = 0
    done: int = 0
    todo: int = 0
    failed: dict[str, int] = field(default_factory=dict)

    @property
    def final(self) -> int:
        return sum(n for kind, n in self.failed.items() if kind in FINAL_KINDS)

    def add(self, other: Counts) -> None:
        self.upstream += other.upstream
        self.done += other.done
        self.todo += other.todo
        for kind, n in other.failed.items():
            self.failed[kind] = self.failed.get(kind, 0) + n

    def as_dict(self) -> dict[str, Any]:
        failed = {k: self.failed[k] for k in sorted(self.failed, key=_kind_order)}
        return {"table": self.table, "upstream": self.upstream, "done": self.done,
                "failed": failed, "final": self.final, "todo": self.todo}


def _kind_order(kind: str) -> tuple[int, str]:
    return (KINDS.index(kind) if kind in KINDS else len(KINDS), kind)


def counts_of(stage: Stage, sets: KeySets) -> Counts:
    """A partition's figures from its key sets. Each item not done that has errors rows counts
    once, under the kind of its last final failure, else of its last failure."""
    open_keys = pc.filter(sets.keys, pc.invert(sets.done))
    errors = sets.errors.filter(pc.is_in(sets.errors.column("item_id"), value_set=open_keys))
    failed: dict[str, int] = {}
    if errors.num_rows:
        errors = errors.append_column("final", pc.is_in(errors.column("kind"), pa.array(FINAL_KINDS)))
        errors = errors.sort_by([("item_id", "ascending"), ("final", "ascending"), ("attempt", "ascending")])
        last = errors.group_by("item_id", use_threads=False).aggregate([("kind", "last")])
        for entry in pc.value_counts(last.column("kind_last")).to_pylist():
            failed[entry["values"]] = entry["counts"]
    done = pc.sum(sets.done).as_py() or 0
    return Counts(stage.output, upstream=len(sets.keys), done=done, todo=len(sets.todo), failed=failed)


def partition_counts(stage: Stage, ctx: StageContext, partition: str) -> Counts:
    """One stage's figures in one partition, as the runner would plan it (without
    --retry-failed)."""
    return counts_of(stage, key_sets(stage, ctx, partition))


def counts_from(data: dict[str, Any]) -> Counts:
    """Counts from their ``as_dict``."""
    return Counts(data["table"], upstream=data["upstream"], done=data["done"], todo=data["todo"],
                  failed=dict(data["failed"]))


def partition_stages(cfg: Config) -> list[Stage]:
    """The per-partition runner stages of a config, in build order (featurize: one per
    extractor; score, when the config has it, after the others as in a build)."""
    return [part for name in (*graph.PARTITION_STAGES, *graph.AFTER_TRAIN) for part in parts(name, cfg)
            if isinstance(part, Stage)]


def corpus_errors(corpus: Corpus) -> dict[str, dict[str, int]]:
    """Failures of the corpus-wide steps (discover, report, train), items by step and kind."""
    if partitions.CORPUS not in corpus.partitions_of(graph.ERRORS):
        return {}
    data = corpus.read(graph.ERRORS, columns=["stage", "kind", "item_id"], partition=partitions.CORPUS)
    found: dict[str, dict[str, int]] = {}
    for row in data.group_by(["stage", "kind"]).aggregate([("item_id", "count_distinct")]).to_pylist():
        found.setdefault(row["stage"], {})[row["kind"]] = row["item_id_count_distinct"]
    return {step: dict(sorted(kinds.items(), key=lambda kv: _kind_order(kv[0])))
            for step, kinds in sorted(found.items())}


def network_down(corpus: Corpus) -> dict[str, Any] | None:
    """When the newest download run stopped because the network was down: when it began, the
    videos it left to do, and its message (from its figures in ``runs/download/``)."""
    paths = sorted(corpus.fs.glob(corpus.path("runs/download/*.json")))
    figures = json.loads(corpus.fs.cat(paths[-1])) if paths else {}
    if not figures.get("network_down"):
        return None
    return {"run": figures["started"], "left": figures["left"], "message": figures["stopped"]}


def status_section(ctx: StageContext) -> partsummary.Section:
    """Status's section of a partition's summary: every per-partition stage's counts."""
    stages = partition_stages(ctx.config)
    return lambda corpus, partition: {stage.name: partition_counts(stage, ctx, partition).as_dict()
                                      for stage in stages}


def status_key(corpus: Corpus, cfg: Config) -> str:
    """What status's section depends on besides the partition's files: the settings that decide
    the stages and what they must do again (not those of how a build runs, what it discovers or
    how it downloads, so that a config tuned between builds keeps the summaries), and the score
    model's weights (a new model's clips are scored again)."""
    settings = cfg.model_dump(mode="json", exclude=_NOT_IN_STATUS)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return f"{digest}:{checkpoint_id(corpus, cfg) if cfg.score_model else ''}"


def partition_status(corpus: Corpus, cfg: Config, rescan: bool = True,
                     prints: dict[str, str] | None = None) -> dict[str, dict[str, Counts]]:
    """``{partition: {stage: Counts}}`` from the partitions' summaries, the partitions whose
    summary is missing or stale rescanned (without ``rescan``: left out); ``prints``: the
    partitions' fingerprints, when taken already."""
    found = partsummary.gather(corpus, {SECTION: status_section(context(corpus, cfg))},
                               labels=corpus.labels(), keys={SECTION: status_key(corpus, cfg)},
                               rescan=rescan, prints=prints)
    return {label: {name: counts_from(c) for name, c in sections[SECTION].items()}
            for label, sections in found.items()}


def idle_partitions(corpus: Corpus, cfg: Config, stages: list[str],
                    retry_failed: bool = False) -> dict[str, dict[str, Counts]]:
    """The partitions whose summary is fresh and says that none of ``stages`` (part names:
    ``featurize:resnet34``) has anything to do, with their counts: a build runs no task for
    them. Decided from the summaries alone; a partition without a fresh one has work, unless it
    holds no file in any table (discover put no video there: a fresh root's, or a small corpus
    in many partitions), which has nothing to do and counts nothing."""
    with ThreadPoolExecutor(partsummary.WORKERS) as pool:
        held = partsummary.fingerprints(corpus, pool)
    found = partition_status(corpus, cfg, rescan=False, prints=held)
    idle = {label: counts for label, counts in found.items()
            if all(name in counts and not counts[name].todo and not (retry_failed and counts[name].final)
                   for name in stages)}
    outputs = {stage.name: stage.output for stage in partition_stages(cfg)}
    for label in set(corpus.labels()) - set(found) - set(held):
        idle[label] = {name: Counts(outputs.get(name, name)) for name in stages}
    return idle


def corpus_status(corpus: Corpus, cfg: Config, by_partition: bool = False) -> dict[str, Any]:
    """Every per-partition stage's figures over the corpus (and per partition when asked),
    from the partitions' summaries; the JSON shape is in this module's docstring."""
    totals = {stage.name: Counts(stage.output) for stage in partition_stages(cfg)}
    per_partition: dict[str, dict[str, Any]] = {}
    labels = corpus.labels()
    for label, stages in sorted(partition_status(corpus, cfg).items()):
        for name, counts in stages.items():
            totals[name].add(counts)
            if by_partition:
                per_partition.setdefault(label, {})[name] = counts.as_dict()
    status: dict[str, Any] = {
        "root": corpus.url, "partitions": len(labels),
        "stages": {name: counts.as_dict() for name, counts in totals.items()},
        "corpus_errors": corpus_errors(corpus),
        "network_down": network_down(corpus),
    }
    if by_partition:
        status["by_partition"] = per_partition
    return status


def _stage_table(title: str, first: str | None = None) -> Table:
    table = Table(title=title, caption="permanent, bad_input: final (build --retry-failed retries "
                                       "them); transient, blocked, internal: counted in 'to do' too")
    if first:
        table.add_column(first)
    table.add_column("stage")
    for name in ("upstream", "done", "to do", *KINDS):
        table.add_column(name, justify="right")
    return table


def _row(counts: dict[str, Any]) -> list[str]:
    return [str(counts["upstream"]), str(counts["done"]), str(counts["todo"]),
            *(str(counts["failed"].get(kind, 0) or "") for kind in KINDS)]


def print_status(status: dict[str, Any], console: Console | None = None) -> None:
    """The figures as rich tables: the corpus, then (with --partitions) every partition that
    has something to do or failed."""
    console = console or stdout_console()
    # The root on a line of its own: as a table title it would wrap at the table's width.
    console.print(f"{status['root']}: {status['partitions']} partitions", soft_wrap=True,
                  highlight=False, markup=False)
    table = _stage_table("stages")
    for name, counts in status["stages"].items():
        table.add_row(name, *_row(counts))
    console.print(table)
    if status["network_down"]:
        down = status["network_down"]
        console.print(f"the network was down: the download run of {down['run']} stopped with "
                      f"{down['left']} videos left to do ({down['message']})", style="red",
                      soft_wrap=True, highlight=False, markup=False)
    if status["corpus_errors"]:
        steps = Table(title="corpus-wide steps: failures")
        for name in ("step", "kind", "items"):
            steps.add_column(name, justify="right" if name == "items" else "left")
        for step, kinds in status["corpus_errors"].items():
            for kind, n in kinds.items():
                steps.add_row(step, kind, str(n))
        console.print(steps)
    if "by_partition" in status:
        open_rows = [(label, name, counts) for label, stages in status["by_partition"].items()
                     for name, counts in stages.items() if counts["todo"] or counts["failed"]]
        if not open_rows:
            console.print("every partition is complete")
            return
        table = _stage_table("partitions with items to do or failed", first="partition")
        for label, name, counts in open_rows:
            table.add_row(label, name, *_row(counts))
        console.print(table)
