"""Local copies of a remote root's files, for tools that need a path on disk (ffmpeg, PyAV,
training and its checkpoints): a file copied for the duration of a block, and a folder copied,
then written back once the block ends without an error. ``Corpus.local_file`` and
``Corpus.local_folder`` (pipeline/corpus/storage.py) use them for roots that are not local."""

from __future__ import annotations

import contextlib
import os
import posixpath
import tempfile
from collections.abc import Iterator

import fsspec


@contextlib.contextmanager
def copied_file(fs: fsspec.AbstractFileSystem, remote: str) -> Iterator[str]:
    """A temporary local copy of the file ``remote``, for the duration of the block."""
    with tempfile.TemporaryDirectory(prefix="vlcorpus-") as tmp:
        local = os.path.join(tmp, os.path.basename(remote))
        fs.get(remote, local)
        yield local


@contextlib.contextmanager
def copied_folder(fs: fsspec.AbstractFileSystem, remote: str, write: bool) -> Iterator[str]:
    """A temporary local copy of what the folder ``remote`` holds; with ``write``, it replaces
    the folder once the block ends without an error (files the block deleted are deleted there
    too, files it did not change are not uploaded again)."""
    with tempfile.TemporaryDirectory(prefix="vlcorpus-") as tmp:
        before = {posixpath.relpath(f, remote): f for f in fs.find(remote)}
        fetched = {}
        for relative, remote_file in before.items():
            local_file = os.path.join(tmp, *relative.split("/"))
            os.makedirs(os.path.dirname(local_file), exist_ok=True)
            fs.get_file(remote_file, local_file)
            fetched[relative] = _stamp(local_file)
        yield tmp
        if not write:
            return
        after = set()
        for folder, _, names in os.walk(tmp):
            for name in names:
                local_file = os.path.join(folder, name)
                relative = os.path.relpath(local_file, tmp).replace(os.sep, "/")
                after.add(relative)
                if fetched.get(relative) != _stamp(local_file):  # new or rewritten
                    fs.put_file(local_file, posixpath.join(remote, relative))
        gone = [f for relative, f in before.items() if relative not in after]
        if gone:
            fs.rm(gone)


def _stamp(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns
