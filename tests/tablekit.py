"""Two builds' tables compared: what a resumed, faulted or moved build must equal."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.corpus.storage import Corpus

# Columns that say when, not what.
VOLATILE = {"discovered_at", "downloaded_at", "released_at", "time"}


def tables(root: Path) -> dict[str, list]:
    """Every table's rows, sorted, without times, and with the root in paths and messages
    written as ROOT (the two builds under comparison live in different folders)."""
    corpus = Corpus(str(root))
    out = {}
    for table in corpus.tables():
        data = corpus.read(table)
        keep = [c for c in data.column_names if c not in VOLATILE]
        rows = json.loads(json.dumps(data.select(keep).to_pylist(), default=str).replace(str(root), "ROOT"))
        out[table] = sorted(rows, key=repr)
    return out
