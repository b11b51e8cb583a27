"""A corpus of the flat layout (before partitions) is refused with the command that migrates it,
and `vlcorpus migrate` moves it into partitions with nothing lost."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from conftest import vlcorpus
from pipeline.corpus.storage import Corpus
from pipeline.corpus.tablefile import MANIFEST_KEY, STATS_KEY
from pipeline.corpus.validate import validate
from schemas.tables import schema_for

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _flat(root: Path, table: str, name: str, rows: list[dict], done: dict | None,
          stats: dict | None = None) -> None:
    """A batch file as the flat layout wrote it: ``<table>/<name>.parquet``, the manifest a
    map of key -> rows."""
    data = pa.Table.from_pylist(rows, schema=schema_for(table))
    meta = dict(data.schema.metadata)
    if done is not None:
        meta[MANIFEST_KEY] = json.dumps(done).encode()
    if stats:
        meta[STATS_KEY] = json.dumps(stats).encode()
    (root / table).mkdir(parents=True, exist_ok=True)
    pq.write_table(data.replace_schema_metadata(meta), root / table / f"{name}.parquet")


def _old_corpus(root: Path) -> None:
    videos = [f"generic-v{i}" for i in range(12)]
    _flat(root, "videos", "discover-a", [{"video_id": v, "url": f"http://x/{v}", "extractor": "generic",
                                          "source": "list", "discovered_at": NOW} for v in videos],
          {v: 1 for v in videos})
    ok = videos[:10]
    _flat(root, "downloads", "download-a", [{"video_id": v, "media_path": f"media/{v}.mp4", "status": "ok",
                                             "downloaded_at": NOW} for v in ok], {v: 1 for v in ok})
    _flat(root, "errors", "download-b", [{"stage": "download", "item_id": v, "kind": "permanent",
                                          "message": "HTTP Error 404", "attempt": 1, "time": NOW}
                                         for v in videos[10:]], None)
    _flat(root, "errors", "discover-c", [{"stage": "discover", "item_id": "list:x.csv#3",
                                          "kind": "bad_input", "message": "no url", "attempt": 1,
                                          "time": NOW}], None)
    clips = [{"clip_id": f"{v}-0-3000", "video_id": v, "start_s": 0.0, "end_s": 3.0, "text": "a",
              "source": "manual", "policy": "subtitle_span", "split": "train"} for v in ok[:9]]
    _flat(root, "clips", "align-a", clips, {**{c["video_id"]: 1 for c in clips}, ok[9]: 0},
          {ok[9]: {"dropped:too_short": 2}})
    _flat(root, "features/resnet34", "featurize-a",
          [{"clip_id": c["clip_id"], "extractor": "resnet34", "weights": "none", "shape": [2],
            "values": [0.5, 1.0]} for c in clips], {c["clip_id"]: 1 for c in clips})


def test_flat_corpus_is_refused_then_migrated(tmp_path):
    root = tmp_path / "old"
    _old_corpus(root)
    refused = vlcorpus("validate", str(root))
    assert refused.returncode == 1 and f"vlcorpus migrate {root}" in refused.stdout + refused.stderr
    before = {t: pq.read_table(root / t).num_rows for t in ("videos", "downloads", "clips", "errors")}

    moved = vlcorpus("migrate", str(root), "--partitions", "4")
    assert moved.returncode == 0, moved.stderr
    corpus = Corpus(str(root))
    assert corpus.partitions == 4
    assert {t: corpus.read(t).num_rows for t in before} == before
    assert corpus.done("clips")["generic-v9"] == 0
    assert corpus.stats("clips") == {"dropped:too_short": 2}
    assert corpus.read("errors", partition="corpus").column("item_id").to_pylist() == ["list:x.csv#3"]
    assert len(corpus.done("features/resnet34")) == 9
    assert not list(root.glob("*/*.parquet")) and not list(root.glob("features/*/*.parquet"))
    assert validate(corpus) == []
    again = vlcorpus("migrate", str(root))
    assert again.returncode == 0 and "rows moved: nothing" in again.stdout + again.stderr
