"""The configuration reference page, rendered from ``schemas/config.schema.json``.

One table per top-level section, one row per key with its dotted path, type, default and
description; nested sections (``shards.webdataset.media``) and the items of object lists
(``features.extractors[]``, each kind of ``sources[]``) get tables of their own. Every key of
the schema is a row, so the page cannot fall behind the config models.
"""

from __future__ import annotations

import json
from typing import Any

Schema = dict[str, Any]

_INTRO = """# Configuration reference

Every key of the YAML config, generated from `schemas/config.schema.json` (itself generated
from the config models by `vlcorpus schema --write`) each time the site is built. A key that is
not listed here is refused before any work. For a guided tour, see
[Writing a config](../configuration.md); for the three paper recipes,
[Corpus styles](../styles.md).
"""


class _Defs:
    """Resolves ``$ref``s against the schema's ``$defs``."""

    def __init__(self, schema: Schema) -> None:
        self.defs = schema.get("$defs", {})

    def resolve(self, node: Schema) -> Schema:
        ref = node.get("$ref")
        return self.defs[ref.rsplit("/", 1)[-1]] if ref else node


def _is_object(node: Schema) -> bool:
    return "properties" in node


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type(node: Schema, defs: _Defs) -> str:
    """A type as a reader thinks of it: ``integer > 0``, ``list of string``, ``one of: a, b``."""
    if "anyOf" in node:
        return " or ".join(_type(option, defs) for option in node["anyOf"])
    if "discriminator" in node:
        tag = node["discriminator"]["propertyName"]
        return f"section by `{tag}`: " + ", ".join(f"`{kind}`" for kind in node["discriminator"]["mapping"])
    if "oneOf" in node:
        return " or ".join(_type(option, defs) for option in node["oneOf"])
    if "$ref" in node:
        target = defs.resolve(node)
        return "section (below)" if _is_object(target) else _type(target, defs)
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return "one of: " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    kind = node.get("type", "any")
    if kind == "array":
        return f"list of {_type(node.get('items', {}), defs)}"
    if kind == "object":
        if _is_object(node):
            return "section (below)"
        keys = node.get("propertyNames", {}).get("enum")
        values = node.get("additionalProperties", True)
        values = _type(values, defs) if isinstance(values, dict) else "any"
        return f"map of {'/'.join(keys) if keys else 'string'} to {values}"
    bounds = [f"{op} {node[key]}" for key, op in (("minimum", "≥"), ("exclusiveMinimum", ">"),
                                                   ("maximum", "≤"), ("exclusiveMaximum", "<"))
              if key in node]
    if node.get("minLength") == 1:
        bounds.append("not empty")
    elif "minLength" in node:
        bounds.append(f"at least {node['minLength']} characters")
    if "pattern" in node:
        bounds.append(f"matching `{node['pattern']}`")
    return f"{kind} {', '.join(bounds)}" if bounds else kind


def _default(node: Schema, required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in node:
        return ""
    return f"`{json.dumps(node['default'], ensure_ascii=False)}`"


def _children(path: str, node: Schema, defs: _Defs) -> list[tuple[str, str, Schema]]:
    """The object sections a key holds, as (path of their keys, heading, section): the key's
    own section, each kind of a section told apart by a key (``execution.cluster``, headed
    ``execution.cluster: kind slurm``), the items of a list of objects
    (``features.extractors[]``), or each kind of a list told apart by its ``type``
    (``sources[]``, headed ``sources[]: type search``)."""
    found: list[tuple[str, str, Schema]] = []
    tag = node.get("discriminator", {}).get("propertyName")
    for kind in node.get("oneOf", []) if tag else []:
        target = defs.resolve(kind)
        found.append((path, f"`{path}`: {tag} `{target['properties'][tag]['const']}`", target))
    for option in [node, *node.get("anyOf", [])]:
        target = defs.resolve(option)
        if _is_object(target):
            found.append((path, f"`{path}`", target))
        items = option.get("items", {})
        kinds = items.get("oneOf") or items.get("anyOf") or ([items] if items else [])
        for kind in kinds:
            item = defs.resolve(kind)
            if not _is_object(item):
                continue
            tag = item["properties"].get("type", {}).get("const")
            heading = f"`{path}[]`: type `{tag}`" if tag and len(kinds) > 1 else f"`{path}[]`"
            found.append((f"{path}[]", heading, item))
    return found


def _section(path: str, heading: str, node: Schema, defs: _Defs, out: list[str], level: int) -> None:
    """A table of ``node``'s keys under ``path``, then one section per nested object."""
    out += [f"{'#' * min(level, 4)} {heading}", ""]
    if node.get("description"):
        out += [node["description"], ""]
    out += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    nested: list[tuple[str, Schema]] = []
    required = set(node.get("required", []))
    for key, child in sorted(node["properties"].items()):
        dotted = f"{path}.{key}"
        description = child.get("description") or defs.resolve(child).get("description", "")
        out.append(f"| `{dotted}` | {_cell(_type(child, defs))} | {_cell(_default(child, key in required))} "
                   f"| {_cell(description)} |")
        nested += _children(dotted, child, defs)
    out.append("")
    for child_path, child_heading, target in nested:
        _section(child_path, child_heading, target, defs, out, level + 1)


def render(schema: Schema) -> str:
    """The whole reference page as Markdown."""
    defs = _Defs(schema)
    out = [_INTRO, "## Top-level keys", "", "| key | type | default | description |", "| --- | --- | --- | --- |"]
    required = set(schema.get("required", []))
    sections: list[tuple[str, str, Schema]] = []
    for key, node in sorted(schema["properties"].items()):
        description = node.get("description") or defs.resolve(node).get("description", "")
        out.append(f"| `{key}` | {_cell(_type(node, defs))} | {_cell(_default(node, key in required))} "
                   f"| {_cell(description)} |")
        sections += _children(key, node, defs)
    out.append("")
    for path, heading, target in sections:
        _section(path, heading, target, defs, out, 2)
    return "\n".join(out)
