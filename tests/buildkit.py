"""`vlcorpus build` as typed, in a process of its own that a test can look into while it runs
(the sockets its processes listen on, and what each speaks), then its output once it ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from conftest import SCRIPT


@dataclass
class Build:
    """A running `vlcorpus build ARGS`: its process, and the files its output goes to (files,
    not pipes: the processes it starts cannot hold the test waiting for pipes to close)."""

    process: subprocess.Popen
    out: Path
    err: Path

    @classmethod
    def start(cls, *args: str, env: dict[str, str], folder: Path) -> Build:
        """``vlcorpus build ARGS`` run in ``folder``, its output in files there."""
        out, err = folder / "build.out", folder / "build.err"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            process = subprocess.Popen([SCRIPT, "build", *args], cwd=folder, env=env, stdout=stdout,
                                       stderr=stderr, start_new_session=True)
        return cls(process, out, err)

    def finish(self, timeout: float = 420) -> subprocess.CompletedProcess:
        """Its exit status and output once it ends. One still running after ``timeout``
        seconds has its process group killed, and the test fails with its output's tail."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            pytest.fail(f"vlcorpus build still running after {timeout:g} s:\n{self.err.read_text()[-6000:]}")
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, self.out.read_text(),
                                           self.err.read_text())


def build(*args: str, env: dict[str, str], folder: Path, code: int = 0) -> subprocess.CompletedProcess:
    """``vlcorpus build ARGS`` run to its end, which must exit with ``code``."""
    done = Build.start(*args, env=env, folder=folder).finish()
    assert done.returncode == code, f"{args}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def summary(done: subprocess.CompletedProcess) -> dict:
    """The summary that `vlcorpus build --json` prints last."""
    return json.loads(done.stdout.strip().splitlines()[-1])


def listening(pid: int) -> dict[psutil.Process, list[tuple[str, int]]]:
    """The TCP addresses that the process ``pid`` and each of its descendants listen on, for
    those that listen on any."""
    found = {}
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            addresses = [(c.laddr.ip, c.laddr.port) for c in process.net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:  # one that ended meanwhile (an ffprobe)
            continue
        if addresses:
            found[process] = addresses
    return found


def speaks(port: int, ca_file: str | None = None) -> str:
    """What the server on 127.0.0.1:``port`` speaks: "http" (it answers a request), "tls" (it
    completes a handshake, showing a certificate), else "neither". A plain request first: a TLS
    server drops it, where a plain Dask comm would read a TLS hello as a frame's length. With
    ``ca_file``, "tls" only for a certificate that CA signed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n")
        try:
            if raw.recv(5) == b"HTTP/":
                return "http"
        except OSError:
            pass
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    if ca_file is None:
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_verify_locations(ca_file)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, context.wrap_socket(raw) as tls:
            return "tls" if tls.getpeercert(binary_form=True) else "neither"
    except (ssl.SSLError, OSError):
        return "neither"
