"""A demo site served over HTTP on 127.0.0.1 as ``pipeline.demo.serve_demo`` serves it, except
that every request is recorded with its headers, and some media misbehave on request: ``trickle``
sends a file a little at a time (a transfer that goes on and on), ``stall`` sends its headers and
a first block, then nothing until the server stops (a transfer that makes no progress)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

BLOCK = 4096
Behaviour = Literal["trickle", "stall"]


@dataclass
class Site:
    base: str  # http://127.0.0.1:PORT/
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (path, headers)
    behaviours: dict[str, Behaviour] = field(default_factory=dict)  # by path, e.g. /media/slow.mp4
    stopping: threading.Event = field(default_factory=threading.Event)

    def asked(self, path: str) -> int:
        return sum(p == path for p, _ in self.requests)


def _handler(site: Site, folder: Path, lock: threading.Lock) -> type[SimpleHTTPRequestHandler]:
    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            with lock:
                site.requests.append((self.path, dict(self.headers)))
                behaviour = site.behaviours.get(self.path)
            if behaviour is None:
                super().do_GET()
                return
            data = (folder / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data[:BLOCK])
                self.wfile.flush()
                if behaviour == "stall":
                    site.stopping.wait()
                    return
                for start in range(BLOCK, len(data), BLOCK):
                    if site.stopping.wait(0.25):
                        return
                    self.wfile.write(data[start:start + BLOCK])
                    self.wfile.flush()
            except OSError:  # the client gave up: what a stopped download does
                return

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """Clients that hang up early (yt-dlp probing, a download stopped) are not errors here."""


@contextmanager
def recorded_site(folder: Path, port: int = 0) -> Iterator[Site]:
    """``folder`` (a demo site) served on ``port`` (0: any free one) until the block ends."""
    site = Site("")
    server = _Server(("127.0.0.1", port), functools.partial(_handler(site, folder, threading.Lock()),
                                                         directory=str(folder)))
    site.base = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, name="media-site", daemon=True)
    thread.start()
    try:
        yield site
    finally:
        site.stopping.set()
        server.shutdown()
        server.server_close()
