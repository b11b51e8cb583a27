from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import stagekit
from pipeline.runner import RetryPolicy, StageContext, run_stage
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate


def _built(root: str) -> Corpus:
    stagekit._flaky_seen.clear()
    ctx = StageContext(Corpus(root), None, RetryPolicy(2, 0, 0))
    stagekit.make_videos(ctx.corpus, 6, extra=("bad1",))
    run_stage(stagekit.DOWNLOAD, ctx, batch_size=3)
    run_stage(stagekit.TRANSCRIBE, ctx, batch_size=3)
    return ctx.corpus


def _messages(corpus: Corpus) -> list[str]:
    return [str(v) for v in validate(corpus)]


def test_clean_build_validates(tmp_path):
    assert _messages(_built(str(tmp_path))) == []


def test_deleted_rows_are_named(tmp_path):
    corpus = _built(str(tmp_path))
    path = corpus.table_files("segments")[0]
    table = pq.read_table(path)
    victim = table.column("video_id")[0].as_py()
    pq.write_table(table.filter(pc.not_equal(table.column("video_id"), victim)), path)
    messages = _messages(corpus)
    assert any(m.startswith("segments:") and repr(victim) in m for m in messages), messages


def test_deleted_batch_loses_keys(tmp_path):
    corpus = _built(str(tmp_path))
    path = corpus.table_files("segments")[0]
    lost = sorted(set(pq.read_table(path).column("video_id").to_pylist())
                  | set(corpus.file_manifest(path)["empty"]))
    assert lost, f"{path} holds no key to lose"
    corpus.fs.rm(path)
    messages = _messages(corpus)
    named = [key for key in lost if any(repr(key) in m and "neither in segments nor in errors" in m
                                        for m in messages)]
    assert named == lost, messages


def test_corrupted_schema_is_named(tmp_path):
    corpus = _built(str(tmp_path))
    path = corpus.table_files("segments")[0]
    table = pq.read_table(path)
    index = table.schema.get_field_index("start_s")
    broken = table.set_column(index, "start_s", table.column("start_s").cast(pa.string()))
    pq.write_table(broken, path)
    messages = _messages(corpus)
    assert any("segments:" in m and "'start_s' is string" in m for m in messages), messages


def test_duplicate_rows_are_named(tmp_path):
    corpus = _built(str(tmp_path))
    first = corpus.table_files("videos")[0]
    corpus.fs.copy(first, first.replace(".parquet", "-copy.parquet"))
    video = pq.read_table(first).column("video_id")[0].as_py()
    assert any(f"videos: duplicate key ({video!r},)" in m for m in _messages(corpus))


def test_a_row_outside_its_partition_is_named(tmp_path):
    corpus = _built(str(tmp_path))
    source, *others = corpus.partitions_of("videos")
    path = corpus.table_files("videos", source)[0]
    moved = corpus.path("videos", f"partition={others[0]}", "moved.parquet")
    corpus.fs.mv(path, moved)
    assert any("rows of videos of other partitions" in m for m in _messages(corpus))


def test_an_unreadable_errors_file_is_named(tmp_path):
    # The lineage checks read the errors table too: its damage is a violation, not a crash.
    corpus = _built(str(tmp_path))
    path = corpus.table_files("errors")[0]
    with corpus.fs.open(path, "wb") as handle:
        handle.write(b"not parquet")
    assert any(m.startswith("errors:") and "unreadable Parquet" in m for m in _messages(corpus))
