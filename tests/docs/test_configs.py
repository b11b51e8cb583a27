"""The example configs pass `vlcorpus check` as the pages say: the one of configuration.md and
configs/demo.yaml could be built as they are (offline, with no model to fetch); the paper
recipes of configs/ are refused for their models alone, as styles.md says, each problem naming
the model or weight file and where to get it. In one process (`vlcorpus check --json`, through
typer's runner): the test pays for its imports once."""

from __future__ import annotations

import json
import re

import pytest
from docskit import DOCS, ROOT, code_blocks, commands
from typer.testing import CliRunner

from pipeline.cli import app

RECIPES = ["apartment_tour", "howto100m", "spoken_moments"]
# What a recipe may lack here: models the tests' offline switch keeps from downloading, and
# the weight files nothing downloads.
MODEL_PROBLEM = re.compile(r"cannot be downloaded here|weight file .* does not exist|has no automatic download")


def _check(*args: str) -> dict:
    done = CliRunner().invoke(app, ["check", *args, "--json"])
    assert done.exit_code in (0, 2), done.output
    return json.loads(done.stdout.splitlines()[0])


def test_the_config_of_configuration_md_checks_as_written(tmp_path, monkeypatch):
    [config] = [b for b in code_blocks(DOCS / "configuration.md") if b.title]
    (tmp_path / config.title).write_text(config.text)
    [check] = [c for b in code_blocks(DOCS / "configuration.md") if b.language == "sh" for c in commands(b)]
    monkeypatch.chdir(tmp_path)
    result = _check(*check.split()[2:])
    assert result["ready"], result["problems"]
    assert any("extra_ids.csv does not exist" in w for w in result["warnings"])


def test_the_demo_config_checks_on_its_own():
    result = _check(str(ROOT / "configs" / "demo.yaml"))
    assert result["ready"], result["problems"]
    assert result["root"] == str(ROOT / "demo-corpus" / "corpus")


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_paper_recipe_lacks_only_its_models(tmp_path, recipe):
    result = _check(str(ROOT / "configs" / f"{recipe}.yaml"), "--root", str(tmp_path / "corpus"))
    assert result["problems"] and all(MODEL_PROBLEM.search(p) for p in result["problems"]), result["problems"]
