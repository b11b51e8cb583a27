"""Training pairs: an in-memory set of video-text pairs and its loaders.

A `PairSet` holds, per pair, a visual array ([D] or [T, D] frames, T may vary) and a text array
([D] or [K, D] token vectors), the pair's group (its source video), its split and, for MIL-NCE,
candidate positives (indices of other pairs whose text is also a positive of this clip); where
known, the sentence itself and its activity phrases (Torabi et al.'s multiple-choice test).

Loaders: `PairSet.from_corpus` (features tables joined with clips), `PairSet.from_shards` (the
corpus's WebDataset or Parquet shards alone) and `PairSet.from_pairs_file` (the external parquet
schema, see `PAIRS_SCHEMA`); `to_pairs_file` and `to_corpus` (clips and features tables, for
the stages after featurize) write them. Batches drawn from a `PairSet` are in `pipeline.train.batches`.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.ids import feature_key

SPLITS = ("train", "val", "test")

PAIRS_SCHEMA = pa.schema([
    pa.field("pair_id", pa.string(), nullable=False),
    pa.field("group", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("visual", pa.list_(pa.list_(pa.float32())), nullable=False),
    pa.field("text", pa.list_(pa.list_(pa.float32())), nullable=False),
    pa.field("candidates", pa.list_(pa.string())),
    pa.field("caption", pa.string()),
    pa.field("activities", pa.list_(pa.string())),
])


class PairsError(ValueError):
    """Pairs that cannot be used; the message names the source and the column."""


@dataclass
class PairSet:
    pair_ids: list[str]
    groups: list[str]
    splits: list[str]
    visual: list[np.ndarray]
    text: list[np.ndarray]
    candidates: list[list[int]] | None = None  # indices into this set, own pair excluded
    meta: dict[str, Any] = field(default_factory=dict)
    captions: list[str] | None = None  # the sentence of each pair
    activities: list[list[str]] | None = None  # its activity phrases ("predicate object")

    def __post_init__(self) -> None:
        n = len(self.pair_ids)
        for name in ("groups", "splits", "visual", "text"):
            if len(getattr(self, name)) != n:
                raise PairsError(f"{name}: {len(getattr(self, name))} entries for {n} pairs")
        for name in ("candidates", "captions", "activities"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise PairsError(f"{name}: {len(values)} entries for {n} pairs")
        self.visual = [np.asarray(v, dtype=np.float32) for v in self.visual]
        self.text = [np.asarray(t, dtype=np.float32) for t in self.text]
        for name in ("visual", "text"):
            arrays = getattr(self, name)
            dims = {a.shape[-1] for a in arrays if a.ndim in (1, 2)}
            bad = [i for i, a in enumerate(arrays) if a.ndim not in (1, 2) or a.size == 0]
            if bad:
                raise PairsError(f"{name}: pair {self.pair_ids[bad[0]]!r} has shape {arrays[bad[0]].shape}; "
                                 f"expected [D] or [T, D] with no empty axis")
            if len(dims) > 1:
                raise PairsError(f"{name}: pairs disagree on the feature dimension: {sorted(dims)}")
        bad_split = sorted({s for s in self.splits if s not in SPLITS})
        if bad_split:
            raise PairsError(f"split: unknown value(s) {bad_split}; allowed: {', '.join(SPLITS)}")

    def __len__(self) -> int:
        return len(self.pair_ids)

    @property
    def visual_dim(self) -> int:
        return int(self.visual[0].shape[-1])

    @property
    def text_dim(self) -> int:
        return int(self.text[0].shape[-1])

    def subset(self, split: str | Sequence[int]) -> PairSet:
        """The pairs of one split (or of the given indices); candidates outside are dropped."""
        if isinstance(split, str):
            idx = [i for i, s in enumerate(self.splits) if s == split]
        else:
            idx = list(split)
        remap = {old: new for new, old in enumerate(idx)}
        cands = None
        if self.candidates is not None:
            cands = [[remap[c] for c in self.candidates[i] if c in remap] for i in idx]
        def pick(values: list | None) -> list | None:
            return None if values is None else [values[i] for i in idx]

        return PairSet([self.pair_ids[i] for i in idx], [self.groups[i] for i in idx],
                       [self.splits[i] for i in idx], [self.visual[i] for i in idx],
                       [self.text[i] for i in idx], cands, dict(self.meta), pick(self.captions),
                       pick(self.activities))

    # ------------------------------------------------------------------ loaders

    @classmethod
    def from_corpus(cls, corpus: Any, visual_name: str | Sequence[str], text_name: str) -> PairSet:
        """Clips joined with the features of extractors `visual_name` (one, or several to
        concatenate, see `concat_visual`) and `text_name` on clip_id (clips missing any are
        left out)."""
        clips = corpus.read("clips", columns=["clip_id", "video_id", "text", "split", "candidates"]).to_pylist()
        visual_names = [visual_name] if isinstance(visual_name, str) else list(visual_name)
        feats = []
        for role, name in [("visual", n) for n in visual_names] + [("text", text_name)]:
            table = f"features/{feature_key(name)}"
            rows = corpus.read(table, columns=["clip_id", "shape", "values"]).to_pylist()
            if not rows:
                raise PairsError(f"{corpus.url}: {table} ({role} extractor {name!r}) has no rows; "
                                 f"tables present: {', '.join(corpus.tables()) or '(none)'}")
            feats.append({r["clip_id"]: np.asarray(r["values"], dtype=np.float32).reshape(r["shape"])
                          for r in rows})
        return cls._from_clips(clips, concat_visual(feats[:-1]), feats[-1],
                               {"source": corpus.url, "visual": visual_name, "text": text_name})

    @classmethod
    def from_shards(cls, url: str, visual_name: str | Sequence[str], text_name: str) -> PairSet:
        """The same pairs from a corpus's shards alone (say, copied to a training machine): a
        WebDataset folder (or .tar / brace pattern) or a Parquet shard folder."""
        from pipeline.shards import feature_array, open_parquet, open_webdataset

        visual_names = [visual_name] if isinstance(visual_name, str) else list(visual_name)
        roles = [(f"visual{i}", name) for i, name in enumerate(visual_names)] + [("text", text_name)]
        keys = {role: feature_key(name) for role, name in roles}
        feats: dict[str, dict[str, np.ndarray]] = {role: {} for role in keys}
        clips = []
        if _is_webdataset(url):
            for sample in open_webdataset(url, features=[name for _, name in roles]):
                clips.append(sample["json"])
                for role, key in keys.items():
                    if key in sample["features"]:
                        feats[role][sample["clip_id"]] = np.asarray(sample["features"][key], dtype=np.float32)
        else:
            dataset = open_parquet(url)
            missing = [k for k in keys.values() if k not in dataset.schema.names]
            if missing:
                raise PairsError(f"{url}: no column(s) {', '.join(missing)} in the Parquet shards")
            columns = ["clip_id", "video_id", "text", "split", "candidates",
                       *[c for k in keys.values() for c in (k, f"{k}_shape")]]
            for row in dataset.to_table(columns=columns).to_pylist():
                clips.append(row)
                for role, key in keys.items():
                    if row[key] is not None:
                        feats[role][row["clip_id"]] = feature_array(row[key], row[f"{key}_shape"]).astype(np.float32)
        for role, name in roles:
            if not feats[role]:
                raise PairsError(f"{url}: no {role.rstrip('0123456789')} features {name!r} in the shards")
        visual = concat_visual([feats[role] for role, _ in roles[:-1]])
        return cls._from_clips(clips, visual, feats["text"],
                               {"source": url, "visual": visual_name, "text": text_name})

    @classmethod
    def _from_clips(cls, clips: list[dict], visual: dict[str, np.ndarray], text: dict[str, np.ndarray],
                    meta: dict[str, Any]) -> PairSet:
        """Clip rows with both features, in clip_id order. A clip's `candidates` (sentence
        texts) map to the clips of the same video with that text, when there are such clips."""
        keep = sorted((c for c in clips if c["clip_id"] in visual and c["clip_id"] in text),
                      key=lambda c: c["clip_id"])
        by_text: dict[tuple[str, str], int] = {}
        for i, c in enumerate(keep):
            by_text.setdefault((c["video_id"], c["text"]), i)
        cands = []
        for i, c in enumerate(keep):
            found = []
            for sentence in c.get("candidates") or []:
                j = by_text.get((c["video_id"], sentence))
                if j is not None and j != i and j not in found:
                    found.append(j)
            cands.append(found)
        has_cands = any(c.get("candidates") for c in keep)
        return cls([c["clip_id"] for c in keep], [c["video_id"] for c in keep], [c["split"] for c in keep],
                   [visual[c["clip_id"]] for c in keep], [text[c["clip_id"]] for c in keep],
                   cands if has_cands else None, meta, captions=[c["text"] for c in keep])

    @classmethod
    def from_pairs_file(cls, path: str | Path) -> PairSet:
        """Read the external pairs schema (parquet): pair_id, group, split, visual, text and an
        optional candidates column of pair_ids. Every problem names its column."""
        source = str(path)
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise PairsError(f"{source}: cannot read as parquet: {exc}") from None
        names = table.schema.names
        missing = [c for c in ("pair_id", "group", "split", "visual", "text") if c not in names]
        if missing:
            raise PairsError(f"{source}: missing column(s) {', '.join(missing)}; found: {', '.join(names)}")
        cols = {}
        for name in ("pair_id", "group", "split"):
            typ = table.schema.field(name).type
            if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
                raise PairsError(f"{source}: column {name!r} must be string, got {typ}")
            values = table.column(name).to_pylist()
            nulls = [i for i, v in enumerate(values) if v is None or v == ""]
            if nulls:
                raise PairsError(f"{source}: column {name!r} is null or empty in row {nulls[0]}")
            cols[name] = values
        bad = sorted({s for s in cols["split"] if s not in SPLITS})
        if bad:
            raise PairsError(f"{source}: column 'split' has unknown value(s) {bad}; allowed: {', '.join(SPLITS)}")
        seen: dict[str, int] = {}
        for i, pid in enumerate(cols["pair_id"]):
            if pid in seen:
                raise PairsError(f"{source}: column 'pair_id' repeats {pid!r} (rows {seen[pid]} and {i})")
            seen[pid] = i
        arrays = {}
        for name in ("visual", "text"):
            typ = table.schema.field(name).type
            depth, inner = 0, typ
            while pa.types.is_list(inner) or pa.types.is_large_list(inner) or pa.types.is_fixed_size_list(inner):
                depth, inner = depth + 1, inner.value_type
            if depth not in (1, 2) or not pa.types.is_floating(inner):
                raise PairsError(f"{source}: column {name!r} must be list<float32> [D] or "
                                 f"list<list<float32>> [T, D], got {typ}")
            out = []
            for i, value in enumerate(table.column(name).to_pylist()):
                if value is None or len(value) == 0 or (depth == 2 and any(v is None or len(v) == 0 for v in value)):
                    raise PairsError(f"{source}: column {name!r} is null or empty in row {i}")
                try:
                    a = np.asarray(value, dtype=np.float32)
                except ValueError:
                    raise PairsError(f"{source}: column {name!r} row {i}: rows of a [T, D] array "
                                     f"differ in length") from None
                if a.ndim != depth:
                    raise PairsError(f"{source}: column {name!r} row {i}: ragged or null values")
                if not np.isfinite(a).all():
                    raise PairsError(f"{source}: column {name!r} row {i}: non-finite values")
                out.append(a)
            dims = {a.shape[-1] for a in out}
            if len(dims) > 1:
                raise PairsError(f"{source}: column {name!r}: rows disagree on the dimension D: {sorted(dims)}")
            arrays[name] = out
        cands = None
        if "candidates" in names:
            cands = []
            for i, value in enumerate(table.column("candidates").to_pylist()):
                idx = []
                for pid in value or []:
                    if pid not in seen:
                        raise PairsError(f"{source}: column 'candidates' row {i} names unknown pair_id {pid!r}")
                    if seen[pid] != i and seen[pid] not in idx:
                        idx.append(seen[pid])
                cands.append(idx)
        captions = activities = None
        if "caption" in names:
            captions = [c or "" for c in _typed_column(table, "caption", source, pa.types.is_string)]
        if "activities" in names:
            activities = [list(a or []) for a in _typed_column(
                table, "activities", source, lambda t: pa.types.is_list(t) and pa.types.is_string(t.value_type))]
        return cls(cols["pair_id"], cols["group"], cols["split"], arrays["visual"], arrays["text"], cands,
                   {"source": source}, captions, activities)

    def to_corpus(self, corpus: Any, visual_name: str = "resnet34", text_name: str = "text:pairs",
                  partitions: int = 2, batch: str = "pairs") -> list[str]:
        """Write the pairs as a corpus's clips and features tables (`features/<visual_name>`,
        `features/<text_name>`), so that the stages after featurize (train, score, shard) run on
        them: group g is video `pairs-<g>`, its k-th pair the clip `pairs-<g>-<k*1000>-<k*1000+1000>`
        whose text is the pair's caption (else its pair id). A batch of another name adds to the
        tables (of the same name: replaces what that one wrote). Returns the clip ids in pair order."""
        from pipeline.ids import clip_id, safe_id

        corpus.init_partitions(partitions)
        position: dict[str, int] = {}
        clips, visual, text, ids = [], [], [], []
        captions = self.captions or self.pair_ids
        for i, (group, split) in enumerate(zip(self.groups, self.splits)):
            video = f"pairs-{safe_id(group)}"
            k = position[video] = position.get(video, -1) + 1
            cid = clip_id(video, k, k + 1)
            ids.append(cid)
            cands = None if self.candidates is None else [captions[j] for j in self.candidates[i]]
            clips.append({"clip_id": cid, "video_id": video, "start_s": float(k), "end_s": float(k + 1),
                          "text": captions[i], "source": "manual", "policy": "fixed", "segment_index": k,
                          "candidates": cands, "split": split})
            for rows, name, array in ((visual, visual_name, self.visual[i]), (text, text_name, self.text[i])):
                rows.append({"clip_id": cid, "extractor": name, "weights": "none", "shape": list(array.shape),
                             "values": array.reshape(-1).astype(np.float16)})
        corpus.write_partitioned("clips", clips, batch, done=sorted(position))
        for name, rows in ((visual_name, visual), (text_name, text)):
            corpus.write_partitioned(f"features/{feature_key(name)}", rows, batch, done=ids)
        return ids

    def to_pairs_file(self, path: str | Path) -> None:
        """Write the external pairs schema (the inverse of `from_pairs_file`)."""
        def column(arrays: list[np.ndarray]) -> pa.Array:
            if all(a.ndim == 1 for a in arrays):
                return pa.array([a.tolist() for a in arrays], type=pa.list_(pa.float32()))
            return pa.array([np.atleast_2d(a).tolist() for a in arrays], type=pa.list_(pa.list_(pa.float32())))

        data = {"pair_id": pa.array(self.pair_ids, pa.string()), "group": pa.array(self.groups, pa.string()),
                "split": pa.array(self.splits, pa.string()), "visual": column(self.visual), "text": column(self.text)}
        if self.candidates is not None:
            data["candidates"] = pa.array([[self.pair_ids[c] for c in cs] for cs in self.candidates],
                                          pa.list_(pa.string()))
        if self.captions is not None:
            data["caption"] = pa.array(self.captions, pa.string())
        if self.activities is not None:
            data["activities"] = pa.array(self.activities, pa.list_(pa.string()))
        pq.write_table(pa.table(data), path)


def _typed_column(table: pa.Table, name: str, source: str, ok: Any) -> list:
    typ = table.schema.field(name).type
    if not ok(typ):
        raise PairsError(f"{source}: column {name!r} has type {typ}; see PAIRS_SCHEMA")
    return table.column(name).to_pylist()


def concat_visual(features: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One visual array per clip from one or several extractors' {clip_id: array}: a single
    extractor's arrays as they are; several (S-MiT 4.1: ResNet-152 and TSM) each max-pooled over
    time to [D_i], then concatenated to [Σ D_i], for the clips that have all of them."""
    if len(features) == 1:
        return dict(features[0])
    common = set.intersection(*(set(f) for f in features))
    return {cid: np.concatenate([np.atleast_2d(f[cid]).max(0) for f in features]) for cid in common}


def _is_webdataset(url: str) -> bool:
    """A .tar, a brace pattern, or a shard folder whose index lists .tar shards."""
    if url.endswith(".tar") or "{" in url:
        return True
    import fsspec

    index = posixpath.join(url, "index.json")
    try:
        with fsspec.open(index, "rt") as handle:
            shards = json.load(handle).get("shards", [])
    except FileNotFoundError:
        raise PairsError(f"{url}: not a shard folder (no index.json)") from None
    return any(str(s.get("name", "")).endswith(".tar") for s in shards)
