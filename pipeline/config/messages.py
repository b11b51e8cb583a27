"""Pydantic validation errors as one line per problem: `key.path: message (got value)`."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from pipeline.config.model import Config
from pipeline.config.problems import Problems
from pipeline.config.sources import SOURCE_TYPES

# Keys that earlier versions read, and where they went: a config written for one of those
# versions is told where to write the value now (any key gone since the partitioned layout).
MOVED = {
    "shards.webdataset.samples_per_shard": "shards.samples_per_shard",
    "shards.parquet.rows_per_file": "shards.samples_per_shard (one size for both formats)",
}


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, UnionType)


def _discriminator(tp: Any) -> str | None:
    if get_origin(tp) is Annotated:
        for meta in get_args(tp)[1:]:
            if isinstance(meta, FieldInfo) and isinstance(meta.discriminator, str):
                return meta.discriminator
    return None


def _strip(tp: Any) -> Any:
    """Drop Annotated (but not a discriminated union's) and Optional wrappers."""
    while True:
        if get_origin(tp) is Annotated and _discriminator(tp) is None:
            tp = get_args(tp)[0]
        elif _is_union(tp) and type(None) in get_args(tp):
            rest = [a for a in get_args(tp) if a is not type(None)]
            if len(rest) != 1:
                return Union[tuple(rest)]
            tp = rest[0]
        else:
            return tp


_NOT_A_UNION = object()


def _union_member(tp: Any, item: str | int) -> Any:
    """The union member a loc item names, None if unknown, _NOT_A_UNION if tp is no union."""
    tag_key = _discriminator(tp)
    if tag_key is not None:
        for member in get_args(get_args(tp)[0]):
            if item in get_args(member.model_fields[tag_key].annotation):
                return member
        return None
    if _is_union(tp):
        return next((m for m in get_args(tp) if getattr(m, "__name__", None) == item), None)
    return _NOT_A_UNION


def _child(tp: Any, item: str | int) -> Any:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(str(item))
        return field.annotation if field is not None else None
    origin = get_origin(tp)
    if origin is list:
        return get_args(tp)[0]
    if origin is dict:
        return get_args(tp)[1]
    return None


def _walk(loc: tuple[str | int, ...]) -> tuple[list[str], Any, Any, bool]:
    """Display path of a pydantic loc (union tags dropped), the type found there, the type
    holding its last key, and whether a plain union branch was passed."""
    path: list[str] = []
    tp: Any = Config
    parent: Any = None
    via_union = False
    for item in loc:
        if item == "[key]":  # marks an error in a dict key rather than its value
            continue
        tp = _strip(tp)
        member = _union_member(tp, item)
        if member is not _NOT_A_UNION:
            via_union = via_union or _discriminator(tp) is None
            tp = member
            continue
        parent = tp
        path.append(str(item))
        tp = _child(tp, item)
    return path, _strip(tp), _strip(parent), via_union


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def problem_lines(exc: ValidationError) -> list[str]:
    """One line per problem: `key.path: message (got value)`."""
    allowed_types = ", ".join(sorted(SOURCE_TYPES))
    # Errors of the branches of a plain union (e.g. `str | int`) share one line.
    problems: dict[Any, tuple[str, list[str], str]] = {}
    for n, err in enumerate(exc.errors()):
        loc, kind, msg = tuple(err["loc"]), err["type"], err["msg"]
        error = err.get("ctx", {}).get("error")
        if isinstance(error, Problems):
            for j, (sub, message) in enumerate(error.items):
                problems[(n, j)] = (".".join(_walk(loc + sub)[0]) or "(top level)", [message], "")
            continue
        path, tp, parent, via_union = _walk(loc)
        show_input = kind not in ("missing", "extra_forbidden", "value_error")
        if kind == "extra_forbidden" and ".".join(map(str, path)) in MOVED:
            msg = f"this key moved to {MOVED['.'.join(map(str, path))]}; write the value there"
        elif kind == "extra_forbidden":
            allowed = ", ".join(sorted(parent.model_fields)) if isinstance(parent, type) else "?"
            msg = f"unknown key; allowed keys: {allowed}"
        elif kind == "union_tag_invalid":
            path.append("type")
            msg = f"unknown source type {err['ctx']['tag']!r}; allowed types: {allowed_types}"
            show_input = False
        elif kind == "union_tag_not_found":
            path.append("type")
            msg = f"missing key; allowed types: {allowed_types}"
            show_input = False
        elif kind in ("model_type", "model_attributes_type"):
            msg = "Input should be a mapping"
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        if tp is SecretStr or isinstance(err.get("input"), dict):
            show_input = False
        where = ".".join(path) or "(top level)"
        got = f" (got {_short_repr(err['input'])})" if show_input else ""
        key = ("union", where) if via_union else n
        if key in problems:
            problems[key][1].append(msg)
        else:
            problems[key] = (where, [msg], got)
    return [f"{where}: {'; or '.join(msgs)}{got}" for where, msgs, got in problems.values()]
