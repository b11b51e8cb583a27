"""Arrow schemas of every corpus table (DESIGN.md, data model).

Each schema carries its table name and version in its metadata; writers validate rows
against these before committing, and ``vlcorpus validate`` checks files against them.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "2"

_TS = pa.timestamp("us", tz="UTC")

WORD = pa.struct(
    [
        pa.field("text", pa.string(), nullable=False),
        pa.field("start_s", pa.float64(), nullable=False),
        pa.field("end_s", pa.float64(), nullable=False),
    ]
)

SUBTITLE_FILE = pa.struct(
    [
        pa.field("lang", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # manual | auto
        pa.field("path", pa.string(), nullable=False),
    ]
)


def _schema(table: str, key: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(
        fields,
        metadata={
            "vlcorpus.table": table,
            "vlcorpus.schema_version": SCHEMA_VERSION,
            "vlcorpus.key": key,
        },
    )


VIDEOS = _schema(
    "videos",
    "video_id",
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("url", pa.string(), nullable=False),
        pa.field("extractor", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # search | playlist | list | urls | folder
        pa.field("query", pa.string()),
        pa.field("title", pa.string()),
        pa.field("uploader", pa.string()),
        pa.field("upload_date", pa.date32()),
        pa.field("duration_s", pa.float64()),
        pa.field("subtitles_manual", pa.list_(pa.string())),
        pa.field("subtitles_auto", pa.list_(pa.string())),
        # Spans known up front (S-MiT-style clip lists); kept through to align.
        pa.field("start_s", pa.float64()),
        pa.field("end_s", pa.float64()),
        pa.field("caption", pa.string()),
        pa.field("discovered_at", _TS, nullable=False),
    ],
)

DOWNLOADS = _schema(
    "downloads",
    "video_id",
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("media_path", pa.string()),
        pa.field("subtitles", pa.list_(SUBTITLE_FILE)),
        pa.field("format_id", pa.string()),
        pa.field("width", pa.int32()),
        pa.field("height", pa.int32()),
        pa.field("fps", pa.float64()),
        pa.field("duration_s", pa.float64()),
        pa.field("bytes", pa.int64()),
        pa.field("has_audio", pa.bool_()),
        pa.field("status", pa.string(), nullable=False),  # ok | partial
        pa.field("downloaded_at", _TS, nullable=False),
        # Set when the media file was deleted after its partition was sharded
        # (storage.keep_media: false); a stage that needs it again downloads it again.
        pa.field("released_at", _TS),
    ],
)

SEGMENTS = _schema(
    "segments",
    "video_id",
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("index", pa.int32(), nullable=False),
        pa.field("start_s", pa.float64(), nullable=False),
        pa.field("end_s", pa.float64(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # manual | auto | asr:<backend>
        pa.field("lang", pa.string()),
        pa.field("confidence", pa.float32()),  # ASR only, when the backend gives one
        pa.field("words", pa.list_(WORD)),
    ],
)

CLIPS = _schema(
    "clips",
    "video_id",
    [
        pa.field("clip_id", pa.string(), nullable=False),
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("start_s", pa.float64(), nullable=False),
        pa.field("end_s", pa.float64(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("policy", pa.string(), nullable=False),  # subtitle_span | fixed | whole
        pa.field("segment_index", pa.int32()),
        pa.field("candidates", pa.list_(pa.string())),  # MIL-NCE: nearest sentences in time
        pa.field("split", pa.string(), nullable=False),  # train | val | test
    ],
)

FEATURES = _schema(
    "features",
    "clip_id",
    [
        pa.field("clip_id", pa.string(), nullable=False),
        pa.field("extractor", pa.string(), nullable=False),
        pa.field("weights", pa.string(), nullable=False),  # weights id, or "none" (random init)
        pa.field("fps", pa.float32()),
        pa.field("frames", pa.int32()),
        pa.field("shape", pa.list_(pa.int32()), nullable=False),  # [T, D] or [D]
        pa.field("values", pa.list_(pa.float16()), nullable=False),  # row-major, flattened
    ],
)

SCORES = _schema(
    "scores",
    "clip_id",
    [
        pa.field("clip_id", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),  # the score model: a trained folder or milnce:<file>
        pa.field("checkpoint", pa.string(), nullable=False),  # id of the exact weights file scored with
        pa.field("similarity", pa.float32(), nullable=False),  # the model's score of the clip and its sentence
        pa.field("rank", pa.int32(), nullable=False),  # of its sentence among its video's sentences, 1 = best
        pa.field("sentences", pa.int32(), nullable=False),  # how many sentences of the video were ranked
        pa.field("p_aligned", pa.float32()),  # WAL-att-adv: 1 - P(z=1) of the discriminator; else null
    ],
)

ERRORS = _schema(
    "errors",
    "item_id",
    [
        pa.field("stage", pa.string(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # transient | permanent | bad_input | blocked
        pa.field("message", pa.string(), nullable=False),
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("time", _TS, nullable=False),
    ],
)

# The clip's score in shards that carry one: a Parquet column, a field of the WebDataset JSON.
SHARD_SCORE = pa.field("score", pa.float32())


def shard_schema(feature_keys: list[str], score: bool = False) -> pa.Schema:
    """Parquet shards: the clips columns (but ``split``, which is the hive partition of the
    folder), the clip's score when the shards carry one, then per feature extractor its
    flattened float16 values and their shape."""
    fields = [f for f in CLIPS if f.name != "split"]
    if score:
        fields.append(SHARD_SCORE)
    for key in sorted(feature_keys):
        fields.append(pa.field(key, pa.list_(pa.float16())))
        fields.append(pa.field(f"{key}_shape", pa.list_(pa.int32())))
    return _schema("shards", "clip_id", fields)


TABLES: dict[str, pa.Schema] = {
    "videos": VIDEOS,
    "downloads": DOWNLOADS,
    "segments": SEGMENTS,
    "clips": CLIPS,
    "features": FEATURES,
    "scores": SCORES,
    "errors": ERRORS,
}


def schema_for(table: str) -> pa.Schema:
    """Schema of a table; ``features/<extractor>`` tables share the features schema, and
    ``scores/<model>`` tables the scores schema."""
    base = table.split("/", 1)[0]
    try:
        return TABLES[base]
    except KeyError:
        raise KeyError(f"unknown table {table!r}; known: {', '.join(TABLES)}") from None


def key_column(table: str) -> str:
    """Column holding the item key a stage commits done-ness by."""
    return schema_for(table).metadata[b"vlcorpus.key"].decode()
