from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pyarrow.parquet as pq
import pytest

from pipeline.corpus import partitions
from pipeline.ids import batch_name, clip_id, safe_id, video_id
from pipeline.corpus.storage import Corpus, LayoutError
from schemas.tables import SCHEMA_VERSION, TABLES

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _video(v: str, title: str = "t") -> dict:
    return {"video_id": v, "url": "http://x", "extractor": "demo", "source": "urls",
            "title": title, "discovered_at": NOW}


def _corpus(url: str, n: int = 4) -> Corpus:
    corpus = Corpus(url)
    corpus.init_partitions(n)
    return corpus


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_commit_read_and_replace(kind, memory_root, tmp_path):
    corpus = _corpus(memory_root if kind == "memory" else str(tmp_path / "root"), 1)
    corpus.write_batch("videos", [_video("a"), _video("b")], "b1", "00000", done=["a", "b"])
    corpus.write_batch("videos", [_video("a", "new"), _video("b")], "b1", "00000", done=["a", "b"])
    table = corpus.read("videos")
    assert table.num_rows == 2  # same batch name replaced, not duplicated
    assert sorted(table.column("title").to_pylist()) == ["new", "t"]
    assert corpus.done("videos") == {"a": 1, "b": 1}
    meta = table.schema.metadata
    assert meta[b"vlcorpus.table"] == b"videos"
    assert meta[b"vlcorpus.schema_version"] == SCHEMA_VERSION.encode()
    assert corpus.tables() == ["videos"]


def test_every_table_has_a_versioned_schema():
    assert set(TABLES) == {"videos", "downloads", "segments", "clips", "features", "scores", "errors"}
    for name, schema in TABLES.items():
        assert schema.metadata[b"vlcorpus.table"] == name.encode()
        assert schema.metadata[b"vlcorpus.schema_version"] == SCHEMA_VERSION.encode()
        assert schema.metadata[b"vlcorpus.key"].decode() in schema.names


def test_rows_land_in_their_videos_partition_in_hive_folders(tmp_path):
    corpus = _corpus(str(tmp_path), 8)
    ids = [f"v{i}" for i in range(40)]
    corpus.write_partitioned("videos", [_video(v) for v in ids], "all", done=ids)
    for v in ids:
        label = partitions.partition_of(v, 8)
        assert v in corpus.done("videos", label)
        assert (tmp_path / "videos" / f"partition={label}").is_dir()
    assert len(corpus.partitions_of("videos")) == 8  # 40 videos fill all 8
    assert json.loads((tmp_path / "_corpus.json").read_text()) == {"layout": 2, "partitions": 8}


def test_partition_count_is_fixed_at_the_first_build(tmp_path):
    corpus = _corpus(str(tmp_path), 8)
    assert Corpus(str(tmp_path)).init_partitions(8) == 8
    with pytest.raises(LayoutError, match="has 8 partitions and the config asks for 16"):
        Corpus(str(tmp_path)).init_partitions(16)
    assert corpus.partitions == 8


def test_an_old_flat_layout_names_the_migration(tmp_path):
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "discover-abc.parquet").write_bytes(b"PAR1")
    with pytest.raises(LayoutError, match=r"vlcorpus migrate"):
        Corpus(str(tmp_path)).recorded_partitions()


def test_items_without_rows_are_done_through_the_manifest(memory_root):
    corpus = _corpus(memory_root, 1)
    row = {"video_id": "a", "index": 0, "start_s": 0.0, "end_s": 1.0, "text": "x", "source": "manual"}
    corpus.write_batch("segments", [row], "b", "00000", done=["a", "silent"])
    assert sorted(corpus.done_keys("segments", "00000").to_pylist()) == ["a", "silent"]
    assert corpus.done("segments") == {"a": 1, "silent": 0}
    with pytest.raises(ValueError, match="rows of keys the batch does not complete"):
        corpus.write_batch("segments", [row], "c", "00000", done=["b"])


def test_compaction_merges_small_files_in_one_rename(tmp_path):
    corpus = _corpus(str(tmp_path), 1)
    for i in range(5):
        corpus.write_batch("videos", [_video(f"v{i}")], f"b{i}", "00000", done=[f"v{i}"])
    corpus.write_batch("videos", [], "empty", "00000", done=["gone"])
    before = corpus.read("videos").sort_by("video_id")
    merged = corpus.compact("videos", "00000")
    folder = tmp_path / "videos" / "partition=00000"
    assert [p.name for p in folder.iterdir()] == [os.path.basename(merged)]
    assert corpus.read("videos").sort_by("video_id").equals(before)
    assert corpus.done("videos") == {"gone": 0, **{f"v{i}": 1 for i in range(5)}}
    assert corpus.compact("videos", "00000") is None  # one file: nothing to merge
    # A new batch after compaction, and a kill after the next compaction's rename but before
    # it deleted what it replaced: the replaced files are invisible and swept.
    corpus.write_batch("videos", [_video("v9")], "b9", "00000", done=["v9"])
    kept = {p.name: p.read_bytes() for p in folder.iterdir()}
    merged = corpus.compact("videos", "00000")
    for name, data in kept.items():
        (folder / name).write_bytes(data)
    assert sorted(corpus.read("videos").column("video_id").to_pylist()) == [
        "v0", "v1", "v2", "v3", "v4", "v9"]
    assert corpus.sweep("videos", "00000") == 2
    assert [p.name for p in folder.iterdir()] == [os.path.basename(merged)]


def test_replace_rows_swaps_rows_with_the_same_keys(memory_root):
    corpus = _corpus(memory_root, 1)
    corpus.write_batch("videos", [_video("a"), _video("b")], "b1", "00000", done=["a", "b"])
    corpus.write_batch("videos", [_video("c")], "b2", "00000", done=["c"])
    corpus.replace_rows("videos", "00000", [_video("b", "again")], ["b"])
    rows = {r["video_id"]: r["title"] for r in corpus.read("videos").to_pylist()}
    assert rows == {"a": "t", "b": "again", "c": "t"}
    assert len(corpus.table_files("videos", "00000")) == 1


def test_failed_write_commits_nothing_and_keeps_earlier_batches(tmp_path, monkeypatch):
    corpus = _corpus(str(tmp_path), 1)
    corpus.write_batch("videos", [_video("a")], "b1", "00000", done=["a"])

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", disk_full)
    with pytest.raises(OSError, match="No space"):
        corpus.write_batch("videos", [_video("b")], "b2", "00000", done=["b"])
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path / "videos" / "partition=00000")) == ["b1.parquet"]
    assert corpus.read("videos").column("video_id").to_pylist() == ["a"]


def test_temporary_files_are_invisible_and_swept(tmp_path):
    corpus = _corpus(str(tmp_path), 1)
    corpus.write_batch("videos", [_video("a")], "b1", "00000", done=["a"])
    (tmp_path / "videos" / "partition=00000" / ".tmp-dead").write_bytes(b"half a file")
    assert corpus.read("videos").num_rows == 1
    assert corpus.sweep("videos", "00000") == 1
    assert sorted(os.listdir(tmp_path / "videos" / "partition=00000")) == ["b1.parquet"]


def test_features_tables_share_one_schema(memory_root):
    corpus = _corpus(memory_root, 1)
    row = {"clip_id": "c", "extractor": "resnet34", "weights": "none", "fps": 2.0, "frames": 2,
           "shape": [2, 3], "values": [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]}
    corpus.write_batch("features/resnet34", [row], "b", "00000", done=["c"])
    assert corpus.tables() == ["features/resnet34"]
    values = corpus.read("features/resnet34").column("values").combine_chunks().values
    assert values.to_numpy().reshape(2, 3)[1, 2] == 3.0


def test_partitions_are_a_stable_hash_sized_to_the_corpus():
    assert partitions.partition_of("youtube-abc", 16) == partitions.partition_of("youtube-abc", 16)
    counts = [0] * 16
    for i in range(16_000):
        counts[partitions.index_of(f"youtube-{i}", 16)] += 1
    assert min(counts) > 850 and max(counts) < 1150
    assert [partitions.choose(n) for n in (0, 2, 12, 20, 1000, 100_000, 1_220_000)] == [
        1, 1, 2, 4, 8, 128, 2048]
    assert partitions.video_of_clip(clip_id("youtube-a-b", 1.5, 4.0)) == "youtube-a-b"


def test_ids_are_safe_file_names():
    assert video_id("Youtube", "dQw4w9WgXcQ") == "youtube-dQw4w9WgXcQ"
    assert video_id("generic", "../../etc/passwd") == "generic-______etc_passwd"
    assert safe_id("") == "_"
    long = safe_id("é" * 500)
    assert len(long) <= 120 and long != safe_id("è" * 500)
    assert clip_id("youtube-abc", 12.3456, 15.5) == "youtube-abc-12346-15500"
    assert batch_name(["b", "a"]) == batch_name(["a", "b"]) != batch_name(["a"])
