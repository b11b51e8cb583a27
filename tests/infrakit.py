"""The shipped infrastructure files (infra/) as parsed YAML: for tests/flows/test_infra.py and
tests/flows/test_closed_doors.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import yaml
from conftest import ROOT

INFRA = ROOT / "infra"


def documents(path: Path) -> list:
    """Every non-empty YAML document of the file at ``path``."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def lists_under(node: object, keys: tuple[str, ...]) -> Iterator[list]:
    """Every list held under one of ``keys`` anywhere in a parsed document (not looked into)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in keys and isinstance(value, list):
                yield value
            else:
                yield from lists_under(value, keys)
    elif isinstance(node, list):
        for value in node:
            yield from lists_under(value, keys)
