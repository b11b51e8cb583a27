"""Messages over a pipe between the decode pool (pipeline/media/decode_pool.py) and its worker
processes: each a pickle after its length, the frames themselves as raw bytes beside them; and
the pipe's buffer grown where the system allows, for fewer wake-ups per clip of frames."""

from __future__ import annotations

import contextlib
import pickle
import struct
from typing import IO, Any

_HEADER = struct.Struct("<I")  # length of the pickled message that follows
_PIPE_BYTES = 1 << 20  # pipe buffer asked for (Linux): fewer wake-ups per clip of frames


def grow_pipe(pipe: IO[bytes]) -> None:
    # Not Linux, or above the system's limit: the default buffer works too.
    with contextlib.suppress(ImportError, AttributeError, OSError):
        import fcntl

        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


def write_message(pipe: IO[bytes], message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_HEADER.pack(len(data)) + data)
    pipe.flush()


def read_message(pipe: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream."""
    head = _read_exactly(pipe, _HEADER.size)
    if head is None:
        return None
    body = _read_exactly(pipe, _HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _read_exactly(pipe: IO[bytes], size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = pipe.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
