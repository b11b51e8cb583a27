"""A write-only file wrapper that hashes and counts what passes through it."""

from __future__ import annotations

import hashlib
import io
from typing import IO


class HashingWriter(io.RawIOBase):
    def __init__(self, handle: IO[bytes]) -> None:
        super().__init__()
        self._handle = handle
        self._sha = hashlib.sha256()
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        self._sha.update(view)
        self.bytes += len(view)
        self._handle.write(view)
        return len(view)

    def tell(self) -> int:
        return self.bytes

    def flush(self) -> None:
        self._handle.flush()

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()
