"""Hugging Face models on this machine: found in the local Hub cache on disk alone, and
downloaded into it on first use (pipeline/models/cache.py says when).

Whether a model is cached is a question for the disk alone: asking the Hub libraries with the
network allowed (or even only for their user-agent headers) waits on a Hub that cannot be
reached, seconds to minutes on a machine without internet, only to say "not there".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

from pipeline.models.cache import Published

# local_files_only -> the snapshot folder (huggingface_hub's snapshot_download, or a library's
# own wrapper of it, such as faster-whisper's download_model with its file patterns).
Snapshot = Callable[[bool], str]


def _snapshot(repo_id: str, local_files_only: bool) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id, local_files_only=local_files_only)


def _cached(snapshot: Snapshot) -> str | None:
    """The snapshot's folder in the local cache (``HF_HOME``), or None when it is not there (or
    its id cannot name a Hub repository)."""
    try:
        return snapshot(True)
    except Exception:  # noqa: BLE001 - not cached, or not a valid repository id: both "not here"
        return None


def hub_model(repo_id: str, snapshot: Snapshot | None = None) -> Published:
    """``repo_id``'s main revision as a model the Hub (``HF_ENDPOINT``) publishes."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.file_download import repo_folder_name

    get = snapshot or partial(_snapshot, repo_id)
    token = get_token()  # the environment or the token file: no network
    # Beside huggingface_hub's own per-file locks (.locks/models--org--name/).
    lock = f"{repo_folder_name(repo_id=repo_id, repo_type='model')}.vlcorpus.lock"
    return Published(
        label=f"Hugging Face model {repo_id!r}",
        url=f"{constants.ENDPOINT}/{repo_id}",
        probe_url=f"{constants.ENDPOINT}/api/models/{repo_id}/revision/main",
        cache=cache_folder(),
        lock=os.path.join(cache_folder(), ".locks", lock),
        cached=partial(_cached, get),
        download=partial(get, False),
        hugging_face=True,
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )


def cache_folder() -> str:
    """Where the cache is looked for, for messages."""
    from huggingface_hub.constants import HF_HUB_CACHE

    return HF_HUB_CACHE
