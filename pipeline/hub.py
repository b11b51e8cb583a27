"""Hugging Face models on this machine: found in the local Hub cache, never over the network.

A build never downloads a model (DESIGN.md, weights), so whether one is there is a question for
the disk alone. Asking the Hub libraries with the network allowed (or even only for their
user-agent headers) waits on a Hub that cannot be reached: seconds to minutes on a machine
without internet, only to say the same "not there".
"""

from __future__ import annotations


def cached_snapshot(repo_id: str) -> str | None:
    """The folder of ``repo_id``'s main revision in the local cache (``HF_HOME``), or None when
    it is not there (or ``repo_id`` cannot name a Hub repository)."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, or not a valid repository id: both "not here"
        return None


def cache_folder() -> str:
    """Where the cache is looked for, for messages."""
    from huggingface_hub.constants import HF_HUB_CACHE

    return HF_HUB_CACHE
