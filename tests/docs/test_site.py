"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a missing page or
heading fails it), offline; its generated reference pages show every config key of
``schemas/config.schema.json`` and every command and option of the CLI; README.md holds nothing
the site does not."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from docskit import DOCS, ROOT, code_blocks

from pipeline.cli import app

pytest.importorskip("mkdocs")
pytest.importorskip("material")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # No proxy and no route: a build that fetched anything would fail here.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                            str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def _text(site: Path, page: str) -> str:
    return html.unescape((site / page / "index.html").read_text(encoding="utf-8"))


def _schema_keys(node: dict, defs: dict, path: str, out: set[str]) -> None:
    """Every key path of the schema, as the reference writes them (``features.extractors[].fps``)."""
    node = defs[node["$ref"].rsplit("/", 1)[-1]] if "$ref" in node else node
    for key, child in node.get("properties", {}).items():
        dotted = f"{path}.{key}" if path else key
        out.add(dotted)
        for option in [child, *child.get("anyOf", [])]:
            _schema_keys(option, defs, dotted, out)
            items = option.get("items", {})
            for item in items.get("oneOf", []) or items.get("anyOf", []) or [items]:
                _schema_keys(item, defs, f"{dotted}[]", out)


def test_the_site_builds_and_has_every_page(site):
    nav = re.findall(r":\s+([\w/-]+)\.md$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    assert {"getting-started", "reference/config", "reference/cli", "scheduled-builds"} <= set(nav)
    for page in nav:
        assert (site / ("" if page == "index" else page) / "index.html").exists(), page
    # infra/README.md is the scheduled-builds page, as it is in the repository.
    assert "prefect worker start --pool vlcorpus" in _text(site, "scheduled-builds")


def test_config_reference_shows_every_key_of_the_schema(site):
    schema = json.loads((ROOT / "schemas" / "config.schema.json").read_text())
    keys: set[str] = set()
    _schema_keys(schema, schema["$defs"], "", keys)
    page = _text(site, "reference/config")
    assert len(keys) > 150
    missing = sorted(k for k in keys if f"<code>{k}</code>" not in page)
    assert not missing, f"keys of the schema not on the reference page: {missing}"


def test_cli_reference_shows_every_command_and_option(site):
    page = _text(site, "reference/cli")
    root = typer.main.get_command(app)

    def walk(command, prefix: str) -> None:
        assert f"<code>{prefix}</code>" in page, prefix
        for param in command.params:
            for name in param.opts:
                assert name in page, f"{prefix} {name}"
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{prefix} {name}")

    walk(root, "vlcorpus")


def test_readme_holds_nothing_the_docs_do_not():
    """Each code block of the front door is on a page of the site, and its links lead there."""
    readme = ROOT / "README.md"
    pages = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.glob("*.md"))
    for block in code_blocks(readme):
        assert block.text in pages, f"README block not in docs/: {block.text[:200]}"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 150
    for target in re.findall(r"\]\((docs/[^)#]+)", readme.read_text(encoding="utf-8")):
        assert (ROOT / target).exists(), target
