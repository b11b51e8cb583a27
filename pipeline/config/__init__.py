"""The YAML config of a corpus build: pydantic models, loading, hashing, dumping, JSON schema.

Every model forbids unknown keys, so a typo is an error that names the key and the keys allowed
there instead of a setting silently ignored. `vlcorpus schema --write` regenerates
`schemas/config.schema.json`.

- sources.py: where videos come from; sections.py: filters, download, transcribe, align;
  features.py: frames and extractors; shards.py; train.py; score.py; storage.py; execution.py
- model.py: the whole config and its cross-section checks
- problems.py, messages.py: the errors a user sees; loading.py: YAML in, hash, dump, schema out
"""

from pipeline.config.execution import ExecutionConfig
from pipeline.config.features import (
    TEXT_PREFIX,
    VISUAL_EXTRACTORS,
    ExtractorConfig,
    FeaturesConfig,
    FramesConfig,
)
from pipeline.config.health import HealthConfig
from pipeline.config.loading import (
    SCHEMA_PATH,
    config_hash,
    config_json_schema,
    dump_config,
    config_from_yaml,
    load_config,
    parse_config,
)
from pipeline.config.model import Config
from pipeline.config.problems import ConfigError
from pipeline.config.sections import (
    AlignConfig,
    AsrConfig,
    DownloadConfig,
    FiltersConfig,
    GoogleAsrConfig,
    QualityConfig,
    SentenceConfig,
    TranscribeConfig,
)
from pipeline.config.score import MILNCE_PREFIX, ScoreConfig, milnce_weights, score_key
from pipeline.config.shards import ClipMediaConfig, ParquetShardConfig, ShardsConfig, WebDatasetConfig
from pipeline.config.sources import (
    SOURCE_TYPES,
    FolderSource,
    ListSource,
    PlaylistSource,
    SearchSource,
    Source,
    UrlsSource,
)
from pipeline.config.storage import StorageConfig
from pipeline.config.train import TRAIN_DEFAULTS, StreamConfig, TrainConfig, TrainModel

__all__ = [
    "SCHEMA_PATH", "SOURCE_TYPES", "TEXT_PREFIX", "TRAIN_DEFAULTS", "VISUAL_EXTRACTORS",
    "AlignConfig", "AsrConfig", "ClipMediaConfig", "Config", "ConfigError", "DownloadConfig",
    "ExecutionConfig", "ExtractorConfig", "HealthConfig", "FeaturesConfig", "FiltersConfig", "FolderSource",
    "FramesConfig", "GoogleAsrConfig", "ListSource", "MILNCE_PREFIX", "ParquetShardConfig",
    "PlaylistSource", "QualityConfig", "ScoreConfig", "SearchSource", "SentenceConfig", "ShardsConfig",
    "Source", "StorageConfig", "StreamConfig", "TrainConfig", "TrainModel", "TranscribeConfig", "UrlsSource",
    "WebDatasetConfig", "config_from_yaml", "config_hash", "config_json_schema", "dump_config", "load_config",
    "milnce_weights", "parse_config", "score_key",
]
