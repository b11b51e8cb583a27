from __future__ import annotations

import os
from datetime import UTC, datetime

import pyarrow.parquet as pq
import pytest

from pipeline.ids import batch_name, clip_id, safe_id, video_id
from pipeline.storage import Corpus
from schemas.tables import SCHEMA_VERSION, TABLES

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _video(v: str, title: str = "t") -> dict:
    return {"video_id": v, "url": "http://x", "extractor": "demo", "source": "urls",
            "title": title, "discovered_at": NOW}


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_commit_read_and_replace(kind, memory_root, tmp_path):
    corpus = Corpus(memory_root if kind == "memory" else str(tmp_path / "root"))
    corpus.write_batch("videos", [_video("a"), _video("b")], "b1", done={"a": 1, "b": 1})
    corpus.write_batch("videos", [_video("a", "new"), _video("b")], "b1", done={"a": 1, "b": 1})
    table = corpus.read("videos")
    assert table.num_rows == 2  # same batch name replaced, not duplicated
    assert sorted(table.column("title").to_pylist()) == ["new", "t"]
    assert corpus.done("videos") == {"a": 1, "b": 1}
    meta = table.schema.metadata
    assert meta[b"vlcorpus.table"] == b"videos"
    assert meta[b"vlcorpus.schema_version"] == SCHEMA_VERSION.encode()
    assert corpus.tables() == ["videos"]


def test_every_table_has_a_versioned_schema():
    assert set(TABLES) == {"videos", "downloads", "segments", "clips", "features", "errors"}
    for name, schema in TABLES.items():
        assert schema.metadata[b"vlcorpus.table"] == name.encode()
        assert schema.metadata[b"vlcorpus.schema_version"] == SCHEMA_VERSION.encode()
        assert schema.metadata[b"vlcorpus.key"].decode() in schema.names


def test_failed_write_commits_nothing_and_keeps_earlier_batches(tmp_path, monkeypatch):
    corpus = Corpus(str(tmp_path))
    corpus.write_batch("videos", [_video("a")], "b1", done={"a": 1})

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", disk_full)
    with pytest.raises(OSError, match="No space"):
        corpus.write_batch("videos", [_video("b")], "b2", done={"b": 1})
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path / "videos")) == ["b1.parquet"]
    assert corpus.read("videos").column("video_id").to_pylist() == ["a"]


def test_temporary_files_are_invisible_and_swept(tmp_path):
    corpus = Corpus(str(tmp_path))
    corpus.write_batch("videos", [_video("a")], "b1", done={"a": 1})
    (tmp_path / "videos" / ".tmp-b2-dead.parquet").write_bytes(b"half a file")
    assert corpus.read("videos").num_rows == 1
    assert corpus.sweep_temporary("videos") == 1
    assert sorted(os.listdir(tmp_path / "videos")) == ["b1.parquet"]


def test_features_tables_share_one_schema(memory_root):
    corpus = Corpus(memory_root)
    row = {"clip_id": "c", "extractor": "resnet34", "weights": "none", "fps": 2.0, "frames": 2,
           "shape": [2, 3], "values": [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]}
    corpus.write_batch("features/resnet34", [row], "b", done={"c": 1})
    assert corpus.tables() == ["features/resnet34"]
    values = corpus.read("features/resnet34").column("values").combine_chunks().values
    assert values.to_numpy().reshape(2, 3)[1, 2] == 3.0


def test_ids_are_safe_file_names():
    assert video_id("Youtube", "dQw4w9WgXcQ") == "youtube-dQw4w9WgXcQ"
    assert video_id("generic", "../../etc/passwd") == "generic-______etc_passwd"
    assert safe_id("") == "_"
    long = safe_id("é" * 500)
    assert len(long) <= 120 and long != safe_id("è" * 500)
    assert clip_id("youtube-abc", 12.3456, 15.5) == "youtube-abc-12346-15500"
    assert batch_name(["b", "a"]) == batch_name(["a", "b"]) != batch_name(["a"])
