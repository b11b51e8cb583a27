"""Dataset cards of the shard folders: ``shards/<format>/README.md``, a Hugging Face dataset
card whose YAML header names the data files of each split (``configs``) and their columns
(``dataset_info.features``), so that ``datasets.load_dataset(folder)`` gives the corpus's
train/val/test splits with their columns (without it, every file is one "train" split).

A card is written with the listings, once per build, from what the listing knows (splits,
counts, sizes) and the first listed shard of the format: the footer of a Parquet file, the
first sample of a tar. It is rewritten only when its text changes. Shards are never rewritten,
so those written before an extractor was added lack its columns: the card describes the shard
it read (and ``datasets`` loads no split of Parquet files with different columns, card or not).
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipeline.shards.index import ROOT
from pipeline.corpus.storage import Corpus
from schemas.tables import CLIPS, SHARD_SCORE

CARD = "README.md"
SPLIT_ORDER = ("train", "val", "test")


def card_path(fmt: str) -> str:
    return f"{ROOT}/{fmt}/{CARD}"


def split_files(fmt: str, split: str) -> str:
    """The data files of one split, as a glob relative to the format's folder."""
    return f"split={split}/*.parquet" if fmt == "parquet" else f"{split}-*.tar"


def _dtype(kind: pa.DataType) -> str | dict[str, Any]:
    """An Arrow type as the ``datasets`` YAML writes it: a dtype name, or a list/struct."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return {"list": _dtype(kind.value_type)}
    if pa.types.is_struct(kind):
        return {"struct": [_feature(kind.field(i)) for i in range(kind.num_fields)]}
    if pa.types.is_string(kind):
        return "string"
    if pa.types.is_timestamp(kind):
        return f"timestamp[{kind.unit}{f', tz={kind.tz}' if kind.tz else ''}]"
    # Arrow calls the floats halffloat, float and double.
    return {"halffloat": "float16", "float": "float32", "double": "float64"}.get(str(kind), str(kind))


def _feature(field: pa.Field) -> dict[str, Any]:
    kind = _dtype(field.type)
    return {"name": field.name, **(kind if isinstance(kind, dict) else {"dtype": kind})}


def _nested(dtype: str, ndim: int) -> dict[str, Any]:
    kind: Any = dtype
    for _ in range(ndim):
        kind = {"list": kind}
    return kind if isinstance(kind, dict) else {"dtype": kind}


def parquet_features(corpus: Corpus, entries: list[dict]) -> list[dict[str, Any]]:
    """The columns of the Parquet shards, from the footer of one of them."""
    with corpus.fs.open(corpus.path(ROOT, "parquet", entries[0]["name"]), "rb") as handle:
        schema = pq.read_schema(handle)
    return [_feature(field) for field in schema]


def webdataset_features(corpus: Corpus, entries: list[dict]) -> list[dict[str, Any]]:
    """The members of a WebDataset sample, from the first sample of one tar (member headers,
    and the header of each .npy for its dtype and number of dimensions)."""
    members: dict[str, dict[str, Any]] = {}
    with corpus.fs.open(corpus.path(ROOT, "webdataset", entries[0]["name"]), "rb") as handle, \
            tarfile.open(fileobj=handle, mode="r:") as tar:
        key = None
        for info in tar:
            base, _, member = info.name.partition(".")
            if key is not None and base != key:
                break
            key = base
            if member == "json":
                # The clip row, and its score when the shards carry one.
                fields = [*CLIPS, SHARD_SCORE] if "score" in json.load(tar.extractfile(info)) else list(CLIPS)
                members[member] = {"struct": [_feature(f) for f in fields]}
            elif member == "txt":
                members[member] = {"dtype": "string"}
            elif member == "mp4":
                # Bytes, not datasets.Video(), which decodes on access and needs torchcodec.
                members[member] = {"dtype": "binary"}
            elif member.endswith(".npy"):
                npy = tar.extractfile(info)
                version = np.lib.format.read_magic(npy)
                read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                        else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read(npy)
                members[member] = _nested(dtype.name, len(shape))
            else:
                members[member] = {"dtype": "binary"}
    # datasets adds the sample's key and the tar it came from.
    members |= {"__key__": {"dtype": "string"}, "__url__": {"dtype": "string"}}
    return [{"name": name, **kind} for name, kind in members.items()]


def _splits(entries: list[dict]) -> dict[str, dict[str, int]]:
    """Per split, in train/val/test order: clips, shards and bytes."""
    out: dict[str, dict[str, int]] = {}
    for entry in entries:
        split = out.setdefault(entry["split"], {"clips": 0, "shards": 0, "bytes": 0})
        split["clips"] += entry["count"]
        split["shards"] += 1
        split["bytes"] += entry["bytes"]
    order = {name: i for i, name in enumerate(SPLIT_ORDER)}
    return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


_WHAT = {
    "parquet": "one row per clip: the clip (`clip_id`, `video_id`, `start_s`, `end_s`, `text`, "
               "`source`, `policy`, `segment_index`, `candidates`; `score` when the corpus scores "
               "its clips) and, per feature extractor, its float16 values flattened (`<extractor>`) "
               "and their shape (`<extractor>_shape`). Files: `split=<split>/<split>-<partition>-<n>.parquet`.",
    "webdataset": "one sample per clip, keyed by `clip_id`: `json` (the clip row, with its `score` "
                  "when the corpus scores its clips), `txt` (its sentence), `<extractor>.npy` "
                  "(float16 features, `[T, D]` or `[D]`) and `mp4` when the corpus keeps clip media "
                  "(bytes: `.cast_column(\"mp4\", datasets.Video())` decodes them, with torchcodec). "
                  "Files: `<split>-<partition>-<n>.tar`.",
}


def _body(name: str, fmt: str, splits: dict[str, dict[str, int]]) -> str:
    # No paths of the root here: a card is the same wherever the corpus is built or moved.
    rows = "\n".join(f"| {s} | {c['clips']} | {c['shards']} | {c['bytes']} |" for s, c in splits.items())
    first = json.dumps(next(iter(splits)))
    lines = [
        f"# {name}: {'Parquet' if fmt == 'parquet' else 'WebDataset'} shards",
        "",
        f"Clip-sentence pairs of the vlcorpus corpus `{name}`, with their features: {_WHAT[fmt]} "
        "`index.json` lists every shard with its clip count, size and sha256. vlcorpus rewrites "
        "this card with that listing at each build.",
        "",
        "| split | clips | shards | bytes |",
        "|---|---|---|---|",
        rows,
        "",
        "## Loading",
        "",
        "With `folder` the path of this folder (`<corpus root>/shards/" + fmt + "`):",
        "",
        "```python",
        "import datasets",
        f"splits = datasets.load_dataset(folder)   # {', '.join(splits)}",
        "```",
        "",
    ]
    if fmt == "parquet":
        lines += [
            "DuckDB (the split is the folder's hive partition):",
            "",
            "```python",
            "import duckdb",
            "duckdb.sql(f\"select split, count(*) from read_parquet('{folder}/*/*.parquet', "
            "hive_partitioning=true) group by split\")",
            "```",
            "",
        ]
    lines += [
        "PyTorch (features vary in length between clips: batches as lists of rows):",
        "",
        "```python",
        "from torch.utils.data import DataLoader",
        f"loader = DataLoader(splits[{first}].with_format(\"torch\"), batch_size=32, shuffle=True,",
        "                    collate_fn=list)",
        "```",
        "",
    ]
    return "\n".join(lines)


def card_text(corpus: Corpus, name: str, fmt: str, entries: list[dict]) -> str:
    """The dataset card of one format's folder, from its listing (``index.json`` entries)."""
    splits = _splits(entries)
    features = parquet_features(corpus, entries) if fmt == "parquet" else webdataset_features(corpus, entries)
    # datasets caches a folder with a card by the card's header alone (not by the files it
    # names): the counts and a digest of the listing make a header that changes when the
    # shards do. The counts are checked on load: shards beyond the listing (a build writing
    # them) are refused, not mixed in. num_bytes: the split's shard files.
    digest = hashlib.sha256("\n".join(f"{e['name']} {e['sha256']}" for e in entries).encode())
    header = {
        "pretty_name": name,
        "configs": [{"config_name": "default",
                     "description": f"vlcorpus {fmt} shards of {name}, listing {digest.hexdigest()[:16]}",
                     "data_files": [{"split": s, "path": split_files(fmt, s)} for s in splits]}],
        "dataset_info": {"config_name": "default", "features": features,
                         "splits": [{"name": s, "num_bytes": c["bytes"], "num_examples": c["clips"]}
                                    for s, c in splits.items()],
                         "download_size": sum(c["bytes"] for c in splits.values())},
    }
    yaml_text = yaml.safe_dump(header, sort_keys=False, allow_unicode=True, width=100)
    return f"---\n{yaml_text}---\n\n{_body(name, fmt, splits)}"


def write_cards(corpus: Corpus, name: str, listings: dict[str, list[dict]]) -> dict[str, str]:
    """Write (or bring up to date) the card of each format that has shards; returns the paths
    of the cards written."""
    written = {}
    for fmt, entries in listings.items():
        path = card_path(fmt)
        full = corpus.path(path)
        if not entries:
            # No shards (anymore): no card that names splits without files.
            if corpus.fs.exists(full):
                corpus.fs.rm(full)
            continue
        text = card_text(corpus, name, fmt, entries)
        if corpus.fs.exists(full) and corpus.fs.cat(full).decode() == text:
            continue
        written[fmt] = corpus.write_text(path, text)
    return written


def read_card_header(text: str) -> dict[str, Any]:
    """The YAML header of a card (for tests and tools)."""
    _, header, _ = text.split("---\n", 2)
    return yaml.safe_load(header)


__all__ = ["card_path", "card_text", "read_card_header", "split_files", "write_cards"]
