"""Shards: read back by the webdataset library, pyarrow and Dask; every clip exactly once with
features bit-equal to the features tables; deterministic and incremental rebuilds; a missing,
truncated or altered shard named by validate and written again by the next run."""

from __future__ import annotations

import hashlib
import shutil

import dask.dataframe as dd
import numpy as np
import pyarrow.compute as pc
import pytest

from pipeline.align import stage as align
from pipeline.transcribe import stage as transcribe
from pipeline.config import parse_config
from pipeline.ids import batch_name
from pipeline.runner import run_partition, run_stage
from pipeline.shards import feature_array, open_parquet, open_webdataset, write_shards
from pipeline.shards.stage import make_stage
from pipeline.compose.stages import context
from pipeline.compose.status import corpus_status
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import hand_back, validate

pytestmark = pytest.mark.slow


def _features(corpus: Corpus, name: str, dim: int, pooled: bool) -> dict[str, np.ndarray]:
    """Feature rows as featurize writes them (seeded random values, float16)."""
    out, rows = {}, []
    for clip in corpus.read("clips", columns=["clip_id"]).to_pylist():
        seed = int(hashlib.sha1(f"{name}{clip['clip_id']}".encode()).hexdigest()[:8], 16)
        shape = [dim] if pooled else [1 + seed % 4, dim]
        array = np.random.default_rng(seed).standard_normal(shape).astype(np.float16)
        out[clip["clip_id"]] = array
        rows.append({"clip_id": clip["clip_id"], "extractor": name, "weights": "none",
                     "fps": None if pooled else 2.0, "frames": None if pooled else shape[0],
                     "shape": shape, "values": array.reshape(-1).tolist()})
    ids = sorted(out)
    corpus.write_partitioned(f"features/{name}", rows, f"test-{batch_name(ids)}", done=ids)
    return out


def _config(**webdataset):
    return parse_config({"name": "t", "sources": [{"type": "urls", "urls": ["http://x/"]}],
                         "download": {"subtitle_langs": ["en", "en-auto"]},
                         "transcribe": {"prefer": ["manual"]},
                         "align": {"splits": {"train": 0.5, "val": 0.0, "test": 0.5}},
                         "shards": {"samples_per_shard": 4, "webdataset": webdataset,
                                    "parquet": {"row_group_size": 2}}})


def _corpus(demo_corpus, path, cfg) -> tuple[Corpus, dict]:
    root, _ = demo_corpus
    shutil.copytree(root, path)
    ctx = context(Corpus(str(path)), cfg)
    run_stage(transcribe.STAGE, ctx, batch_size=4)
    run_stage(align.STAGE, ctx, batch_size=4)
    features = {"resnet34": _features(ctx.corpus, "resnet34", 8, pooled=False),
                "text_minilm": _features(ctx.corpus, "text_minilm", 6, pooled=True)}
    return ctx.corpus, features


def test_webdataset_and_parquet_hold_every_clip_once(demo_corpus, tmp_path):
    cfg = _config()
    corpus, features = _corpus(demo_corpus, tmp_path / "c", cfg)
    report = write_shards(context(corpus, cfg))
    clips = {c["clip_id"]: c for c in corpus.read("clips").to_pylist()}
    assert report["webdataset"]["samples"] == report["parquet"]["samples"] == len(clips)

    seen = []
    for sample in open_webdataset(corpus.path("shards/webdataset")):
        cid = sample["clip_id"]
        seen.append(cid)
        assert sample["json"]["video_id"] == clips[cid]["video_id"]
        assert sample["text"] == clips[cid]["text"]
        for name, array in sample["features"].items():
            assert array.dtype == np.float16
            assert np.array_equal(array, features[name][cid])
        assert set(sample["features"]) == {"resnet34", "text_minilm"}
    assert sorted(seen) == sorted(clips)

    only = next(iter(open_webdataset(corpus.path("shards/webdataset"), features=["resnet34"])))
    assert set(only["features"]) == {"resnet34"}
    # Splits come from a hash of video ids (which hold the demo server's port): ask for one
    # that is there, and one that is not.
    present = {c["split"] for c in clips.values()}
    split = sorted(present)[0]
    chosen = list(open_webdataset(corpus.path("shards/webdataset"), split=split))
    assert {s["clip_id"] for s in chosen} == {cid for cid, c in clips.items() if c["split"] == split}
    for absent in {"train", "val", "test"} - present:
        with pytest.raises(ValueError, match=f"no WebDataset shards of split '{absent}'"):
            open_webdataset(corpus.path("shards/webdataset"), split=absent)

    table = open_parquet(corpus.path("shards/parquet")).to_table()
    assert sorted(table.column("clip_id").to_pylist()) == sorted(clips)
    for row in table.to_pylist():
        assert row["split"] == clips[row["clip_id"]]["split"]
        array = feature_array(row["resnet34"], row["resnet34_shape"])
        assert np.array_equal(array, features["resnet34"][row["clip_id"]])
    frame = dd.read_parquet(corpus.path("shards/parquet")).compute()
    assert sorted(frame["clip_id"]) == sorted(clips)
    assert set(frame["split"].astype(str)) <= {"train", "test"}


def test_rebuild_is_deterministic_and_incremental(demo_corpus, tmp_path):
    cfg = _config()
    first, _ = _corpus(demo_corpus, tmp_path / "a", cfg)
    second, _ = _corpus(demo_corpus, tmp_path / "b", cfg)
    for corpus in (first, second):
        write_shards(context(corpus, cfg))
    tars = sorted(p.name for p in (tmp_path / "a" / "shards" / "webdataset").glob("*.tar"))
    assert tars and tars == sorted(
        p.name for p in (tmp_path / "b" / "shards" / "webdataset").glob("*.tar"))
    for name in tars:
        a = (tmp_path / "a" / "shards" / "webdataset" / name).read_bytes()
        assert a == (tmp_path / "b" / "shards" / "webdataset" / name).read_bytes()

    again = write_shards(context(first, cfg))
    assert again["webdataset"]["written"] == 0 and again["parquet"]["written"] == 0
    before = {p.name: p.stat().st_mtime_ns
              for p in (tmp_path / "a" / "shards" / "webdataset").glob("*.tar")}
    # New clips (a video aligned later) go to new shards; the old ones are not rewritten.
    corpus = first
    clip = corpus.read("clips").to_pylist()[0]
    extra = dict(clip, clip_id="zzz-new-0-3000", video_id="zzz-new", start_s=0.0, end_s=3.0)
    corpus.write_partitioned("clips", [extra], "extra", done=["zzz-new"])
    report = write_shards(context(corpus, cfg))
    assert report["webdataset"]["written"] == 1
    after = {p.name: p.stat().st_mtime_ns
             for p in (tmp_path / "a" / "shards" / "webdataset").glob("*.tar")}
    assert {k: v for k, v in after.items() if k in before} == before
    assert len(after) == len(before) + 1


def test_shards_a_killed_run_wrote_but_did_not_list_are_listed_by_the_next_run(demo_corpus, tmp_path):
    cfg = _config()
    clean, _ = _corpus(demo_corpus, tmp_path / "clean", cfg)
    killed, _ = _corpus(demo_corpus, tmp_path / "killed", cfg)
    write_shards(context(clean, cfg))
    # The kill: every partition's shards and index written, the listings not yet.
    stage = make_stage(cfg)
    for partition in killed.labels():
        run_partition(stage, context(killed, cfg), partition, stage.batch_size)
    assert not (tmp_path / "killed" / "shards" / "webdataset" / "index.json").exists()
    again = write_shards(context(killed, cfg))  # nothing left to cut: only the listings
    assert again["webdataset"]["written"] == 0 and again["webdataset"]["samples"] > 0
    for fmt in ("webdataset", "parquet"):
        listing = f"shards/{fmt}/index.json"
        assert (tmp_path / "killed" / listing).read_text() == (tmp_path / "clean" / listing).read_text()
    assert not list((tmp_path / "killed" / "shards" / "_index" / "unlisted").iterdir())


@pytest.mark.parametrize("member", ["../../etc/evil.txt", "/abs/evil.json", "a/b.txt", "x..y.txt"])
def test_unsafe_member_names_are_refused_on_read(tmp_path, member):
    import io
    import tarfile

    from pipeline.shards import open_webdataset

    shard = tmp_path / "hostile.tar"
    with tarfile.open(shard, "w") as tar:
        info = tarfile.TarInfo(member)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(ValueError, match="unsafe shard member name"):
        list(open_webdataset(str(shard)))


def test_unsafe_member_names_are_never_written():
    import numpy as np

    from pipeline.shards.samples import Sample
    from pipeline.shards.webdataset import encode

    clip = {"clip_id": "../up-0-1000", "text": "a red sofa"}
    with pytest.raises(ValueError, match="unsafe shard member name"):
        encode(Sample(clip, {"resnet34": np.zeros((1, 2), np.float16)}), None)


def test_training_pairs_read_from_either_shards_equal_the_tables(demo_corpus, tmp_path):
    from pipeline.train.pairs import PairSet

    cfg = _config()
    corpus, _ = _corpus(demo_corpus, tmp_path / "c", cfg)
    # An extractor name with capitals: webdataset lowercases member names on read.
    _features(corpus, "text_MiniLM-L6", 6, pooled=True)
    write_shards(context(corpus, cfg))
    tables = PairSet.from_corpus(corpus, "resnet34", "text_MiniLM-L6")
    assert len(tables) == corpus.read("clips").num_rows > 0
    for kind in ("webdataset", "parquet"):
        shards = PairSet.from_shards(corpus.path(f"shards/{kind}"), "resnet34", "text_MiniLM-L6")
        assert shards.pair_ids == tables.pair_ids and shards.splits == tables.splits, kind
        assert shards.groups == tables.groups and shards.candidates == tables.candidates, kind
        for a, b in zip(shards.visual + shards.text, tables.visual + tables.text):
            assert a.shape == b.shape and np.array_equal(a, b), kind
    with pytest.raises(ValueError, match="no text features"):
        PairSet.from_shards(corpus.path("shards/webdataset"), "resnet34", "text:absent")


def test_a_clip_that_cannot_be_cut_is_in_neither_format_and_not_cut_again(demo_corpus, tmp_path):
    """With clip media on, a clip past the end of its video is an errors row (bad input): it is
    in neither the WebDataset nor the Parquet shards, and a rerun does not try it again."""
    cfg = _config(include_media=True, media={"precision": "copy"})
    corpus, _ = _corpus(demo_corpus, tmp_path / "c", cfg)
    clip = corpus.read("clips").to_pylist()[0]
    ghost = dict(clip, clip_id=f"{clip['video_id']}-900000-903000", start_s=900.0, end_s=903.0,
                 segment_index=999)
    corpus.write_partitioned("clips", [ghost], "ghost", done=[clip["video_id"]])
    first = write_shards(context(corpus, cfg))
    clips = set(corpus.read("clips").column("clip_id").to_pylist())
    in_tars = {s["clip_id"] for s in open_webdataset(corpus.path("shards/webdataset"))}
    in_parquet = set(open_parquet(corpus.path("shards/parquet")).to_table().column("clip_id").to_pylist())
    assert in_tars == in_parquet == clips - {ghost["clip_id"]}
    errors = corpus.read("errors").filter(pc.field("stage") == "shard").to_pylist()
    assert [(e["item_id"], e["kind"]) for e in errors] == [(ghost["clip_id"], "bad_input")]
    assert "ends after the media" in errors[0]["message"]
    assert first["webdataset"]["samples"] == len(clips) - 1
    from pipeline.shards.stage import make_stage
    from pipeline.runner import plan_partition

    plan = plan_partition(make_stage(cfg), context(corpus, cfg), corpus.partition_of(clip["video_id"]))
    assert plan.report.skipped_failed == 1 and plan.report.todo == 0


def test_validate_names_damaged_shards_and_the_next_run_writes_them_again(demo_corpus, tmp_path):
    cfg = _config()
    corpus, _ = _corpus(demo_corpus, tmp_path / "c", cfg)
    write_shards(context(corpus, cfg))
    tars = sorted((tmp_path / "c" / "shards" / "webdataset").glob("*.tar"))
    parts = sorted((tmp_path / "c" / "shards" / "parquet").rglob("*.parquet"))
    assert len(tars) >= 3 and parts
    before = {p: p.read_bytes() for p in tars + parts}
    sharded = corpus_status(corpus, cfg)["stages"]["shard"]
    assert sharded["todo"] == 0
    tars[0].unlink()
    tars[1].write_bytes(before[tars[1]][:1000])
    altered = bytearray(before[tars[2]])
    altered[600] ^= 0xFF  # same size, one byte of the first member's data
    tars[2].write_bytes(bytes(altered))
    parts[0].write_bytes(b"not parquet" * 10)

    def named(problems) -> dict[str, str]:
        return {p.message.split(":")[0].rsplit("/", 1)[-1]: p.message for p in problems}

    quick = named(validate(corpus, hashes=False))
    assert set(quick) == {tars[0].name, tars[1].name, parts[0].name}  # sizes alone
    problems = validate(corpus)
    found = named(problems)
    assert set(found) == {tars[0].name, tars[1].name, tars[2].name, parts[0].name}
    assert found[tars[0].name].endswith("missing")
    assert "1000 bytes, the shard index recorded" in found[tars[1].name]
    assert "sha256 differs" in found[tars[2].name]
    assert all(p.table == "shards" for p in problems)

    assert "taken out of the shard index" in hand_back(corpus, problems)
    after = corpus_status(corpus, cfg)["stages"]["shard"]
    assert 0 < after["todo"] and after["done"] + after["todo"] == sharded["done"]
    rewritten = write_shards(context(corpus, cfg))
    assert rewritten["webdataset"]["written"] == after["todo"]
    assert validate(corpus) == []
    # Written again under the same names, with the same bytes, and no shard more.
    now = sorted((tmp_path / "c" / "shards" / "webdataset").glob("*.tar"))
    assert now == tars and all(p.read_bytes() == before[p] for p in tars + parts)
    assert len(list(open_webdataset(corpus.path("shards/webdataset")))) == sharded["done"]
