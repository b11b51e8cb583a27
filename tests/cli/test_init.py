"""`vlcorpus init NAME`: a commented starter config per corpus style, as a user types it; the
schema comment editors read, in every starter and every config of configs/."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, vlcorpus
from pipeline.config import SCHEMA_PATH, SearchSource, load_config, parse_config
from pipeline.starter import SCHEMA_COMMENT, STYLES, template

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
STARTERS = ROOT / "pipeline" / "starters"


def schema_target(path: Path) -> Path:
    """Where a config's first line points, resolved from the config's folder."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith(SCHEMA_COMMENT), f"{path}: first line {first!r}"
    reference = first[len(SCHEMA_COMMENT):]
    if reference.startswith("file://"):
        return Path(reference.removeprefix("file://"))
    return (path.parent / reference).resolve()


def key_settings(style: str, cfg) -> None:
    sources = {s.type: s for s in cfg.sources}
    extractors = [e.name for e in cfg.features.extractors]
    if style == "howto100m":
        search = sources["search"]
        assert isinstance(search, SearchSource) and "how to change a bike tire" in search.expanded_queries()
        assert cfg.transcribe.prefer == ["auto", "asr"]
        assert (cfg.download.manual_subtitles, cfg.download.auto_subtitles) == (False, True)
        assert (cfg.align.policy, cfg.align.length_s, cfg.align.candidates) == ("fixed", 3.2, 5)
        assert extractors == ["s3d"]
        assert cfg.storage.keep_media is False
    elif style == "apartment_tour":
        assert set(sources) == {"list", "playlist"}
        assert cfg.transcribe.prefer == ["manual", "auto"]
        assert cfg.filters.require_subtitles == "any"
        assert (cfg.align.policy, cfg.align.min_s, cfg.align.max_s) == ("subtitle_span", 2.0, 5.0)
        assert extractors == ["resnet34"]
    else:
        moments = sources["list"]
        assert (moments.start_column, moments.end_column) == ("start", "end")
        assert cfg.download.partial is True
        assert cfg.transcribe.prefer == ["asr"]
        assert (cfg.transcribe.quality.min_words, cfg.transcribe.quality.min_speech_s) == (5, 3.0)
        assert cfg.align.policy == "whole"
        assert extractors == ["resnet152", "tsm_r50"]


@pytest.mark.parametrize("style", list(STYLES))
def test_init_writes_a_starter_that_loads(tmp_path, style):
    out = tmp_path / "configs here"  # created; a space in the path
    name = f"my_{style}"
    result = vlcorpus("init", name, "--style", style, "--out", str(out))
    assert result.returncode == 0, result.stderr
    path = out / f"{name}.yaml"
    assert str(path) in result.stderr
    cfg = load_config(path)
    assert cfg.name == name and cfg.root == str(out / "corpora" / name)  # beside the config
    key_settings(style, cfg)
    assert schema_target(path) == SCHEMA_PATH.resolve()
    text = path.read_text(encoding="utf-8")
    # Every section says why: a comment just above each top-level key.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[a-z_]+:", line):
            assert lines[i - 1].startswith("#"), f"{style}: no comment above {line!r}"
    assert "my_corpus" not in text


def _uncomment_optional(text: str) -> str:
    """The starter with its commented train section and text extractor switched on."""
    out, indent = [], None
    for line in text.splitlines():
        start = re.match(r"^(\s*)# (train:|- name: text:.*)$", line)
        if start:
            indent = start.group(1)
            out.append(indent + start.group(2))
        elif indent is not None and line.startswith(indent + "#   "):
            out.append(indent + line[len(indent) + 2:])
        else:
            indent = None
            out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("style", list(STYLES))
def test_the_commented_training_sections_are_valid_when_switched_on(style):
    text = (STARTERS / f"{style}.yaml").read_text(encoding="utf-8")
    cfg = parse_config(yaml.safe_load(_uncomment_optional(text)), f"{style}.yaml")
    assert cfg.train is not None
    assert cfg.train.text in [e.name for e in cfg.features.extractors]


def test_init_refuses_to_overwrite(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\n")
    result = vlcorpus("init", "mine", "--out", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"{path} exists; not overwritten (remove it or pick "
                                                  "another name)"]
    assert path.read_text() == "name: mine\n"


def test_init_refuses_an_unknown_style_and_a_bad_name(tmp_path):
    result = vlcorpus("init", "x", "--style", "howto", "--out", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == "unknown style 'howto'; styles: howto100m, apartment_tour, spoken_moments"
    result = vlcorpus("init", "../x", "--out", str(tmp_path))
    assert result.returncode == 2 and "cannot name a corpus" in result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("path", CONFIGS + sorted(STARTERS.glob("*.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_config_names_the_schema_first(path):
    assert schema_target(path) == SCHEMA_PATH.resolve() and SCHEMA_PATH.is_file()


def test_starters_are_package_data():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for style in STYLES:
        name = f"{style}.yaml"
        assert (STARTERS / name).is_file(), style
        assert any(fnmatch.fnmatch(f"starters/{name}", pattern) for pattern in settings["pipeline"])
    assert "*.json" in settings["schemas"]  # the schema the comment names is installed too


def test_the_styles_are_spelled_as_in_configs_and_listed_in_the_docs():
    """One spelling: the recipes' in configs/, which styles.md lists; the hyphenated one of
    earlier versions still works."""
    assert set(STYLES) <= {p.stem for p in CONFIGS}
    page = (ROOT / "docs" / "styles.md").read_text(encoding="utf-8")
    assert all(f"| `{style}`" in page for style in STYLES)
    assert template("spoken-moments") == template("spoken_moments")
