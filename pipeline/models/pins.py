"""The sha256 each published model file must have, and the check of a file against it.

Every file the project downloads from a model server is checked: a download before it takes its
place in the cache, and a file found in the cache once per process (hashing reads about a GB a
second, so the largest, resnet152's 230 MB, costs a fifth of a second per worker process; a
marker beside it would save that, but it would be a second thing to trust, and a write into the
cache that `vlcorpus check` promises not to make). A file that does not match is deleted, and
the caller's one-line refusal names it with the expected and the actual hash.

torchvision's file names carry the first 8 hex digits of their sha256 (``resnet34-b627a593.pth``),
which torch.hub checks only with ``check_hash=True``: that prefix is their pin. Any other file
needs its entry in ``SHA256``; one without is never downloaded nor loaded from the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re

from pipeline.errors import SetupError

# File name -> its sha256, or at least its first 8 hex digits; before the name's own prefix.
SHA256: dict[str, str] = {
    # Missing: the MIL-NCE release (s3d_howto100m.pth, s3d_dict.npy from
    # www.rocq.inria.fr/cluster-willow/amiech/howto100m/) publishes no hash, and none was found
    # in any public repository or mirror. Until their sha256 are pinned here from the genuine
    # files, `weights: default` of the s3d_howto100m extractors is refused.
}

_NAME_PREFIX = re.compile(r"-([0-9a-f]{8,64})\.")  # torch.hub's HASH_REGEX, at least 8 digits
_PIN = re.compile(r"[0-9a-f]{8,64}")
# (device, inode, size, modification time) -> sha256: a file is hashed once per process, and a
# checked download is not hashed again once moved into place (a rename keeps all four).
_DIGESTS: dict[tuple[int, int, int, int], str] = {}


class Mismatch(SetupError):
    """A file that does not match its pinned sha256; it has been deleted."""


def pinned(name: str) -> str:
    """The sha256 (or its first hex digits) the published file ``name`` must have; a SetupError
    where none is pinned."""
    pin = SHA256.get(name)
    if pin is None:
        match = _NAME_PREFIX.search(name)
        if match is None:
            raise SetupError(f"no sha256 is pinned for the published {name} (pipeline/models/pins.py), so it is "
                             f"neither downloaded nor loaded from the cache")
        pin = match.group(1)
    return pin


def file_sha256(path: str) -> str:
    """The sha256 of the file at ``path``, read once per version of the file in a process."""
    info = os.stat(path)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def check(path: str, pin: str, what: str) -> None:
    """Nothing when the file at ``path`` has the sha256 ``pin`` (or one that starts with it);
    else the file is deleted and ``Mismatch`` says so in one line, ``what`` naming the file."""
    if not _PIN.fullmatch(pin):  # an empty or short pin would match anything
        raise ValueError(f"not a sha256 pin (8 to 64 lower-case hex digits): {pin!r}")
    actual = file_sha256(path)
    if actual.startswith(pin):
        return
    with contextlib.suppress(FileNotFoundError):  # another process may have found it first
        os.remove(path)
    raise Mismatch(f"{what} did not match its pinned sha256 (expected {pin}, got {actual}) and was deleted")
