"""Published models fetched into the libraries' own caches on first use (DESIGN.md, weights).

A model that the cache lacks is downloaded by the process that needs it (the worker building an
extractor or an ASR backend), under a lock file in the cache folder: several worker processes
on one machine download it once, the others wait and then find it there. Nothing is downloaded

- where an offline switch says so: ``VLCORPUS_OFFLINE=1`` for every model, ``HF_HUB_OFFLINE=1``
  for Hugging Face's, and the caller's own (``features.download_weights: false``);
- during a setup check (``vlcorpus check``, and a build's before any work): there a missing
  model is only probed for, and passes as "downloaded on first use" (``DownloadOnFirstUse``)
  or is refused.

A weight file that does not match its pinned sha256 (pipeline/models/pins.py), downloaded or
found in the cache, is deleted and refused like a model that cannot be had.

Before a download the hub is probed with one request that gives up after ``PROBE_TIMEOUT_S``
(huggingface_hub's own client has no timeout for its first calls), so that an unreachable hub
is a refusal within seconds, not after the libraries' retries.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from urllib.parse import urlparse

from pipeline.errors import SetupError
from pipeline.models.pins import Mismatch

log = logging.getLogger(__name__)

OFFLINE_ENV = "VLCORPUS_OFFLINE"
PROBE_TIMEOUT_S = 1.5
# A host that could not be reached is not asked again for this long: a check of several models
# on one hub then costs one timeout, not one each.
_DOWN_FOR_S = 60.0
_DOWN: dict[str, tuple[float, str]] = {}
_CHECKING: ContextVar[bool] = ContextVar("vlcorpus_setup_check", default=False)

FETCH_HINT = "`vlcorpus fetch-models CONFIG` fetches every model a config needs"


@dataclass(frozen=True)
class Published:
    """A model a hub publishes, and where a library keeps its copy."""

    label: str  # what messages call it: "ResNet34_Weights.IMAGENET1K_V1", "Hugging Face model 'org/name'"
    url: str  # where it is downloaded from, for messages
    probe_url: str  # asked before a download: does the hub answer, and has it the model
    cache: str  # the folder its copy goes to
    lock: str  # the lock file that makes its download once per machine
    # Its local copy, found on disk alone, or None; a published file is checked against its
    # pinned sha256 first (pipeline/models/pins.py), and one that does not match is a Mismatch.
    cached: Callable[[], str | None]
    download: Callable[[], str]  # download it into the cache (checked likewise); its local copy
    hugging_face: bool = False  # HF_HUB_OFFLINE applies, and the probe is a GET of the Hub's API
    headers: dict[str, str] = field(default_factory=dict)  # of the probe (a token, for private repos)


class DownloadOnFirstUse(Exception):
    """Raised during a setup check for a model that is not cached but can be downloaded: the
    check passes (the model is fetched where it is used), and this is what to tell the user."""


@contextmanager
def setup_check() -> Iterator[None]:
    """Within: a missing model is probed for, never downloaded (``DownloadOnFirstUse``)."""
    token = _CHECKING.set(True)
    try:
        yield
    finally:
        _CHECKING.reset(token)


def _on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def offline_reason(model: Published, off: str | None = None) -> str | None:
    """Why ``model`` must not be downloaded here, or None: ``off`` is the caller's own switch."""
    if _on(OFFLINE_ENV):
        return f"{OFFLINE_ENV}=1 turns model downloads off"
    if model.hugging_face and (_on("HF_HUB_OFFLINE") or _on("TRANSFORMERS_OFFLINE")):
        return "HF_HUB_OFFLINE=1 turns Hugging Face downloads off"
    return off


def probe(url: str, method: str = "HEAD", headers: dict[str, str] | None = None) -> str | None:
    """Why ``url`` cannot be downloaded (the host cannot be reached, or it answers an HTTP
    error), or None; within ``PROBE_TIMEOUT_S``."""
    parsed = urlparse(url)
    host = f"{parsed.scheme}://{parsed.netloc}"
    down = _DOWN.get(host)
    if down is not None and time.monotonic() - down[0] < _DOWN_FOR_S:
        return down[1]
    answer: list[tuple[bool, str | None]] = []
    # In a thread: the request's timeout does not bound resolving the host's name.
    asking = threading.Thread(target=lambda: answer.append(_ask(url, method, headers or {})), daemon=True)
    asking.start()
    asking.join(PROBE_TIMEOUT_S + 0.1)
    answered, problem = answer[0] if answer else (False, f"no answer in {PROBE_TIMEOUT_S:g} s")
    if answered:
        return None if problem is None else f"{url} answered {problem}"
    why = f"{host} cannot be reached ({problem})"
    _DOWN[host] = (time.monotonic(), why)
    return why


def _ask(url: str, method: str, headers: dict[str, str]) -> tuple[bool, str | None]:
    """Whether the host answered, and the problem: its HTTP error, or why it did not answer."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers),
                                    timeout=PROBE_TIMEOUT_S):
            return True, None
    except urllib.error.HTTPError as exc:
        return True, f"HTTP {exc.code} {exc.reason}"
    except (OSError, ValueError) as exc:  # refused, reset, timed out, no such name, not a URL
        reason = getattr(exc, "reason", exc)
        return False, f"{type(reason).__name__}: {reason}"


@contextmanager
def machine_lock(path: str, what: str) -> Iterator[None]:
    """Held by one process of the machine at a time (a lock file, so any process: Dask's
    worker processes, two builds); a second waits for the first's download."""
    from filelock import FileLock, Timeout  # comes with torch and huggingface_hub

    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another process's download of %s (lock %s)", what, path)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def obtain(model: Published, who: str, missing: Callable[[str], SetupError], off: str | None = None) -> str:
    """The local copy of ``model``: from the cache, else downloaded into it (once per machine).
    ``missing(reason)`` is the caller's error for a model that cannot be had, with why (a file
    that did not match its pinned sha256 among them); ``off`` the caller's own reason not to
    download (a config switch), or None."""
    try:
        return _obtain(model, who, missing, off)
    except Mismatch as exc:
        raise missing(str(exc)) from None


def _obtain(model: Published, who: str, missing: Callable[[str], SetupError], off: str | None) -> str:
    found = model.cached()
    if found is not None:
        return found
    reason = offline_reason(model, off)
    if reason is not None:
        raise missing(f"it cannot be downloaded here: {reason}")
    if _CHECKING.get():
        problem = _probe(model)
        if problem is not None:
            raise missing(f"it cannot be downloaded: {problem}")
        raise DownloadOnFirstUse(
            f"{who}: {model.label} is not in the local cache ({model.cache}): a build downloads it "
            f"there from {model.url} on first use, once per machine; for workers without internet, "
            f"{FETCH_HINT}")
    with machine_lock(model.lock, model.label):
        found = model.cached()  # another process's download, while this one waited
        if found is not None:
            return found
        problem = _probe(model)
        if problem is not None:
            raise missing(f"it cannot be downloaded: {problem}")
        log.info("%s: downloading %s from %s into %s", who, model.label, model.url, model.cache)
        try:
            return model.download()
        except Mismatch:
            raise
        except Exception as exc:  # noqa: BLE001 - the libraries raise many kinds; the message says which
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise missing(f"its download from {model.url} failed ({type(exc).__name__}: {first})") from None


def _probe(model: Published) -> str | None:
    return probe(model.probe_url, "GET" if model.hugging_face else "HEAD", model.headers)
