"""Shards that load as they are: Hugging Face ``datasets`` (through the dataset card of each
shard folder, and every other way its documentation shows for local Parquet and WebDataset
files), DuckDB, Dask and PyTorch read a real small corpus's shards and tables, with the Python
blocks of docs/outputs.md (run as written there, on this corpus's root)."""

from __future__ import annotations

import hashlib
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import parse_config
from pipeline.ids import batch_name
from pipeline.shards import write_shards
from pipeline.shards.card import card_path, read_card_header
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
from schemas.tables import shard_schema

datasets = pytest.importorskip("datasets")
duckdb = pytest.importorskip("duckdb")

OUTPUTS = Path(__file__).resolve().parents[2] / "docs" / "outputs.md"
DEMO_ROOT = "demo-corpus/corpus"  # the root the page's snippets name
FEATURES = {"resnet34": (8, False), "text_minilm": (6, True)}  # name: (dim, pooled)


def _config(name: str = "tiny-tours"):
    return parse_config({"name": name, "sources": [{"type": "urls", "urls": ["http://x/"]}],
                         "shards": {"samples_per_shard": 3}})


def _add_videos(corpus: Corpus, splits: dict[str, str], langs: dict[str, str]) -> None:
    """Videos, downloads, segments, clips and features rows as the stages write them (no media:
    shards without clip media need no ffmpeg). Each video has 2-3 sentences, one clip each; the
    clips of demo-v004 have MIL-NCE candidates, the others none."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    vids = sorted(splits)
    corpus.write_partitioned("videos", [
        {"video_id": v, "url": f"http://127.0.0.1/{v}", "extractor": "demo", "source": "urls",
         "discovered_at": now} for v in vids], f"v-{batch_name(vids)}", done=vids)
    corpus.write_partitioned("downloads", [
        {"video_id": v, "media_path": f"media/{v}.mp4", "status": "ok", "downloaded_at": now}
        for v in vids], f"d-{batch_name(vids)}", done=vids)
    segments, clips = [], []
    for v in vids:
        for i in range(2 + sum(map(ord, v)) % 2):
            text = f"sentence {i} of {v}"
            segments.append({"video_id": v, "index": i, "start_s": float(i), "end_s": i + 0.9,
                             "text": text, "source": "manual", "lang": langs.get(v, "en")})
            clips.append({"clip_id": f"{v}-{i * 1000}-{i * 1000 + 900}", "video_id": v,
                          "start_s": float(i), "end_s": i + 0.9, "text": text, "source": "manual",
                          "policy": "subtitle_span", "segment_index": i,
                          "candidates": [f"{v}-c{i}"] if v.endswith("4") else [], "split": splits[v]})
    corpus.write_partitioned("segments", segments, f"s-{batch_name(vids)}", done=vids)
    corpus.write_partitioned("clips", clips, f"c-{batch_name(vids)}", done=vids)
    ids = sorted(c["clip_id"] for c in clips)
    for name, (dim, pooled) in FEATURES.items():
        rows = []
        for clip in clips:
            seed = int(hashlib.sha1(f"{name}{clip['clip_id']}".encode()).hexdigest()[:8], 16)
            shape = [dim] if pooled else [1 + seed % 4, dim]
            array = np.random.default_rng(seed).standard_normal(shape).astype(np.float16)
            rows.append({"clip_id": clip["clip_id"], "extractor": name, "weights": "none",
                         "fps": None if pooled else 2.0, "frames": None if pooled else shape[0],
                         "shape": shape, "values": array.reshape(-1).tolist()})
        corpus.write_partitioned(f"features/{name}", rows, f"f-{batch_name(ids)}", done=ids)


def _build(root: Path, splits: dict[str, str], langs: dict[str, str] | None = None) -> Corpus:
    corpus = Corpus(str(root))
    corpus.init_partitions(2)
    _add_videos(corpus, splits, langs or {})
    write_shards(context(corpus, _config()))
    return corpus


SPLITS = {"demo-v000": "train", "demo-v001": "train", "demo-v002": "test", "demo-v003": "val",
          "demo-v004": "train", "demo-v005": "test"}


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """``datasets`` offline (no hub here), with its cache under a temporary folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf-cache"))
        datasets.disable_progress_bars()
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    return _build(tmp_path_factory.mktemp("readers") / "corpus", SPLITS, {"demo-v003": "de"})


def _clips(corpus: Corpus) -> dict[str, dict]:
    return {c["clip_id"]: c for c in corpus.read("clips").to_pylist()}


def _by_split(corpus: Corpus) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for cid, clip in _clips(corpus).items():
        out.setdefault(clip["split"], set()).add(cid)
    return out


def docs_snippets() -> list[str]:
    """The Python blocks of docs/outputs.md, in page order (later ones use what earlier ones
    loaded)."""
    blocks = re.findall(r"```python\n(.*?)```", OUTPUTS.read_text(encoding="utf-8"), flags=re.S)
    assert any("datasets.load_dataset(" in b for b in blocks) and any("duckdb.sql(" in b for b in blocks)
    return blocks


@pytest.fixture(scope="module")
def snippets(corpus, offline) -> dict:
    """What the page's snippets give on this corpus (its root in place of the demo's)."""
    pytest.importorskip("torch")
    namespace: dict = {}
    for block in docs_snippets():
        exec(block.replace(DEMO_ROOT, corpus.root), namespace)  # noqa: S102
    return namespace


def test_cards_name_the_splits_there_are_and_the_columns(corpus):
    counts = {s: len(c) for s, c in _by_split(corpus).items()}
    parquet = read_card_header(Path(corpus.path(card_path("parquet"))).read_text())
    [config] = parquet["configs"]
    assert config["config_name"] == "default" and config["data_files"] == [
        {"split": "train", "path": "split=train/*.parquet"},
        {"split": "val", "path": "split=val/*.parquet"},
        {"split": "test", "path": "split=test/*.parquet"}]
    assert {s["name"]: s["num_examples"] for s in parquet["dataset_info"]["splits"]} == counts
    columns = [f["name"] for f in parquet["dataset_info"]["features"]]
    assert columns == shard_schema(list(FEATURES)).names
    assert {"name": "resnet34", "list": "float16"} in parquet["dataset_info"]["features"]

    tars = read_card_header(Path(corpus.path(card_path("webdataset"))).read_text())
    assert tars["configs"][0]["data_files"] == [
        {"split": s, "path": f"{s}-*.tar"} for s in ("train", "val", "test")]
    members = {f["name"]: f for f in tars["dataset_info"]["features"]}
    assert list(members) == ["json", "txt", "resnet34.npy", "text_minilm.npy", "__key__", "__url__"]
    assert members["resnet34.npy"] == {"name": "resnet34.npy", "list": {"list": "float16"}}
    assert members["text_minilm.npy"] == {"name": "text_minilm.npy", "list": "float16"}
    body = Path(corpus.path(card_path("parquet"))).read_text()
    for split in ("train", "val", "test"):
        assert re.search(rf"^\| {split} \| {counts[split]} \| \d+ \| \d+ \|$", body, flags=re.M)


def test_datasets_loads_the_parquet_shards_by_split(corpus, snippets):
    splits = snippets["splits"]
    by_split = _by_split(corpus)
    assert isinstance(splits, datasets.DatasetDict)
    assert list(splits) == ["train", "val", "test"]
    for split, clip_ids in by_split.items():
        assert splits[split].num_rows == len(clip_ids)
        assert set(splits[split]["clip_id"]) == clip_ids
        assert splits[split].column_names == shard_schema(list(FEATURES)).names
    assert not set(splits["train"]["clip_id"]) & by_split["test"]
    clips = _clips(corpus)
    row = splits["test"][0]
    assert row["text"] == clips[row["clip_id"]]["text"]
    assert len(row["resnet34"]) == int(np.prod(row["resnet34_shape"]))


def test_datasets_loads_the_webdataset_shards_by_split(corpus, snippets):
    by_split = _by_split(corpus)
    clips = _clips(corpus)
    tars = snippets["tars"]
    assert list(tars) == ["train", "val", "test"]
    for split, clip_ids in by_split.items():
        assert tars[split].num_rows == len(clip_ids)
        assert set(tars[split]["__key__"]) == clip_ids
        assert tars[split].column_names == ["json", "txt", "resnet34.npy", "text_minilm.npy",
                                            "__key__", "__url__"]
        # Typed by the card: candidates are strings in every sample, though the first ones
        # have none (inferred from them alone, the type is a list of nulls and later samples fail).
        for sample in tars[split]:
            assert sample["json"]["candidates"] == clips[sample["__key__"]]["candidates"]
            assert sample["txt"] == clips[sample["__key__"]]["text"]
            assert np.asarray(sample["resnet34.npy"]).ndim == 2
    assert any(c["candidates"] for c in clips.values() if c["split"] == "train")

    test = snippets["test"]
    assert list(test) == ["test"] and set(test["test"]["__key__"]) == by_split["test"]
    assert {"json", "txt", "resnet34.npy", "text_minilm.npy", "__key__"} <= set(test["test"].column_names)


def test_duckdb_counts_shards_and_tables(corpus, snippets):
    by_split = _by_split(corpus)
    assert dict(snippets["per_split"]) == {s: len(c) for s, c in by_split.items()}
    clips = _clips(corpus)
    german = sum(1 for c in clips.values() if c["video_id"] == "demo-v003")
    assert dict(snippets["per_lang"]) == {"en": len(clips) - german, "de": german}


# datasets names a split by the keyword in the file names: "val" files make "validation".
HF_SPLIT = {"train": "train", "val": "validation", "test": "test"}


def _keys(dataset, key: str) -> set[str]:
    return {row[key] for row in dataset}


def test_datasets_loads_the_shards_every_documented_way(corpus, snippets):
    """data_dir (Parquet; WebDataset streamed, or typed by the card's features) and data_files,
    as docs/outputs.md shows them: each split holds its clips and no other's."""
    by_split = _by_split(corpus)
    columns = shard_schema(list(FEATURES)).names
    by_name, typed, streamed = snippets["by_name"], snippets["typed"], snippets["streamed"]
    assert sorted(by_name) == sorted(typed) == sorted(streamed) == sorted(HF_SPLIT[s] for s in by_split)
    for split, clip_ids in by_split.items():
        assert by_name[HF_SPLIT[split]].column_names == columns
        assert _keys(by_name[HF_SPLIT[split]], "clip_id") == clip_ids
        assert _keys(typed[HF_SPLIT[split]], "__key__") == clip_ids
        assert _keys(streamed[HF_SPLIT[split]], "__key__") == clip_ids
    clips = _clips(corpus)
    for sample in typed["train"]:
        assert sample["json"]["candidates"] == clips[sample["__key__"]]["candidates"]
    assert _keys(snippets["train"], "clip_id") == by_split["train"]


def test_vlcorpus_dask_and_pytorch_read_the_shards(corpus, snippets):
    """The page's pyarrow, open_webdataset/open_parquet, Dask and DataLoader snippets."""
    assert snippets["videos"].num_rows == len(SPLITS)
    assert snippets["table"].num_rows == len(_clips(corpus))
    assert sorted(snippets["frame"]["split"].unique().compute()) == sorted(_by_split(corpus))
    batch = snippets["batch"]
    assert 0 < len(batch) <= 32 and {"clip_id", "resnet34"} <= set(batch[0])
    assert all(list(row["resnet34"].shape) == row["resnet34_shape"].tolist() for row in batch)


def test_datasets_types_uniform_webdataset_shards_without_a_card(tmp_path, offline):
    """Where the first samples type every field (no clip has candidates here), data_dir needs
    no features, streamed or not; the folder form streams too."""
    corpus = _build(tmp_path / "c", {"demo-v000": "train", "demo-v002": "test", "demo-v003": "val"})
    by_split = _by_split(corpus)
    folder = corpus.path("shards", "webdataset")
    loaded = datasets.load_dataset("webdataset", data_dir=folder)
    assert {s: _keys(loaded[HF_SPLIT[s]], "__key__") for s in by_split} == by_split
    streamed = datasets.load_dataset(corpus.path("shards", "parquet"), streaming=True)
    assert {s: _keys(streamed[s], "clip_id") for s in by_split} == by_split


def _old_part_name(split: str, partition: str, number: int) -> str:
    return f"split={split}/part-{partition}-{number:06d}.parquet"


def _number(path: Path) -> str:
    """A Parquet shard's split folder, partition and number, whichever its name's prefix."""
    return f"{path.parent.name}/{path.name.split('-', 1)[1]}"


def test_a_build_renames_parquet_shards_of_earlier_versions(tmp_path, offline, monkeypatch):
    """Shards named before the split was in their file name (which data_dir needs) are renamed
    by the next build, in the partition index and the listing too, bytes unchanged; one a killed
    build renamed without recording it is found under its new name."""
    from pipeline.shards import stage
    from pipeline.shards.index import PartitionIndex, load_listing
    from pipeline.shards.verify import check_shards

    with monkeypatch.context() as patch:  # as an earlier version wrote them
        patch.setattr(stage, "part_name", _old_part_name)
        patch.setattr(stage, "rename_old_parts", lambda corpus, entries: [])
        corpus = _build(tmp_path / "c", {"demo-v000": "train", "demo-v002": "test", "demo-v003": "val"})
    folder = Path(corpus.path("shards", "parquet"))
    old = sorted(folder.glob("split=*/part-*.parquet"))
    assert old and all(e["name"].split("/")[1].startswith("part-") for e in load_listing(corpus, "parquet"))
    digests = {_number(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in old}
    # A kill after a file's rename and before its index was saved.
    first = old[0]
    first.rename(first.with_name(first.name.replace("part-", f"{first.parent.name[6:]}-")))

    _add_videos(corpus, {"demo-v001": "train"}, {})
    write_shards(context(corpus, _config()))

    assert not list(folder.glob("split=*/part-*"))
    names = [e["name"] for e in load_listing(corpus, "parquet")]
    assert names and all(n.split("/")[1].startswith(n.split("/")[0][6:] + "-") for n in names)
    entries = [entry for label in corpus.labels() for entry in PartitionIndex.load(corpus, label).shards]
    assert entries and all(e.files["parquet"].name.split("/")[1].startswith(f"{e.split}-") for e in entries)
    assert check_shards(corpus, corpus.labels()) == []
    renamed = {_number(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.glob("split=*/*.parquet")}
    assert digests.items() <= renamed.items()
    loaded = datasets.load_dataset("parquet", data_dir=str(folder))
    assert {s: _keys(loaded[HF_SPLIT[s]], "clip_id") for s in _by_split(corpus)} == _by_split(corpus)


def test_a_card_follows_its_listing(tmp_path, offline):
    """Only the splits there are; rewritten when a build adds shards (and datasets, which
    caches a folder with a card by the card, loads the new ones), left alone otherwise; shards
    beyond the card's counts are refused."""
    corpus = _build(tmp_path / "c", {"demo-v000": "train", "demo-v002": "test"})
    folder = str(Path(corpus.root) / "shards" / "parquet")
    card = Path(corpus.path(card_path("parquet")))
    header = read_card_header(card.read_text())
    assert [f["split"] for f in header["configs"][0]["data_files"]] == ["train", "test"]
    loaded = datasets.load_dataset(folder)
    assert {s: loaded[s].num_rows for s in loaded} == {s: len(c) for s, c in _by_split(corpus).items()}
    assert not list(card.parent.glob(".tmp-*"))

    before = card.stat().st_mtime_ns
    write_shards(context(corpus, _config()))
    assert card.stat().st_mtime_ns == before

    for video, split in (("demo-v001", "train"), ("demo-v003", "val")):
        _add_videos(corpus, {video: split}, {})
        write_shards(context(corpus, _config()))
        loaded = datasets.load_dataset(folder)
        assert {s: loaded[s].num_rows for s in loaded} == {s: len(c) for s, c in _by_split(corpus).items()}
    header = read_card_header(card.read_text())
    assert [f["split"] for f in header["configs"][0]["data_files"]] == ["train", "val", "test"]

    # A shard the listing does not have yet (a build writing shards): its clips are not mixed in.
    part = next(card.parent.glob("split=train/*.parquet"))
    shutil.copy(part, part.with_name("train-00009-000000.parquet"))
    with pytest.raises(datasets.exceptions.NonMatchingSplitsSizesError):
        datasets.load_dataset(folder, cache_dir=str(tmp_path / "fresh-cache"))


def test_the_card_snippets_run(corpus, offline):
    """The loading snippets of each card, as written into it, with ``folder`` set as it says."""
    pytest.importorskip("torch")
    for fmt in ("parquet", "webdataset"):
        text = Path(corpus.path(card_path(fmt))).read_text()
        assert corpus.root not in text  # the same card wherever the corpus is
        namespace: dict = {"folder": corpus.path("shards", fmt)}
        queried = 0
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
            exec(block, namespace)  # noqa: S102
            if "duckdb.sql(" in block:
                counts = eval(block.strip().splitlines()[-1], namespace).fetchall()  # noqa: S307
                assert dict(counts) == {s: len(c) for s, c in _by_split(corpus).items()}
                queried += 1
        assert queried == (fmt == "parquet")  # the Parquet card's DuckDB snippet ran
        assert list(namespace["splits"]) == ["train", "val", "test"]
        batch = next(iter(namespace["loader"]))
        assert 0 < len(batch) <= 32
        assert {"resnet34", "resnet34.npy"} & set(batch[0])


def test_scored_shards_load_with_their_score(tmp_path, offline):
    """With a score section the shards carry each clip's score: the Parquet card lists the
    column, the WebDataset card types it in the JSON, and datasets loads it in both."""
    corpus = Corpus(str(tmp_path / "c"))
    corpus.init_partitions(2)
    _add_videos(corpus, SPLITS, {})
    clips = _clips(corpus)
    scores = {cid: round(0.01 * i, 2) for i, cid in enumerate(sorted(clips))}
    corpus.write_partitioned("scores/nce", [
        {"clip_id": cid, "model": "nce", "checkpoint": "file:best.pt#000000000000", "similarity": score,
         "rank": 1, "sentences": 2, "p_aligned": None} for cid, score in scores.items()], "s", done=sorted(scores))
    cfg = parse_config({"name": "scored", "sources": [{"type": "urls", "urls": ["http://x/"]}],
                        "score": {"model": "nce"}, "shards": {"samples_per_shard": 3}})
    write_shards(context(corpus, cfg))

    parquet = read_card_header(Path(corpus.path(card_path("parquet"))).read_text())
    assert [f["name"] for f in parquet["dataset_info"]["features"]] == shard_schema(list(FEATURES), score=True).names
    assert {"name": "score", "dtype": "float32"} in parquet["dataset_info"]["features"]
    tars = read_card_header(Path(corpus.path(card_path("webdataset"))).read_text())
    (clip_row,) = [f for f in tars["dataset_info"]["features"] if f["name"] == "json"]
    assert clip_row["struct"][-1] == {"name": "score", "dtype": "float32"}

    for fmt, read in (("parquet", lambda row: (row["clip_id"], row["score"])),
                      ("webdataset", lambda row: (row["__key__"], row["json"]["score"]))):
        loaded = datasets.load_dataset(corpus.path("shards", fmt))
        assert list(loaded) == ["train", "val", "test"]
        found = dict(read(row) for split in loaded.values() for row in split)
        assert found.keys() == scores.keys()
        assert all(found[cid] == pytest.approx(score) for cid, score in scores.items())


def test_webdataset_card_types_clip_media_as_bytes(tmp_path):
    """Members from the first sample of a tar: ``mp4`` as bytes (datasets' Video would need
    torchcodec to read a row), each .npy nested as deep as its array."""
    import io
    import tarfile

    from pipeline.shards.card import webdataset_features
    from pipeline.shards.webdataset import npy_bytes

    corpus = Corpus(str(tmp_path))
    (tmp_path / "shards" / "webdataset").mkdir(parents=True)
    members = {"a.json": b"{}", "a.txt": b"hi", "a.s3d.npy": npy_bytes(np.zeros((2, 3, 4), np.float32)),
               "a.mp4": b"\0" * 8, "b.json": b"{}", "b.other.npy": npy_bytes(np.zeros(2, np.float16))}
    with tarfile.open(tmp_path / "shards" / "webdataset" / "train-00000-000000.tar", "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    features = {f["name"]: f for f in webdataset_features(corpus, [{"name": "train-00000-000000.tar"}])}
    assert list(features) == ["json", "txt", "s3d.npy", "mp4", "__key__", "__url__"]
    assert features["mp4"] == {"name": "mp4", "dtype": "binary"}
    assert features["s3d.npy"] == {"name": "s3d.npy", "list": {"list": {"list": "float32"}}}
