"""Reading a config (YAML file or mapping), and its canonical forms: hash, dump, JSON schema."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipeline.config.messages import problem_lines
from pipeline.config.model import Config
from pipeline.config.paths import rebase
from pipeline.config.problems import ConfigError

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.json"


def parse_config(data: dict, source: str = "<config>") -> Config:
    """Validate a config mapping; every problem is reported at once as a ConfigError."""
    if not isinstance(data, dict):
        got = type(data).__name__
        raise ConfigError(source, [f"(top level): expected a mapping of keys (got {got})"])
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, problem_lines(exc)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice (PyYAML would keep the last silently)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file; unreadable files, bad YAML and bad values all raise
    ConfigError. Relative paths in it are resolved against the file's folder."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"(file): cannot read: {exc}"]) from None
    return rebase(config_from_yaml(text, source), Path(path).parent)


def config_from_yaml(text: str, source: str) -> Config:
    """A config from YAML text (a file's, or an object's on a remote root), as load_config."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(file)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"{where}: invalid YAML: {problem}"]) from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise ConfigError(source, [f"(top level): expected a mapping of keys (got {got})"])
    return parse_config(data, source)


def _resolved(cfg: Config) -> dict[str, Any]:
    # JSON mode renders dates as ISO strings and secrets as "**********".
    return cfg.model_dump(mode="json")


def config_hash(cfg: Config) -> str:
    """First 16 hex chars of the sha256 of the canonical JSON of the resolved config (secrets are
    masked, so the hash is safe to log and does not change with a proxy)."""
    canonical = json.dumps(_resolved(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def dump_config(cfg: Config) -> str:
    """YAML of the resolved config, every default filled in, secrets masked."""
    return yaml.safe_dump(_resolved(cfg), sort_keys=False, allow_unicode=True)


def config_json_schema() -> dict[str, Any]:
    """JSON schema of the YAML config, for editors and `schemas/config.schema.json`."""
    schema = Config.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
