"""The corpus root's build lock: one holder at a time, waiters told who they wait for, and a
lock left by a killed or silent holder taken over."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsspec
import pytest

from pipeline.corpus.rootlock import LOCK_FILE, RootLock, root_lock

ROOT = Path(__file__).resolve().parent.parent
LOGGER = logging.getLogger("test.rootlock")

HOLD = """
import sys, time
from pipeline.corpus.rootlock import root_lock
with root_lock(sys.argv[1], "killed holder"):
    print("held", flush=True)
    time.sleep(600)
"""


def _wait_for(condition, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path, memory_root) -> str:
    return str(tmp_path / "corpus") if request.param == "local" else memory_root


def _lock_exists(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return fs.exists(f"{path}/{LOCK_FILE}")


def test_the_lock_is_held_for_the_block_and_gone_after(root):
    with root_lock(root, "first") as lock:
        holder = lock.holder()
        assert holder is not None and holder.label == "first" and holder.pid == os.getpid()
        assert RootLock(root, "second").try_acquire().token == lock.token
    assert not _lock_exists(root)
    assert RootLock(root, "third").try_acquire() is None


def test_a_second_build_waits_for_the_first_and_says_for_whom(root, caplog):
    caplog.set_level(logging.WARNING, LOGGER.name)
    first = RootLock(root, "flow run 'first'", logger=LOGGER)
    first.acquire()
    second = RootLock(root, "flow run 'second'", poll_s=0.05, logger=LOGGER)
    waiter = threading.Thread(target=second.acquire)
    waiter.start()
    _wait_for(lambda: "is being built by flow run 'first'" in caplog.text, "the waiting message")
    assert waiter.is_alive() and first.holder().token == first.token
    first.release()
    waiter.join(timeout=60)
    assert not waiter.is_alive() and second.holder().token == second.token
    assert "lock taken after waiting" in caplog.text
    second.release()


def test_a_killed_holder_does_not_keep_the_root(tmp_path, caplog):
    root = str(tmp_path / "corpus")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, root], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert RootLock(root, "next").try_acquire().pid == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert _lock_exists(root)
    caplog.set_level(logging.WARNING, LOGGER.name)
    with root_lock(root, "next", logger=LOGGER) as lock:
        assert lock.holder().label == "next"
    assert "taking over the lock of killed holder" in caplog.text
    assert "its process is gone" in caplog.text


def _plant(root: str, heartbeat_age_s: float) -> None:
    """A lock of a run on another host whose last heartbeat is ``heartbeat_age_s`` old."""
    now = time.time()
    fs, path = fsspec.core.url_to_fs(root)
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(f"{path}/{LOCK_FILE}", json.dumps({
        "token": "elsewhere", "label": "flow run 'remote'", "host": "another-host", "pid": 1,
        "since": now - 3600, "heartbeat": now - heartbeat_age_s}).encode())


def test_a_holder_elsewhere_is_waited_for_until_its_heartbeat_stops(root):
    _plant(root, heartbeat_age_s=5)
    assert RootLock(root, "here", stale_s=60).try_acquire().token == "elsewhere"
    _plant(root, heartbeat_age_s=120)
    lock = RootLock(root, "here", stale_s=60)
    assert lock.try_acquire() is None and lock.holder().label == "here"


def test_the_holder_keeps_its_heartbeat_fresh(root):
    with root_lock(root, "long build", heartbeat_s=0.05) as lock:
        first = lock.holder().heartbeat
        _wait_for(lambda: lock.holder().heartbeat > first, "a heartbeat")
        assert lock.holder().token == lock.token


def test_an_unfinished_lock_file_is_taken_over_once_abandoned(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / LOCK_FILE).write_bytes(b"")
    assert RootLock(str(root), "here", heartbeat_s=30).try_acquire().label == "an unfinished lock file"
    old = time.time() - 120
    os.utime(root / LOCK_FILE, (old, old))
    lock = RootLock(str(root), "here", heartbeat_s=30)
    assert lock.try_acquire() is None and lock.holder().label == "here"
