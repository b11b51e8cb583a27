"""The discover stage: config sources in, one ``videos`` row per candidate video out.

Videos are deduplicated by video_id across sources (the first source in config order wins),
filtered on what metadata is known, and appended: a scheduled rerun adds new videos and keeps
the ones already found.

Searches and playlists go through the network watch of downloads (pipeline/download/outage.py):
while the network is down they wait, and an outage longer than ``download.max_outage_s`` stops
discover in one line, with the videos found so far kept and no errors rows for the queries it
did not list (every run lists every query).
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.corpus import partitions
from pipeline.config import Config
from pipeline.discover.filters import drop_reason, scheme_problem
from pipeline.discover.rows import BadRecord, Known
from pipeline.discover.sources import Query, list_query, queries
from pipeline.download.outage import NetworkDown, Watch, Work, watch
from pipeline.errors import ErrorKind, classify
from pipeline.ids import batch_name
from pipeline.corpus.partitions import CORPUS, index_of as partition_index
from pipeline.progress import log, track
from pipeline.runner import RetryPolicy, StageContext, error_row, retrying
from pipeline.corpus.storage import Corpus
from schemas.tables import VIDEOS

@dataclass
class DiscoverReport:
    """What one run of discover did: logged, and the step's result."""

    queries: int = 0
    failed_queries: int = 0
    found: int = 0
    duplicates: int = 0
    refused: int = 0
    dropped: dict[str, int] | None = None
    known_before: int = 0
    added: int = 0
    partitions: int = 0
    per_query: dict[str, int] | None = None
    stopped: str | None = None  # why discover stopped before listing every query (the network)
    left: int = 0  # the queries it did not list, for the next run


# Rows found, in the order found, spilled to local scratch space before dedup: a list of a
# million videos is never held as Python objects.
_SPILL_ROWS = 50_000
_ORDER, _PARTITION = "_order", "_partition"
ERROR_CHUNK = 10_000


class _Spill:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.rows: list[dict[str, Any]] = []
        self.files: list[str] = []
        self.count = 0

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row | {_ORDER: self.count})
        self.count += 1
        if len(self.rows) >= _SPILL_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            path = os.path.join(self.directory, f"{len(self.files):06d}.parquet")
            pq.write_table(pa.Table.from_pylist(self.rows, schema=_SPILL_SCHEMA), path)
            self.files.append(path)
            self.rows = []

    def ids(self) -> pa.ChunkedArray:
        """The video id of every row spilled, in the order of the files."""
        return pa.chunked_array([pq.read_table(path, columns=["video_id"]).column("video_id").combine_chunks()
                                 for path in self.files], pa.string())

    def by_partition(self, partitions: int, settled: pa.ChunkedArray) -> tuple[ds.Dataset, list[int], int]:
        """The spilled rows with their partition, each file sorted by it (so that reading one
        partition skips the rest of every file), less the rows ``settled`` marks (aligned with
        ``ids``) that carry no metadata a filter judges: the dataset, the partitions it holds,
        the rows left out."""
        present: set[int] = set()
        left_out = offset = 0
        for path in self.files:
            table = pq.read_table(path)
            plain = settled.slice(offset, table.num_rows).combine_chunks()
            offset += table.num_rows
            for name in _FILTERED:
                plain = pc.and_(plain, pc.is_null(table.column(name)))
            left_out += pc.sum(plain).as_py() or 0
            table = table.filter(pc.invert(plain))
            index = [partition_index(v, partitions) for v in table.column("video_id").to_pylist()]
            present.update(index)
            table = table.append_column(_PARTITION, pa.array(index, pa.int32()))
            pq.write_table(table.sort_by([(_PARTITION, "ascending"), (_ORDER, "ascending")]),
                           path, row_group_size=2048)
        return ds.dataset(self.files), sorted(present), left_out


_SPILL_SCHEMA = VIDEOS.remove_metadata().remove(VIDEOS.get_field_index("discovered_at")).append(
    pa.field(_ORDER, pa.int64()))


class _Errors:
    """Error rows of discover, committed in chunks to the ``corpus`` partition under names
    derived from their items, so a rerun that finds the same problems replaces them."""

    def __init__(self, corpus: Corpus, now: datetime) -> None:
        self.corpus, self.now = corpus, now
        self.rows: list[dict[str, Any]] = []

    def add(self, item: str, kind: ErrorKind, message: str, attempt: int = 1) -> None:
        self.rows.append(error_row("discover", item, kind, message, attempt, self.now))
        if len(self.rows) >= ERROR_CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            name = f"discover-{batch_name([r['item_id'] for r in self.rows])}"
            self.corpus.write_batch("errors", self.rows, name, CORPUS)
            self.rows = []


LISTINGS = Work("discover", "listings of several searches or playlists",
                "The searches and playlists not listed are not failed: the next run lists them "
                "again once the network is back.")


def _listed(query: Query, cfg: Config, network: Watch) -> list[dict[str, Any] | BadRecord]:
    """A search or playlist listed once the network is up; a failure on the network that takes
    it as down is no failure of the query: it waits with the others and is listed again."""
    # The site a search asks is named by its prefix ("ytsearch"), a playlist's by its URL.
    host = query.source.prefix if query.kind == "search" else urlsplit(query.target).hostname or "none"
    while True:
        network.admit()
        with network.attempt(query.key, host, network.clock()):
            return list(list_query(query, cfg))
        # Here only when the attempt swallowed a network failure: the network is now down.


def _rows(query: Query, cfg: Config, retry: RetryPolicy, network: Watch, known: Known | None
          ) -> tuple[Iterable | None, Exception | None, int]:
    """A query's rows: searches and playlists listed now, through the network watch and with
    retries; lists and folders as they are read (a list's videos already in the corpus by
    ``known``). A stop of the watch (NetworkDown) is returned as the query's exception, with no
    tries."""
    if query.kind in ("search", "playlist"):
        try:
            return retrying(lambda: _listed(query, cfg, network), retry)
        except NetworkDown as stop:
            return None, stop, 0
    return list_query(query, cfg, known), None, 1


def _known(corpus: Corpus, todo: list[Query]) -> Known | None:
    """The corpus's videos by URL, for the list files among the queries (None without one)."""
    if not any(query.kind == "list" for query in todo):
        return None
    # Partition by partition: one scan of every file kept 110 MB more at 1.2M videos.
    columns = ["url", "video_id", "extractor"]
    return Known.of(pa.concat_tables([VIDEOS.empty_table().select(columns)] + [
        corpus.read("videos", columns=columns, partition=label) for label in corpus.partitions_of("videos")]))


def discover(ctx: StageContext) -> DiscoverReport:
    """Run every query, dedup, filter, and append the new videos, partition by partition, in
    atomic batches. Fixes the corpus's partition count at its first build."""
    cfg: Config = ctx.config
    corpus = ctx.corpus
    todo = queries(cfg)
    log.info("discover: %d queries: %s", len(todo), "; ".join(q.key for q in todo[:50])
             + (" ..." if len(todo) > 50 else ""))
    report = DiscoverReport(queries=len(todo), dropped={}, per_query={})
    now = datetime.now(UTC)
    errors = _Errors(corpus, now)
    network = watch(cfg.download, LISTINGS)
    known = _known(corpus, todo)
    with tempfile.TemporaryDirectory(prefix="vlcorpus-discover-") as scratch:
        spill = _Spill(scratch)
        with ThreadPoolExecutor(max_workers=cfg.download.concurrency) as pool:
            listed = pool.map(lambda q: (q, *_rows(q, cfg, ctx.retry, network, known)), todo)
            for query, rows, exc, tries in track(listed, "discover", total=len(todo)):
                if isinstance(exc, NetworkDown):  # not listed, not failed: the next run lists it
                    report.stopped, report.left = report.stopped or str(exc), report.left + 1
                    continue
                report.per_query[query.key] = 0
                try:
                    if exc is not None:
                        raise exc
                    for row in rows:
                        _check(row, query, cfg, report, errors, spill)
                except Exception as failure:  # noqa: BLE001 - the query's errors row
                    kind, message = classify(failure)
                    report.failed_queries += 1
                    errors.add(query.key, kind, message, tries)
        spill.flush()
        _commit(corpus, cfg, spill, report, errors, now, known)
    errors.flush()
    # Arrow's allocator keeps what the lists' and the corpus's ids took (400 MB at 1.2M videos)
    # for later allocations of its own; the build's process has few, and runs for hours.
    pa.default_memory_pool().release_unused()
    log.info("discover: %d found, %d duplicates, %d refused, %d dropped %s, %d new in %d partitions",
             report.found, report.duplicates, report.refused, sum(report.dropped.values()),
             report.dropped, report.added, report.partitions)
    if report.stopped:
        log.warning("%s", report.stopped)
    return report


def _check(row: dict | BadRecord, query: Query, cfg: Config, report: DiscoverReport,
           errors: _Errors, spill: _Spill) -> None:
    if isinstance(row, BadRecord):
        report.refused += 1
        errors.add(row.item_id, ErrorKind.BAD_INPUT, row.message)
        return
    report.per_query[query.key] += 1
    report.found += 1
    problem = scheme_problem(row["url"], cfg.download.allowed_schemes, row["source"])
    if problem:
        report.refused += 1
        errors.add(row["url"], ErrorKind.BAD_INPUT, problem)
        return
    spill.add(row)


# Metadata a filter judges (``drop_reason``): a row without any passes every filter.
_FILTERED = ("duration_s", "upload_date", "subtitles_manual", "subtitles_auto")


def _settled(ids: pa.ChunkedArray, known: Known | None) -> pa.ChunkedArray:
    """Which of ``ids`` are of videos listed once that the corpus holds already (by ``known``):
    the loop of ``_commit`` would only count such a row as known before, unless a filter drops
    it, so those that carry no metadata a filter judges are counted with Arrow instead (a night
    lists a million known videos again)."""
    if known is None or not len(ids):
        return pa.chunked_array([pa.repeat(False, len(chunk)) for chunk in ids.chunks], pa.bool_())
    counts = pc.value_counts(ids)
    once = pc.filter(counts.field("values"), pc.equal(counts.field("counts"), 1))
    return pc.is_in(ids, value_set=pc.filter(once, pc.is_in(once, value_set=known.ids)))


def _commit(corpus: Corpus, cfg: Config, spill: _Spill, report: DiscoverReport,
            errors: _Errors, now: datetime, known: Known | None) -> None:
    """Dedup (the first found wins), filter and write the new videos, partition by partition."""
    ids = spill.ids()
    found = pc.count_distinct(ids).as_py() if len(ids) else 0
    requested = cfg.execution.partitions or corpus.recorded_partitions()
    if requested is None and not found:
        report.dropped = {}
        return  # nothing yet to size the partitions by
    count = corpus.init_partitions(requested or partitions.choose(found))
    report.partitions = count
    if not found:
        return  # the count is fixed all the same; nothing to write (no query listed a video)
    spilled, present, report.known_before = spill.by_partition(count, _settled(ids, known))
    drops: Counter = Counter()
    for index in present:
        rows = spilled.to_table(filter=ds.field(_PARTITION) == index).sort_by(_ORDER)
        label = partitions.label(index)
        stored = set(corpus.done_keys("videos", label).to_pylist())
        new: dict[str, dict[str, Any]] = {}
        first: dict[str, dict[str, Any]] = {}
        for row in rows.drop_columns([_ORDER, _PARTITION]).to_pylist():
            vid = row["video_id"]
            if vid in first:
                if row["source"] == "folder" and first[vid]["url"] != row["url"]:
                    # Two files, not one video found twice: neither may vanish silently.
                    report.refused += 1
                    errors.add(row["url"], ErrorKind.BAD_INPUT,
                               f"{row['url']} gets the same video id {vid!r} as "
                               f"{first[vid]['url']}; rename one of them")
                    continue
                report.duplicates += 1
                continue
            reason = drop_reason(row, cfg.filters)
            if reason:
                drops[reason] += 1
                continue
            first[vid] = row
            if vid in stored:
                report.known_before += 1
            else:
                new[vid] = row | {"discovered_at": now}
        if new:
            keys = sorted(new)
            corpus.write_batch("videos", [new[k] for k in keys], f"discover-{batch_name(keys)}",
                               label, done=keys)
            corpus.compact("videos", label)
            report.added += len(keys)
    report.dropped = dict(drops)
