"""`vlcorpus init NAME`: a commented starter config for one of the corpus styles.

The templates are package data (``pipeline/starters/<style>.yaml``), valid configs themselves
named ``my_corpus``. Their first line is the comment the YAML language server (VS Code's YAML
extension, and editors that use it) reads to complete and check keys against
``schemas/config.schema.json``; a written starter gets that line again with the path from the
folder it is written to, relative, so that it keeps working when the folder and the install
move together (absolute, as a file URI, where no relative path exists: another drive).
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

from pipeline.config import SCHEMA_PATH

SCHEMA_COMMENT = "# yaml-language-server: $schema="
# The styles, spelled as their recipes in configs/ and their templates pipeline/starters/<style>.yaml.
STYLES: tuple[str, ...] = ("howto100m", "apartment_tour", "spoken_moments")
PLACEHOLDER = "my_corpus"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # as Config.name


class StarterError(ValueError):
    """A starter that cannot be written: an unknown style, a bad name, an existing file."""


def style_name(style: str) -> str:
    """``style`` as STYLES spells it; hyphens are taken for underscores (``apartment-tour``, as
    earlier versions spelled it)."""
    name = style.replace("-", "_")
    if name not in STYLES:
        raise StarterError(f"unknown style {style!r}; styles: {', '.join(STYLES)}")
    return name


def template(style: str) -> str:
    """The packaged template of ``style``, as it is."""
    return resources.files("pipeline").joinpath("starters", f"{style_name(style)}.yaml").read_text(encoding="utf-8")


def schema_reference(directory: Path, schema: Path = SCHEMA_PATH) -> str:
    """The schema's path as a config written in ``directory`` names it."""
    try:
        return Path(os.path.relpath(schema.resolve(), directory.resolve())).as_posix()
    except ValueError:  # another drive (Windows)
        return schema.resolve().as_uri()


def starter_text(name: str, style: str, directory: Path) -> str:
    """The starter of ``style`` for a corpus ``name``, to be written in ``directory``."""
    if not _NAME.match(name):
        raise StarterError(f"{name!r} cannot name a corpus: letters, digits, '_', '.', '-', "
                           f"starting with a letter or digit")
    lines = template(style).splitlines(keepends=True)
    if not lines[0].startswith(SCHEMA_COMMENT):
        raise RuntimeError(f"pipeline/starters/{style_name(style)}.yaml: its first line is not the schema comment")
    body = "".join(lines[1:]).replace(PLACEHOLDER, name)
    return f"{SCHEMA_COMMENT}{schema_reference(directory)}\n{body}"


def write_starter(name: str, style: str, out: Path) -> Path:
    """Write ``out/<name>.yaml``; an existing file is never overwritten."""
    stem = name[:-5] if name.endswith(".yaml") else name
    text = starter_text(stem, style, out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.yaml"
    try:
        with path.open("x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError:
        raise StarterError(f"{path} exists; not overwritten (remove it or pick another name)") from None
    return path
