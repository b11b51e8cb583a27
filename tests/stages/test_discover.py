"""Discover: query expansion, searches (yt-dlp's real search path, results from fixtures),
id lists in txt/csv/parquet, local folders, dedup, filters and refused URL schemes."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from yt_dlp.extractor.youtube import YoutubeSearchIE

from conftest import ROOT, TESTS
from pipeline.config import load_config, parse_config
from pipeline.discover import discover, id_for_url, queries
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
from pipeline.discover.urls import canonical_url

DATA = TESTS / "data"
CONFIGS = ROOT / "configs"


def _ctx(root: str, sources: list[dict], **sections):
    cfg = parse_config({"name": "t", "sources": sources,
                        "execution": {"retry_backoff_s": 0}, **sections})
    return context(Corpus(root), cfg)


@pytest.fixture
def search_results(monkeypatch):
    """Answer YouTube searches from saved flat entries; record what was asked."""
    saved = json.loads((DATA / "ytdlp" / "ytsearch_flat.json").read_text())["results"]
    asked: list[str] = []

    def results(self, query, *args, **kwargs):
        asked.append(query)
        yield from saved.get(query, [])

    monkeypatch.setattr(YoutubeSearchIE, "_search_results", results)
    return asked


def test_apartment_tour_queries_expand_over_years_and_cities():
    cfg = load_config(CONFIGS / "apartment_tour.yaml")
    keys = [q.key for q in queries(cfg)]
    assert "search:apartment tour 2008" in keys and "search:apartment tour 2018" in keys
    search = cfg.sources[0]
    n_years = len(search.vars["year"])
    n_cities = len(search.vars["city"])
    assert (n_years, n_cities) == (11, 28)
    # "apartment tour" alone, then × years, then × cities.
    assert len(keys) == len(set(keys)) == 1 + n_years + n_cities


def test_search_dedups_filters_and_keeps_metadata(memory_root, search_results):
    ctx = _ctx(memory_root,
               [{"type": "search", "queries": ["apartment tour {year}"],
                 "vars": {"year": [2012, 2013]}, "per_query": 3}],
               filters={"min_duration_s": 60, "max_duration_s": 3600})
    report = discover(ctx)
    # The real yt-dlp search path cut each query to per_query results.
    assert sorted(search_results) == ["apartment tour 2012", "apartment tour 2013"]
    assert (report.found, report.duplicates) == (6, 1)
    assert report.dropped == {"too_short": 1, "too_long": 1}
    rows = {r["video_id"]: r for r in ctx.corpus.read("videos").to_pylist()}
    assert len(rows) == report.added == 3
    first = next(r for r in rows.values() if r["duration_s"] == 312.0)
    assert first["video_id"].startswith("youtube-") and first["extractor"] == "youtube"
    assert first["url"].startswith("https://www.youtube.com/watch?v=")
    assert first["source"] == "search" and first["query"] == "apartment tour 2012"
    assert first["title"].startswith("Apartment Tour 2012") and first["uploader"]
    shared = next(r for r in rows.values() if r["duration_s"] == 245.0)
    assert shared["query"] == "apartment tour 2012"  # first source in config order wins
    assert report.per_query == {"search:apartment tour 2012": 3, "search:apartment tour 2013": 3}


def test_rerun_adds_only_new_videos(memory_root, search_results):
    ctx = _ctx(memory_root, [{"type": "search", "queries": ["apartment tour 2012"],
                              "per_query": 4}])
    assert discover(ctx).added == 4
    again = discover(ctx)
    assert (again.added, again.known_before) == (0, 4)
    assert ctx.corpus.read("videos").num_rows == 4


def test_id_lists_txt_csv_parquet(tmp_path, memory_root):
    (tmp_path / "ids.txt").write_text("# HowTo100M ids\nabcdefghijk\n\nzyxwvutsrqp\n")
    (tmp_path / "clips.csv").write_text(
        "url,start,end,caption\n"
        "http://127.0.0.1:9/a.html,1.5,4.5,a dog runs\n"
        "http://127.0.0.1:9/b.html,,,\n"
        "http://127.0.0.1:9/c.html,5,2,backwards span\n")
    pq.write_table(pa.table({"vid": ["ABCDEFGHIJK"]}), tmp_path / "ids.parquet")
    template = "https://www.youtube.com/watch?v={id}"
    ctx = _ctx(memory_root, [
        {"type": "list", "path": str(tmp_path / "ids.txt"), "url_template": template},
        {"type": "list", "path": str(tmp_path / "clips.csv"), "start_column": "start",
         "end_column": "end", "caption_column": "caption"},
        {"type": "list", "path": str(tmp_path / "ids.parquet"), "id_column": "vid",
         "url_template": template},
    ])
    report = discover(ctx)
    rows = {r["video_id"]: r for r in ctx.corpus.read("videos").to_pylist()}
    assert report.added == 6
    assert {"youtube-abcdefghijk", "youtube-zyxwvutsrqp", "youtube-ABCDEFGHIJK"} <= set(rows)
    a = next(r for r in rows.values() if r["url"].endswith("/a.html"))
    assert (a["start_s"], a["end_s"], a["caption"]) == (1.5, 4.5, "a dog runs")
    assert a["video_id"].startswith("generic-a-") and a["source"] == "list"
    c = next(r for r in rows.values() if r["url"].endswith("/c.html"))
    assert c["start_s"] is None  # end before start: span ignored, video kept


def test_a_list_read_again_finds_its_known_videos_without_yt_dlp(tmp_path, memory_root, monkeypatch,
                                                                  search_results):
    """A night re-reads a list of known videos: a URL stored as it is listed is that video
    (no extractor tried on it), the rest as always, and the counts are those of the slow path:
    a known video listed twice is a duplicate, one a filter set since drops is dropped."""
    from pipeline.discover import rows, stage

    ids = [f"v{i:010d}" for i in range(40)]
    (tmp_path / "ids.txt").write_text("".join(f"{i}\n" for i in ids))
    (tmp_path / "more.csv").write_text(
        "url,start,end\n"
        f"https://www.youtube.com/watch?v={ids[0]}&t=42s,,\n"  # a known video, not as stored
        f"https://www.youtube.com/watch?v={ids[1]},1,3\n"  # twice: a duplicate of the list above
        "http://127.0.0.1:9/a.html,,\n")
    sources = [{"type": "list", "path": str(tmp_path / "ids.txt"),
                "url_template": "https://www.youtube.com/watch?v={id}"},
               {"type": "list", "path": str(tmp_path / "more.csv"), "start_column": "start",
                "end_column": "end"},
               {"type": "search", "queries": ["apartment tour 2012"], "per_query": 4}]
    first = discover(_ctx(memory_root, sources))
    assert (first.found, first.duplicates, first.added) == (47, 2, 45)
    assert discover(_ctx(f"{memory_root}-slow", sources)) == first
    (tmp_path / "more.csv").write_text((tmp_path / "more.csv").read_text() + "http://127.0.0.1:9/new.html,,\n")
    ctx, alike = (_ctx(root, sources, filters={"max_duration_s": 300})  # drops a known video of 312 s
                  for root in (memory_root, f"{memory_root}-slow"))
    asked: list[str] = []
    real = rows.id_for_url
    monkeypatch.setattr(rows, "id_for_url", lambda url: asked.append(url) or real(url))
    with monkeypatch.context() as slow:  # every URL through yt-dlp's extractors, every row in Python
        slow.setattr(stage, "_known", lambda corpus, todo: None)
        expected = discover(alike)
    assert len(asked) == 44 and (expected.known_before, expected.added) == (44, 1)
    assert expected.dropped == {"too_long": 1}
    asked.clear()
    assert discover(ctx) == expected
    # The known video listed otherwise than stored, in its canonical form; the new one.
    assert asked == [f"https://www.youtube.com/watch?v={ids[0]}", "http://127.0.0.1:9/new.html"]
    same = [c for c in ctx.corpus.read("videos").column_names if c != "discovered_at"]
    assert ctx.corpus.read("videos", columns=same).sort_by("video_id") == \
        alike.corpus.read("videos", columns=same).sort_by("video_id")


def test_bad_lists_and_schemes_become_errors(tmp_path, memory_root):
    (tmp_path / "bad.csv").write_text("link\nhttp://127.0.0.1:9/x.html\n")
    (tmp_path / "bytes.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "urls.txt").write_text(
        "file:///etc/passwd\nftp://127.0.0.1/v.mp4\ndata:video/mp4;base64,AAAA\n"
        "http://127.0.0.1:9/ok.html\n")
    ctx = _ctx(memory_root, [
        {"type": "list", "path": str(tmp_path / "bad.csv")},
        {"type": "list", "path": str(tmp_path / "bytes.parquet")},
        {"type": "list", "path": str(tmp_path / "missing.txt")},
        {"type": "list", "path": str(tmp_path / "urls.txt")},
    ])
    report = discover(ctx)
    assert (report.failed_queries, report.refused, report.added) == (3, 3, 1)
    errors = {r["item_id"]: r for r in ctx.corpus.read("errors").to_pylist()}
    assert "no column(s) url" in errors[f"list:{tmp_path / 'bad.csv'}"]["message"]
    assert "unreadable parquet" in errors[f"list:{tmp_path / 'bytes.parquet'}"]["message"]
    assert "not found" in errors[f"list:{tmp_path / 'missing.txt'}"]["message"]
    refused = errors["file:///etc/passwd"]
    assert refused["kind"] == "bad_input" and "scheme 'file' is not allowed" in refused["message"]
    discover(ctx)  # a rerun replaces the same error rows rather than duplicating them
    assert ctx.corpus.read("errors").num_rows == len(errors)


def test_sources_that_list_nothing_fix_a_given_partition_count_and_write_nothing(tmp_path, memory_root):
    (tmp_path / "urls.txt").write_text("# none yet\n")
    ctx = _ctx(memory_root, [{"type": "list", "path": str(tmp_path / "urls.txt")}], execution={"partitions": 2})
    report = discover(ctx)
    assert (report.found, report.added, report.partitions) == (0, 0, 2)
    assert ctx.corpus.recorded_partitions() == 2 and ctx.corpus.read("videos").num_rows == 0


def test_file_urls_allowed_when_enabled(tmp_path, memory_root):
    (tmp_path / "urls.txt").write_text("file:///data/v.mp4\n")
    ctx = _ctx(memory_root, [{"type": "list", "path": str(tmp_path / "urls.txt")}],
               download={"allowed_schemes": ["http", "https", "file"]})
    assert discover(ctx).added == 1


def test_folder_source_lists_media_with_safe_ids(tmp_path, memory_root):
    folder = tmp_path / "videos"
    (folder / "kitchen").mkdir(parents=True)
    (folder / "kitchen" / "My Tour (1).MP4").write_bytes(b"")
    (folder / "b.mkv").write_bytes(b"")
    (folder / "notes.txt").write_text("not a video")
    ctx = _ctx(memory_root, [{"type": "folder", "path": str(folder)}])
    discover(ctx)
    rows = sorted(ctx.corpus.read("videos").to_pylist(), key=lambda r: r["video_id"])
    assert [r["video_id"] for r in rows] == ["local-b", "local-kitchen_My_Tour__1_"]
    assert rows[1]["url"] == f"file://{folder}/kitchen/My Tour (1).MP4"


def test_ids_from_urls_need_no_request():
    assert id_for_url("https://www.youtube.com/watch?v=dQw4w9WgXcQ") == ("Youtube", "dQw4w9WgXcQ")
    extractor, ident = id_for_url("http://127.0.0.1:8000/pages/tour-0.html")
    assert extractor == "generic" and ident.startswith("tour-0-")
    assert id_for_url("http://a.example/p/index.html") != id_for_url("http://b.example/p/index.html")


def test_urls_that_differ_only_in_what_does_not_change_the_video_are_one_video(memory_root):
    page = "http://127.0.0.1:8765/pages/tour-0.html"
    watch = "https://www.youtube.com/watch?v=dQw4w9WgXcQ"
    urls = [page, f"{page}#again", f"{page}?utm_source=news&utm_medium=mail",
            watch, f"{watch}&t=42s&list=PL0123&index=3&feature=share&si=Ab_c",
            "https://youtu.be/dQw4w9WgXcQ?si=xyz&t=5",
            "http://127.0.0.1:8765/watch.php?id=3", "http://127.0.0.1:8765/watch.php?id=4"]
    ctx = _ctx(memory_root, [{"type": "urls", "urls": urls}])
    report = discover(ctx)
    rows = ctx.corpus.read("videos").to_pylist()
    assert (report.added, report.duplicates) == (4, 4)
    assert sorted(r["url"] for r in rows) == sorted(
        [page, watch, "http://127.0.0.1:8765/watch.php?id=3", "http://127.0.0.1:8765/watch.php?id=4"])
    assert "youtube-dQw4w9WgXcQ" in {r["video_id"] for r in rows}


@pytest.mark.parametrize("url,canonical", [
    ("https://www.youtube.com/playlist?list=PL0123&si=x", "https://www.youtube.com/playlist?list=PL0123"),
    ("https://m.youtube.com/shorts/abc?feature=share", "https://m.youtube.com/shorts/abc"),
    ("http://example.org/v?list=2&t=9", "http://example.org/v?list=2&t=9"),  # not YouTube's
    ("http://example.org/v?a=1&UTM_Campaign=x&b=%20", "http://example.org/v?a=1&b=%20"),
    ("file:///data/tour.mp4", "file:///data/tour.mp4"),
])
def test_canonical_url_keeps_what_names_the_video(url, canonical):
    assert canonical_url(url) == canonical
