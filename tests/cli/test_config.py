import json
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from pipeline.config.messages import MOVED
from pipeline.config import (
    SCHEMA_PATH,
    Config,
    ConfigError,
    config_hash,
    config_json_schema,
    dump_config,
    load_config,
    parse_config,
)

CONFIG_DIR = ROOT / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
MINIMAL = {"name": "t", "sources": [{"type": "urls", "urls": ["https://example.com/v.mp4"]}]}


def with_(**sections: object) -> dict:
    return {**MINIMAL, **sections}


def problems(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="t.yaml")
    return str(info.value)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_configs_exist() -> None:
    names = {p.name for p in CONFIGS}
    assert {"apartment_tour.yaml", "spoken_moments.yaml", "howto100m.yaml", "demo.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    assert cfg.name == path.stem


def test_apartment_tour_queries() -> None:
    source = load_config(CONFIG_DIR / "apartment_tour.yaml").sources[0]
    queries = source.expanded_queries()
    assert len(queries) == 1 + 11 + 28
    assert "apartment tour 2008" in queries and "apartment tour 2018" in queries


def test_minimal_config_gets_defaults() -> None:
    cfg = parse_config(MINIMAL)
    assert cfg.train is None
    assert cfg.execution.batch_size == 16
    assert cfg.download.allowed_schemes == ["http", "https"]
    assert cfg.align.splits == {"train": 0.8, "val": 0.1, "test": 0.1}


def test_committed_schema_is_current() -> None:
    committed = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert committed == config_json_schema(), (
        "schemas/config.schema.json is stale: run `make schema` (vlcorpus schema --write)"
    )


def test_typo_key_names_path_and_allowed_keys() -> None:
    message = problems(with_(download={"formt": "x"}))
    assert message.startswith("t.yaml: 1 problem:")
    assert "download.formt: unknown key" in message
    assert "format" in message.split("allowed keys:")[1]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_key_an_earlier_version_read_names_where_it_moved(old: str) -> None:
    *section, key = old.split(".")
    nested: dict = {key: 500}
    for name in reversed(section):
        nested = {name: nested}
    message = problems(with_(**nested))
    assert f"{old}: this key moved to shards.samples_per_shard" in message
    assert "unknown key" not in message
    section_name, key_name = MOVED[old].split(" ")[0].split(".")
    assert parse_config(with_(**{section_name: {key_name: 500}})).shards.samples_per_shard == 500


def test_typo_key_inside_source_lists_that_source_fields() -> None:
    message = problems(with_(sources=[{"type": "search", "queries": ["a"], "per_qery": 3}]))
    assert "sources.0.per_qery: unknown key" in message
    assert "per_query" in message


def test_wrong_type_names_path() -> None:
    message = problems(with_(execution={"batch_size": "many"}))
    assert "execution.batch_size:" in message
    assert "'many'" in message


def test_bound_violation_names_value() -> None:
    message = problems(with_(sources=[{"type": "search", "queries": ["a"], "per_query": -3}]))
    assert "sources.0.per_query: Input should be greater than 0 (got -3)" in message


def test_bad_literal_lists_allowed_values() -> None:
    message = problems(with_(align={"policy": "fixd"}))
    assert "align.policy:" in message
    for value in ("'subtitle_span'", "'fixed'", "'whole'", "'fixd'"):
        assert value in message


def test_unknown_source_type_lists_allowed_types() -> None:
    message = problems(with_(sources=[{"type": "youtube", "urls": ["x"]}]))
    assert "sources.0.type:" in message
    for source_type in ("search", "playlist", "list", "urls", "folder"):
        assert source_type in message


def test_every_problem_is_reported() -> None:
    message = problems(with_(download={"formt": "x"}, align={"policy": "fixd"}))
    assert message.startswith("t.yaml: 2 problems:")


def test_query_with_unknown_var_fails() -> None:
    source = {"type": "search", "queries": ["tour {year}", "tour {cty}"], "vars": {"year": [2008]}}
    message = problems(with_(sources=[source]))
    assert "sources.0.queries.1:" in message and "cty" in message and "year" in message


def test_query_expansion_is_a_product() -> None:
    source = {
        "type": "search",
        "queries": ["tour", "{a} tour {b}", "tour"],
        "vars": {"a": ["x", "y"], "b": [1, 2]},
    }
    cfg = parse_config(with_(sources=[source]))
    expected = ["tour", "x tour 1", "x tour 2", "y tour 1", "y tour 2"]
    assert cfg.sources[0].expanded_queries() == expected


@pytest.mark.parametrize(
    "splits", [{"train": 0.8, "val": 0.1}, {"train": 0.9, "val": 0.1, "test": 0.1}]
)
def test_splits_must_sum_to_one(splits: dict) -> None:
    assert "align.splits:" in problems(with_(align={"splits": splits}))


def test_negative_split_fails() -> None:
    assert "align.splits.val:" in problems(with_(align={"splits": {"train": 1.1, "val": -0.1}}))


def test_min_s_below_max_s() -> None:
    assert "align.min_s:" in problems(with_(align={"min_s": 5, "max_s": 2}))


def test_train_with_missing_extractor_fails() -> None:
    features = {"extractors": [{"name": "resnet34"}]}
    train = {"model": "wal", "visual": "resnet34", "text": "text:bert-base-uncased"}
    message = problems(with_(features=features, train=train))
    assert "train.text:" in message and "resnet34" in message


def test_train_takes_paper_defaults_per_model() -> None:
    features = {"extractors": [{"name": "resnet34"}, {"name": "text:bert-base-uncased"}]}
    train = {"model": "wal", "visual": "resnet34", "text": "text:bert-base-uncased", "lr": 0.05}
    cfg = parse_config(with_(features=features, train=train))
    assert cfg.train is not None
    assert (cfg.train.optimizer, cfg.train.batch_size, cfg.train.lr) == ("sgd", 60, 0.05)


def test_duplicate_source_names_fail() -> None:
    source = {"type": "urls", "urls": ["https://example.com/a.mp4"], "name": "a"}
    assert "sources.1.name: duplicate" in problems(with_(sources=[source, source]))


def test_unknown_extractor_lists_allowed_names() -> None:
    message = problems(with_(features={"extractors": [{"name": "resnet18"}]}))
    assert "features.extractors.0.name:" in message and "resnet34" in message and "text:" in message


def test_duplicate_extractor_names_fail() -> None:
    extractors = [{"name": "resnet34"}, {"name": "resnet34", "fps": 1}]
    assert "features.extractors.1.name:" in problems(with_(features={"extractors": extractors}))


def test_proxy_is_masked_in_dump() -> None:
    cfg = parse_config(with_(download={"proxy": "http://user:hunter2@proxy:3128"}))
    dumped = dump_config(cfg)
    assert "hunter2" not in dumped and "hunter2" not in repr(cfg)
    assert yaml.safe_load(dumped)["download"]["proxy"] == "**********"
    assert cfg.download.proxy is not None
    assert cfg.download.proxy.get_secret_value() == "http://user:hunter2@proxy:3128"


def test_dump_has_every_default_and_loads_back(tmp_path: Path) -> None:
    cfg = load_config(CONFIG_DIR / "apartment_tour.yaml")
    dumped = dump_config(cfg)
    assert "retry_backoff_max_s" in dumped
    assert config_hash(load_config(write(tmp_path, dumped))) == config_hash(cfg)


def test_config_hash_is_stable_and_tracks_values(tmp_path: Path) -> None:
    text = yaml.safe_dump(with_(align={"min_s": 2}))
    first = config_hash(load_config(write(tmp_path, text)))
    assert first == config_hash(load_config(write(tmp_path, text)))
    assert len(first) == 16 and all(c in "0123456789abcdef" for c in first)
    assert first == config_hash(parse_config(with_(align={"min_s": 2.0})))
    assert first != config_hash(parse_config(with_(align={"min_s": 2.5})))


def test_non_mapping_yaml_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- just\n- a list\n"))


def test_empty_yaml_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="empty"):
        load_config(write(tmp_path, ""))


def test_yaml_syntax_error_is_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "name: t\nsources: [\n  {type: urls\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "invalid YAML" in str(info.value)


def test_duplicate_yaml_key_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="duplicate key 'name'"):
        load_config(write(tmp_path, "name: a\nname: b\nsources: []\n"))


def test_missing_file_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_null_section_means_defaults() -> None:
    assert parse_config(with_(download=None)).download.concurrency == 4


def test_extractor_names_that_store_alike_are_refused():
    with pytest.raises(ConfigError, match=r"duplicate name 'text:minilm' \(as stored, the same as 'text:MiniLM'\)"):
        parse_config({"name": "x", "sources": [{"type": "urls", "urls": ["http://a/"]}],
                      "features": {"extractors": [{"name": "text:MiniLM"}, {"name": "text:minilm"}]}})


def test_docs_example_of_downloading_at_scale_loads() -> None:
    page = (ROOT / "docs" / "youtube.md").read_text(encoding="utf-8")
    block = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = parse_config(yaml.safe_load(block))
    assert cfg.download.preset == "sleep" and len(cfg.download.proxies) == 2
    assert cfg.download.rate_limit == 50 and cfg.download.extractor_args
