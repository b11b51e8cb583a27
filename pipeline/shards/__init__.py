"""Training-ready shards, and readers for training code elsewhere.

    from pipeline.shards import open_webdataset, open_parquet
    for sample in open_webdataset("corpus/shards/webdataset", features=["resnet34"]):
        sample["clip_id"], sample["text"], sample["features"]["resnet34"]  # numpy [T, 512]
    dataset = open_parquet("corpus/shards/parquet")   # a pyarrow dataset, split as a column
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

import fsspec
import numpy as np
import pyarrow.dataset as ds

from pipeline.ids import check_member, feature_key
from pipeline.shards.stage import write_shards

__all__ = ["feature_array", "open_parquet", "open_webdataset", "shard_urls", "write_shards"]


def shard_urls(url: str, split: str | None = None) -> list[str]:
    """Shard files of a WebDataset folder (from its index.json), or ``url`` itself when it
    names shards already (a .tar file or a brace pattern)."""
    if url.endswith(".tar") or "{" in url:
        return [url]
    with fsspec.open(posixpath.join(url, "index.json"), "rt") as handle:
        index = json.load(handle)
    return [posixpath.join(url, s["name"]) for s in index["shards"]
            if split is None or s["split"] == split]


def _sample(raw: dict[str, Any], keys: dict[str, str] | None) -> dict[str, Any]:
    # Shards may come from elsewhere: refuse member names a consumer could not safely extract.
    for member in raw:
        if not member.startswith("__"):
            check_member(f"{raw['__key__']}.{member}")
    features = {}
    for member, value in raw.items():
        if member.endswith(".npy"):
            name = member[: -len(".npy")]
            if keys is None:
                features[name] = value
            elif name in keys:
                features[keys[name]] = value
    out = {"clip_id": raw["__key__"], "json": raw["json"], "text": raw["txt"],
           "features": features}
    if "mp4" in raw:
        out["mp4"] = raw["mp4"]
    return out


def open_webdataset(url: str, features: list[str] | None = None, split: str | None = None,
                    shuffle: int = 0) -> Any:
    """A ``webdataset`` pipeline over a corpus's shards yielding dicts: clip_id, json (dict),
    text, features ({feature key: numpy array}), mp4 (bytes, when the shards have media).
    ``webdataset`` lowercases member names, so without ``features`` the keys come lowercased;
    with it, they are the feature keys of the names asked for (``text:MiniLM`` -> ``text_MiniLM``)."""
    import webdataset as wds

    keys = None if features is None else {feature_key(f).lower(): feature_key(f) for f in features}
    urls = shard_urls(url, split)
    if not urls:
        raise ValueError(f"no WebDataset shards{f' of split {split!r}' if split else ''} in {url}")
    pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    if shuffle:
        pipeline = pipeline.shuffle(shuffle)
    return pipeline.decode().map(lambda raw: _sample(raw, keys))


def open_parquet(url: str) -> ds.Dataset:
    """The Parquet shards as a pyarrow dataset (``split`` comes from the folder names)."""
    return ds.dataset(url, format="parquet", partitioning="hive",
                      exclude_invalid_files=False, ignore_prefixes=[".", "_", "index.json", "README.md"])


def feature_array(values: Any, shape: list[int]) -> np.ndarray:
    """A Parquet shard's flattened feature column value back as its float16 array."""
    return np.asarray(values, dtype=np.float16).reshape(shape)
