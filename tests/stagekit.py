"""Two small real stages for runner tests, chained like the real ones:
DOWNLOAD turns videos rows into downloads rows, TRANSCRIBE downloads into segments.

Deterministic behaviour per video id, so that a killed-and-resumed run can be compared with
a clean one: ids containing "bad" raise BadInputError, "gone" PermanentError, "flaky" fail
transiently on the first attempt of each run, and "crash" raises an unexpected exception.
``VLC_TEST_DELAY`` slows items down so a test can kill the process mid-stage.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

from pipeline.errors import BadInputError, PermanentError, TransientError
from pipeline.runner import Item, Stage, StageContext, per_item, table_inputs
from pipeline.corpus.storage import Corpus

_flaky_seen: set[str] = set()


def make_videos(corpus: Corpus, n: int, extra: tuple[str, ...] = (), partitions: int = 4) -> list[str]:
    """``n`` videos rows (and one per ``extra`` name) in a corpus of ``partitions`` partitions."""
    corpus.init_partitions(partitions)
    ids = [f"demo-v{i:03d}" for i in range(n)] + [f"demo-{e}" for e in extra]
    now = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        {"video_id": v, "url": f"http://127.0.0.1/{v}", "extractor": "demo", "source": "urls",
         "discovered_at": now}
        for v in ids
    ]
    corpus.write_partitioned("videos", rows, "all", done=ids)
    return ids


def _slow() -> None:
    delay = float(os.environ.get("VLC_TEST_DELAY", "0"))
    if delay:
        time.sleep(delay)


def _download(item: Item, ctx: StageContext) -> list[dict]:
    vid = item.key
    _slow()
    if "bad" in vid:
        raise BadInputError(f"{vid}: truncated media")
    if "gone" in vid:
        raise PermanentError(f"{vid}: HTTP Error 404: Not Found")
    if "crash" in vid:
        raise ZeroDivisionError("division by zero")
    if "flaky" in vid and vid not in _flaky_seen:
        _flaky_seen.add(vid)
        raise TransientError(f"{vid}: HTTP Error 503")
    return [{"video_id": vid, "media_path": f"media/{vid}.mp4", "bytes": len(vid),
             "status": "ok", "downloaded_at": datetime(2026, 1, 2, tzinfo=UTC)}]


def _sentences(item: Item, ctx: StageContext) -> list[dict]:
    vid = item.key
    _slow()
    if "silent" in vid:
        return []
    n = 1 + sum(map(ord, vid)) % 3
    return [
        {"video_id": vid, "index": i, "start_s": float(i), "end_s": i + 0.9,
         "text": f"sentence {i} of {vid}", "source": "manual", "lang": "en",
         "words": [{"text": "sentence", "start_s": float(i), "end_s": i + 0.5}]}
        for i in range(n)
    ]


DOWNLOAD = Stage(name="download", output="downloads", source="videos", inputs=table_inputs("videos"),
                 process=per_item(_download))

TRANSCRIBE = Stage(name="transcribe", output="segments", source="downloads", inputs=table_inputs("downloads"),
                   process=per_item(_sentences))
