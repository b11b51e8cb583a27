"""An HTTP server on 127.0.0.1 serving many tiny video pages, misbehaving on purpose.

It answers 429 to a share of requests, drops a share of connections without answering, and
counts requests in flight so tests can check a concurrency limit from the outside.
"""

from __future__ import annotations

import random
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VTT = "WEBVTT\n\n00:00:00.000 --> 00:00:00.900\nHello there.\n"


def tiny_mp4(path: Path) -> bytes:
    subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
         "testsrc=size=64x48:rate=10:duration=1", "-c:v", "libx264", "-pix_fmt", "yuv420p",
         "-movflags", "+faststart", str(path)],
        check=True,
    )
    return path.read_bytes()


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0
    throttled: int = 0
    dropped: int = 0
    served_media: dict[str, int] = field(default_factory=dict)
    p429: float = 0.0  # share of requests answered 429; tests may change it while serving
    pdrop: float = 0.0  # share of connections dropped without an answer


def _handler(media: bytes, stats: Stats, rng: random.Random,
             delay_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            with stats.lock:
                stats.in_flight += 1
                stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
                stats.requests += 1
                roll = rng.random()
            try:
                self._answer(roll)
            finally:
                with stats.lock:
                    stats.in_flight -= 1

        def _answer(self, roll: float) -> None:
            threading.Event().wait(delay_s)
            if roll < stats.pdrop:
                with stats.lock:
                    stats.dropped += 1
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if roll < stats.pdrop + stats.p429:
                with stats.lock:
                    stats.throttled += 1
                self._send(429, b"slow down", "text/plain", {"Retry-After": "0"})
                return
            name = self.path.rsplit("/", 1)[-1]
            if self.path.startswith("/v/") and name.endswith(".html"):
                stem = name[:-5]
                page = (f'<html><head><title>video {stem}</title></head><body>'
                        f'<video controls><source src="/media/{stem}.mp4" type="video/mp4">'
                        f'<track kind="captions" src="/subs/{stem}.vtt" srclang="en"></video>'
                        f'</body></html>')
                self._send(200, page.encode(), "text/html")
            elif self.path.startswith("/media/"):
                with stats.lock:
                    stats.served_media[name] = stats.served_media.get(name, 0) + 1
                self._send(200, media, "video/mp4")
            elif self.path.startswith("/subs/"):
                self._send(200, VTT.encode(), "text/vtt")
            else:
                self._send(404, b"not found", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str,
                  headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def flaky_server(media: bytes, p429: float = 0.1, pdrop: float = 0.05, seed: int = 0,
                 delay_s: float = 0.01) -> Iterator[tuple[str, Stats]]:
    stats = Stats(p429=p429, pdrop=pdrop)
    handler = _handler(media, stats, random.Random(seed), delay_s)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", stats
    finally:
        server.shutdown()
        server.server_close()
