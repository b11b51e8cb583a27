"""What a build of a config would do, read without writing anything (`vlcorpus check`): the
stages in build order with their key settings, the partitions, the health limits and, for a
root with tables, what is left of each stage (the figures of pipeline/compose/status.py).

JSON shape (part of ``vlcorpus check --json``)::

    {"partitions": {"count": int | None, "from": str},
     "stages": [{"name": str,                       # every stage, in build order
                 "skipped": str | None,             # why it would not run (train and score
                                                    # without their section, ...)
                 "settings": {str: str | list[str]},
                 "todo": {part: COUNTS} | None}],   # pipeline/compose/status.py's COUNTS, per part
                                                    # (featurize:<extractor>, ...); None for
                                                    # steps and for a root without tables
     "health": {limit: value},
     "warnings": [str]}
"""

from __future__ import annotations

import os
from typing import Any

from pipeline import graph
from pipeline.config import Config, ExtractorConfig, Source
from pipeline.runner import Stage
from pipeline.corpus.storage import Corpus

Settings = dict[str, str | list[str]]


def build_plan(cfg: Config, corpus: Corpus | None) -> dict[str, Any]:
    """What a full build of ``cfg`` would do; ``corpus`` None when the root cannot be read (its
    figures are then left out). A root this version cannot use raises LayoutError, as a build
    does."""
    from pipeline.compose.stages import parts

    recorded = corpus.recorded_partitions() if corpus is not None else None
    todo = _todo(cfg, corpus) if recorded else {}
    stages = []
    for name in graph.ORDER:
        found = parts(name, cfg)
        if not found:
            stages.append({"name": name, "skipped": SKIPPED[name], "settings": {}, "todo": None})
            continue
        stage_todo = {p.name: todo[p.name] for p in found if isinstance(p, Stage) and p.name in todo}
        stages.append({"name": name, "skipped": None, "settings": SETTINGS[name](cfg), "todo": stage_todo or None})
    return {"partitions": _partitions(cfg, corpus, recorded), "stages": stages,
            "health": cfg.health.model_dump(), "warnings": _missing_sources(cfg)}


def _partitions(cfg: Config, corpus: Corpus | None, recorded: int | None) -> dict[str, Any]:
    requested = cfg.execution.partitions
    if corpus is not None and recorded is not None:
        if requested is not None:
            # The build's own comparison (a LayoutError when they differ); it writes only to a
            # root without a count.
            corpus.init_partitions(requested)
        return {"count": recorded, "from": "ROOT/_corpus.json"}
    if requested is not None:
        return {"count": requested, "from": "execution.partitions"}
    return {"count": None, "from": "chosen by the first build from the number of videos discovered "
                                   "(pipeline/corpus/partitions.py: up to 8 for a small corpus, then one per "
                                   "1000 videos)"}


def _todo(cfg: Config, corpus: Corpus) -> dict[str, dict[str, Any]]:
    from pipeline.compose.status import corpus_status

    return corpus_status(corpus, cfg)["stages"]


def _source(source: Source) -> str:
    label = f"{source.type} {source.name}" if source.name else source.type
    if source.type == "search":
        queries = source.expanded_queries()
        return f"{label}: {_count(len(queries), 'query', 'queries')}, {source.per_query} results each"
    if source.type == "playlist":
        each = f", up to {source.max_videos} videos each" if source.max_videos else ""
        return f"{label}: {_count(len(source.urls), 'playlist or channel', 'playlists or channels')}{each}"
    if source.type == "urls":
        return f"{label}: {_count(len(source.urls), 'URL', 'URLs')}"
    return f"{label}: {source.path}"


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _missing_sources(cfg: Config) -> list[str]:
    """Local list files and folders that are not there: not a setup problem (the other sources
    still work, and discover records it as an error), but a build would find nothing in them."""
    return [f"sources[{i}]{f' ({s.name})' if s.name else ''}: {s.path} does not exist; discover would record "
            f"an error for it and find no videos there" for i, s in enumerate(cfg.sources)
            if s.type in ("list", "folder") and "://" not in s.path and not os.path.exists(s.path)]


def _discover(cfg: Config) -> Settings:
    filters = cfg.filters.model_dump(mode="json", exclude_defaults=True)
    return {"sources": [_source(s) for s in cfg.sources],
            **({"filters": [f"{k} {_words(v)}" for k, v in filters.items()]} if filters else {})}


def _words(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _download(cfg: Config) -> Settings:
    d = cfg.download
    kinds = [k for k, on in (("manual", d.manual_subtitles), ("auto", d.auto_subtitles)) if on]
    subtitles = f"{' and '.join(kinds) or 'none'} ({', '.join(d.subtitle_langs)})"
    out: Settings = {"format": d.format, "subtitles": subtitles, "concurrency": str(d.concurrency)}
    if d.rate_limit is not None:
        out["rate_limit"] = f"{d.rate_limit:g} requests a minute"
    if d.partial:
        out["partial"] = f"the listed sections only, {d.section_padding_s:g} s around each"
    return out


def _transcribe(cfg: Config) -> Settings:
    t = cfg.transcribe
    out: Settings = {"prefer": " > ".join(t.prefer)}
    if "asr" in t.prefer:
        out["asr"] = f"{t.asr.backend}, model {t.asr.model}" if t.asr.backend == "faster-whisper" else t.asr.backend
    return out


def _align(cfg: Config) -> Settings:
    a = cfg.align
    if a.policy == "fixed":
        clips = f"fixed, {a.length_s:g} s around each sentence"
    elif a.policy == "whole":
        clips = "whole video"
    else:
        clips = f"subtitle_span, {a.min_s:g}-{a.max_s:g} s (shorter: {a.short}, longer: {a.long})"
    return {"clips": clips, "candidates": str(a.candidates)}


def _featurize(cfg: Config) -> Settings:
    def describe(e: ExtractorConfig) -> str:
        sampling = [f"{e.fps:g} fps" if e.fps else "", f"{e.frames} frames" if e.frames else ""]
        return ", ".join([e.name, *filter(None, sampling), f"weights {e.weights}"])

    return {"extractors": [describe(e) for e in cfg.features.extractors], "device": cfg.features.device}


def _shard(cfg: Config) -> Settings:
    s = cfg.shards
    formats = [f for f, on in (("webdataset", s.webdataset.enabled), ("parquet", s.parquet.enabled)) if on]
    out: Settings = {"formats": formats or ["none"], "samples_per_shard": str(s.samples_per_shard),
                     "media": "kept" if cfg.storage.keep_media else "dropped once a partition is sharded"}
    if s.webdataset.enabled and s.webdataset.include_media:
        out["clip_media"] = "mp4 in the webdataset shards"
    return out


def _train(cfg: Config) -> Settings:
    t = cfg.train
    assert t is not None
    visual = t.visual if isinstance(t.visual, str) else " + ".join(t.visual)
    return {"model": str(t.model), "visual": visual, "text": t.text, "epochs": str(t.epochs)}


def _score(cfg: Config) -> Settings:
    return {"model": str(cfg.score_model)}


def _report(cfg: Config) -> Settings:
    return {"out": "ROOT/report/report.html and stats.json"}


# The settings shown for each stage of the graph, and why a stage with no parts is skipped.
SETTINGS = {"discover": _discover, "download": _download, "transcribe": _transcribe, "align": _align,
            "featurize": _featurize, "shard": _shard, "train": _train, "score": _score, "report": _report}
SKIPPED = {"featurize": "no extractors in features.extractors", "train": "no train section",
           "score": "no score section"}
