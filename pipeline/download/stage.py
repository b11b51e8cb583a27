"""The download stage: videos in; media/, subs/ and one ``downloads`` row per video out.

One yt-dlp extraction per video fetches the media and its subtitles together (manual first,
auto as fallback; a track that fails to download or to read is dropped for the next choice).
The file is checked before the row counts as done; a bad file is removed and becomes an errors
row. An HTTP 403 is extracted again once (signed media URLs expire). What one video's download
leaves on disk (the call's options, its subtitle tracks, the media file, the caps on size and
time) and a folder source's files are in pipeline/download/files.py.

Politeness and blocks, shared by every worker and build once flows/ installs Prefect's backend
(pipeline.download.limits): each download waits for the breaker (pipeline/download/breaker.py) and a turn of
``download.rate_limit``, and holds a slot of ``download.per_host`` and of
``download.concurrency``. A video refused because the session is blocked waits out the pause
and is tried again; a block longer than ``download.max_block_s`` stops the stage with the
videos not downloaded left to do. The network being down pauses and stops downloads the same
way (pipeline/download/outage.py, ``download.max_outage_s``), and a host whose name stops resolving is
judged gone only from evidence across runs (pipeline/download/gone_hosts.py). Each run's figures land
in ``runs/download/`` for the report.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import pyarrow.dataset as ds

from pipeline.setup import require_binaries
from pipeline.config import Config, DownloadConfig
from pipeline.corpus.retention import needed_again
from pipeline.corpus.storage import Corpus
from pipeline.discover.filters import scheme_problem
from pipeline.download import gone_hosts, limits
from pipeline.download.breaker import Gate, Policy, Ticket
from pipeline.download.files import (
    Caps,
    DownloadTooSlow,
    FileTooLarge,
    file_path,
    local_file,
    media_path,
    remove_files,
    subtitle_rows,
    unreadable_subtitles,
    ytdlp_options,
)
from pipeline.download.outage import DOWNLOADS, NetworkDown, Watch, network_down, watch
from pipeline.download.ytdlp import ForbiddenError, download, egresses
from pipeline.errors import (
    BadInputError,
    BlockedError,
    ErrorKind,
    NetworkError,
    SetupError,
    StageStopped,
    classify,
    error,
    name_not_found,
    network_failure,
)
from pipeline.ids import safe_id
from pipeline.media import check_video
from pipeline.progress import beat, carried, log
from pipeline.runner import Item, Outcome, Stage, StageContext, StageReport, per_item, table_inputs


@dataclass
class _Batch:
    """What the videos of one batch share: the breaker and the network watch, refusals met per
    video, the HTTP 403s to judge once the batch is over (by then other videos say whether it
    was a block), and the videos whose host did not resolve (host, when)."""

    gate: Gate
    watch: Watch
    refusals: Counter = field(default_factory=Counter)
    forbidden: dict[str, tuple[Ticket, float]] = field(default_factory=dict)
    unresolved: dict[str, tuple[str, float]] = field(default_factory=dict)
    gone: dict[str, str | None] = field(default_factory=dict)  # host -> verdict, read once a batch


def _gate(cfg: DownloadConfig) -> Gate:
    policy = Policy(cfg.block_threshold, cfg.block_window_s, cfg.block_cooldown_s,
                    cfg.block_cooldown_max_s, cfg.max_block_s)
    store = limits.store(f"{cfg.concurrency_limit}-breaker")
    return Gate(store, policy, [egress.key for egress in egresses(cfg)])


@contextmanager
def _slots(cfg: DownloadConfig, url: str) -> Iterator[None]:
    # The host's slot first: a download waiting for its host holds no slot other hosts need.
    # (Waiting for the breaker with slots held costs nothing: it waits only when every egress
    # is paused, when no download may go anyway.)
    with ExitStack() as stack:
        if cfg.per_host:
            host = safe_id(urlsplit(url).hostname or "none")
            stack.enter_context(limits.slot(f"{cfg.concurrency_limit}-host-{host}", cfg.per_host))
        stack.enter_context(limits.slot(cfg.concurrency_limit, cfg.concurrency))
        yield


def _download(row: dict[str, Any], cfg: Config, workdir: str, batch: _Batch
              ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The yt-dlp call of a video, through the network watch and the breaker: (info, its
    options, dropped tracks)."""
    dl, vid = cfg.download, row["video_id"]
    host = urlsplit(row["url"]).hostname or "none"
    by_key = {egress.key: egress for egress in egresses(dl)}
    forbidden = 0
    while True:
        with _slots(dl, row["url"]):
            if dl.rate_limit:
                limits.rate(f"{dl.concurrency_limit}-rate", dl.rate_limit, dl.concurrency)
            # Last before the request: a pause that began meanwhile still holds it back.
            batch.watch.admit()
            ticket = batch.gate.admit()
            opts = ytdlp_options(cfg, workdir, vid, row, by_key[ticket.egress])
            caps = Caps(dl)
            opts["progress_hooks"] = [caps, lambda _status: beat()]
            # Leaving it, a network failure is recorded, and swallowed when the network is now
            # down: the loop then goes again once it is back (a network outage is no verdict).
            with batch.watch.attempt(vid, host, ticket.admitted):
                try:
                    info, dropped = download(row["url"], opts,
                                             lambda got: unreadable_subtitles(got, workdir, vid))
                except (FileTooLarge, DownloadTooSlow):
                    # Nothing to resume: the next try would stop at the same cap.
                    remove_files(sorted(caps.files | {f"{name}.part" for name in caps.files}))
                    raise
                except BlockedError:
                    batch.refusals[vid] += 1
                    if batch.gate.refused(ticket, vid):
                        continue  # its egress now pauses: this video waits, then goes again
                    raise
                except ForbiddenError:
                    forbidden += 1
                    if forbidden == 1:
                        continue  # a signed media URL may have expired: extract again, once
                    batch.refusals[vid] += 1
                    if batch.gate.refused(ticket, vid, strong=False):
                        forbidden = 0  # 403s across videos paused the egress: a block after all
                        continue
                    batch.forbidden[vid] = (ticket, batch.gate.clock())
                    raise
                break
    # Out of the slot: the breaker's bookkeeping is no download.
    batch.gate.succeeded(ticket)
    return info, opts, dropped


def _fetch(row: dict[str, Any], cfg: Config, workdir: str, batch: _Batch) -> Outcome:
    vid = row["video_id"]
    try:
        info, opts, dropped = _download(row, cfg, workdir, batch)
    except NetworkError as exc:
        if name_not_found(str(exc)):  # judged once the batch is over (pipeline/download/gone_hosts.py)
            batch.unresolved[vid] = (urlsplit(row["url"]).hostname or "none", batch.watch.clock())
        raise
    for note in dropped:
        log.warning("%s: %s; the next subtitle source is used", vid, note)
    media = media_path(info, opts["logger"].notes)
    subs = subtitle_rows(info, workdir, vid)
    try:
        probe = check_video(media)
    except BadInputError:
        remove_files([media] + [os.path.join(workdir, s["path"]) for s in subs])
        raise
    result = {
        "video_id": vid,
        "media_path": os.path.relpath(media, workdir),
        "subtitles": subs,
        "format_id": info.get("format_id"),
        "width": probe.width,
        "height": probe.height,
        "fps": probe.fps,
        "duration_s": probe.duration_s,
        "bytes": os.path.getsize(media),
        "has_audio": probe.has_audio,
        "status": "partial" if "download_ranges" in opts else "ok",
        "downloaded_at": datetime.now(UTC),
    }
    return Outcome(vid, rows=[result], stats={"subtitles_dropped": len(dropped)} if dropped else {})


def _upload(corpus: Corpus, workdir: str, result: dict[str, Any]) -> None:
    """Move files fetched into a local scratch dir to a remote corpus root."""
    for rel in [result["media_path"], *(s["path"] for s in result["subtitles"])]:
        corpus.fs.makedirs(posixpath.dirname(corpus.path(rel)), exist_ok=True)
        corpus.fs.put(os.path.join(workdir, rel), corpus.path(rel))


@contextmanager
def _paths_relative(folders: Sequence[str]) -> Iterator[None]:
    """Errors of the block name files relative to ``folders`` (the corpus root, a scratch
    dir, a folder source), never by their absolute local paths."""
    try:
        yield
    except (SetupError, StageStopped):
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the same kind
        kind, message = classify(exc)
        relative = message
        for folder in folders:
            relative = relative.replace(folder.rstrip("/") + "/", "")
        if relative == message:
            raise
        raise error(kind, relative) from exc


def _fetched(row: dict[str, Any], ctx: StageContext, batch: _Batch) -> Outcome:
    corpus = ctx.corpus
    if corpus.is_local:
        return _fetch(row, ctx.config, corpus.local_path(), batch)
    # A remote root: fetch to scratch space, then upload.
    with tempfile.TemporaryDirectory(prefix="vlcorpus-dl-") as workdir:
        with _paths_relative([workdir]):
            outcome = _fetch(row, ctx.config, workdir, batch)
        _upload(corpus, workdir, outcome.rows[0])
        return outcome


def download_one(item: Item, ctx: StageContext, batch: _Batch) -> Outcome:
    cfg: Config = ctx.config
    row = item.rows[0]
    problem = scheme_problem(row["url"], cfg.download.allowed_schemes, row["source"])
    if problem:
        raise BadInputError(problem)
    folders = [os.path.dirname(file_path(row))] if row["source"] == "folder" else []
    if ctx.corpus.is_local:
        folders.append(ctx.corpus.local_path())
    with _paths_relative(folders):
        if row["source"] == "folder":
            return Outcome(item.key, rows=[local_file(row)])
        return _fetched(row, ctx, batch)


def _earlier_403(ctx: StageContext, video: str) -> float | None:
    """When an earlier run's download of ``video`` last met a 403 taken as a block."""
    rows = ctx.corpus.read("errors", columns=["kind", "message", "time"],
                           filter=(ds.field("stage") == "download") & (ds.field("item_id") == video),
                           partition=ctx.corpus.partition_of(video)).to_pylist()
    times = [r["time"].timestamp() for r in rows
             if r["kind"] == ErrorKind.BLOCKED.value and "403" in r["message"]]
    return max(times, default=None)


def _forbidden_verdict(outcome: Outcome, batch: _Batch, ctx: StageContext) -> None:
    ticket, at = batch.forbidden[outcome.key]
    earlier = _earlier_403(ctx, outcome.key)
    outcome.kind = batch.gate.forbidden_kind(ticket, at, earlier)
    if outcome.kind == ErrorKind.PERMANENT:
        outcome.message += (" (again after a fresh extraction, as in an earlier run, while other "
                            "videos downloaded)")
    elif earlier is None:
        outcome.message += (" (again after a fresh extraction: taken as a block, tried next run; "
                            "the video's own if refused again while other videos download)")
    else:
        outcome.message += (" (again after a fresh extraction, while the site refused other "
                            "videos too or none got through: taken as a block, tried next run)")


def _unresolved_verdict(outcome: Outcome, batch: _Batch, ctx: StageContext) -> None:
    """A video whose host did not resolve: evidence against the host when other hosts were
    reached meanwhile, and permanent once that evidence spans enough days."""
    host, at = batch.unresolved[outcome.key]
    if not batch.watch.others_up(host, at):
        return  # the network may have been failing: no evidence either way
    dl = ctx.config.download
    if host not in batch.gone:
        batch.gone[host] = gone_hosts.verdict(ctx.corpus, host, datetime.now(UTC),
                                              dl.gone_host_runs, dl.gone_host_days)
    gone = batch.gone[host]
    if gone is None:
        outcome.message += gone_hosts.evidence(host)
    else:
        outcome.kind, outcome.message = ErrorKind.PERMANENT, f"{gone}. Last: {outcome.message}"


def _settled(outcomes: list[Outcome], stop: StageStopped) -> list[Outcome]:
    """The outcomes a stop commits: with the network down, not the videos that failed on it
    (they stay to do, with no errors row: the outage is no verdict on them)."""
    if not isinstance(stop, NetworkDown):
        return outcomes
    return [o for o in outcomes if o.ok or not network_failure(o.message)]


def process(items: Sequence[Item], ctx: StageContext) -> list[Outcome]:
    """Download a batch with up to ``download.concurrency`` videos in flight. HTTP 403s and
    hosts that did not resolve are judged once the batch is over; a stop (StageStopped) keeps
    the outcomes settled so far."""
    dl = ctx.config.download
    batch = _Batch(_gate(dl), watch(dl, DOWNLOADS))
    one = per_item(lambda item, c: download_one(item, c, batch))

    def run(item: Item) -> Outcome | StageStopped:
        try:
            return one([item], ctx)[0]
        except StageStopped as stop:
            return stop

    with ThreadPoolExecutor(max_workers=ctx.config.download.concurrency) as pool:
        results = list(pool.map(carried(run), items))
    outcomes = [r for r in results if isinstance(r, Outcome)]
    for outcome in outcomes:
        if batch.refusals[outcome.key]:
            outcome.stats["refusals"] = batch.refusals[outcome.key]
        if not outcome.ok and outcome.key in batch.forbidden:
            _forbidden_verdict(outcome, batch, ctx)
        if outcome.kind == ErrorKind.TRANSIENT and outcome.key in batch.unresolved:
            _unresolved_verdict(outcome, batch, ctx)
    stops = [r for r in results if isinstance(r, StageStopped)]
    if stops:
        raise type(stops[0])(str(stops[0]), finished=_settled(outcomes, stops[0]))
    return outcomes


def finish(ctx: StageContext, report: StageReport, started: float) -> dict[str, Any]:
    """Figures of a download run (kept in ``runs/download/`` for the report): downloads per
    minute, pauses for blocks and for network outages and their length, outcomes by kind, and
    whether the network was down when the stage stopped."""
    ended = time.time()
    pauses, paused_s = _gate(ctx.config.download).paused(started, ended)
    outages, outage_s = watch(ctx.config.download, DOWNLOADS).paused(started, ended)
    figures = {
        "started": datetime.fromtimestamp(started, UTC).isoformat(),
        "seconds": round(ended - started, 1),
        "videos": report.items,
        "downloaded": report.ok,
        "per_minute": round(report.ok * 60 / max(ended - started, 1e-6), 2),
        "pauses": pauses,
        "paused_s": round(paused_s, 1),
        "refusals": report.counters.get("refusals", 0),
        "errors": dict(report.errors),
        "left": report.left,
        "stopped": report.stopped,
        "outages": outages,
        "outage_s": round(outage_s, 1),
        "network_down": network_down(report.stopped),
    }
    if report.items:
        stamp = datetime.fromtimestamp(started, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        ctx.corpus.write_text(f"runs/download/{stamp}.json", json.dumps(figures, sort_keys=True) + "\n")
    return figures


STAGE = Stage(name="download", output="downloads", source="videos", inputs=table_inputs("videos"),
              process=process, redo=needed_again, finish=finish,
              check=lambda cfg: require_binaries("ffmpeg"))
