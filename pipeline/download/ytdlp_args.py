"""yt-dlp's own command-line options read into its Python API options, so that a config says
``preset: sleep`` or an ``--extractor-args`` string exactly as yt-dlp's documentation (and a
PO-token plugin's) writes them, and yt-dlp's parser is the one that reads them."""

from __future__ import annotations

import optparse
from functools import cache
from typing import Any


@cache
def _defaults() -> dict[str, Any]:
    import yt_dlp

    return yt_dlp.parse_options([]).ydl_opts


@cache
def cli_options(*args: str) -> dict[str, Any]:
    """The API options that yt-dlp's command-line ``args`` set (those that differ from its
    defaults); ValueError with yt-dlp's reason for args it refuses."""
    import yt_dlp

    try:
        options = yt_dlp.parse_options(list(args)).ydl_opts
    except (optparse.OptParseError, SystemExit) as exc:
        # yt-dlp's parser puts its usage line before the reason.
        raise ValueError(str(exc).strip().splitlines()[-1].split("error: ", 1)[-1]) from None
    defaults = _defaults()
    return {key: value for key, value in options.items() if defaults.get(key) != value}


def preset_options(name: str) -> dict[str, Any]:
    """The options of yt-dlp's preset alias ``-t NAME``."""
    return cli_options("-t", name)


def extractor_args(specs: tuple[str, ...]) -> dict[str, dict[str, list[str]]]:
    """``--extractor-args`` strings such as ``youtube:player_client=web;po_token=...`` as
    yt-dlp's ``extractor_args`` option."""
    args = tuple(part for spec in specs for part in ("--extractor-args", spec))
    return cli_options(*args).get("extractor_args", {})


def browser_cookies(spec: str) -> tuple:
    """A ``--cookies-from-browser`` spec (``firefox``, ``chrome:Profile 1``) as yt-dlp's
    ``cookiesfrombrowser`` option."""
    return cli_options("--cookies-from-browser", spec)["cookiesfrombrowser"]
