"""An HTTP server on 127.0.0.1 serving many tiny video pages, misbehaving on purpose.

It answers 429 (or ``error_code``) to a share of requests, drops a share of connections without
answering, can refuse every request for a while after a number of them (a session block, 429
or 403), and counts requests in flight (in all and per Host header) so tests can check limits
from the outside.

Page ``/v/<stem>.html`` has a <video> and two caption tracks, ``en`` and ``en-auto``. Its stem
picks a misbehaviour: ``forbidden`` (the page is always 403), ``expiring`` (its media answers
403 the first time, like an expired signed URL), ``cap404`` (the ``en`` track is 404),
``capbad`` (the ``en`` track is not subtitles), ``truncated`` (its media is cut in half),
``notvideo`` (its media is not a video). Page ``/list/<stem>.html`` embeds three videos: a
playlist for discover.

``forward_proxy`` is an HTTP proxy on 127.0.0.1 that can ask for a password or refuse every
request (a blocked egress).
"""

from __future__ import annotations

import base64
import random
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VTT = "WEBVTT\n\n00:00:00.000 --> 00:00:00.900\nHello there.\n"
# YouTube's auto-caption layout (inline word times), which transcribe tells from an author's.
AUTO_VTT = ("WEBVTT\n\n00:00:00.000 --> 00:00:00.900 align:start position:0%\n"
            "hello<00:00:00.400><c> there</c>\n")


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
    first_at: float | None = None  # time.time() of the first request
    throttled: int = 0
    dropped: int = 0
    served_media: dict[str, int] = field(default_factory=dict)
    p429: float = 0.0  # share of requests answered error_code; tests may change it while serving
    pdrop: float = 0.0  # share of connections dropped without an answer
    error_code: int = 429
    in_flight_by_host: dict[str, int] = field(default_factory=dict)
    max_in_flight_by_host: dict[str, int] = field(default_factory=dict)
    served_pages: dict[str, int] = field(default_factory=dict)
    expired: set[str] = field(default_factory=set)  # media that answered 403 once
    block: Block | None = None


@dataclass
class Block:
    """Every request after the first ``after`` is refused with ``code`` for ``seconds`` (from
    the first refusal), and on until it has refused the page of each of at least ``videos``
    different videos twice (a loaded machine sends few requests in a few seconds; a refused
    caption track fails no download, and a video whose page is refused once extracts again
    before its 403 counts); then the server serves again. With
    ``again_after``, the block comes back once, that many seconds after it ended, for
    ``seconds`` more."""

    after: int
    seconds: float
    code: int = 429
    again_after: float | None = None
    videos: int = 0
    started: float | None = None
    refused: int = 0
    refused_pages: Counter[str] = field(default_factory=Counter)

    def refuses(self, request_number: int, video: str, page: bool) -> bool:
        if request_number <= self.after:
            return False
        now = time.monotonic()
        if self.started is None:
            self.started = now
        elapsed = now - self.started
        twice = sum(n >= 2 for n in self.refused_pages.values())
        blocked = elapsed < self.seconds or twice < self.videos
        if self.again_after is not None:
            back = self.seconds + self.again_after
            blocked = blocked or back <= elapsed < back + self.seconds
        if blocked:
            self.refused += 1
            if page:
                self.refused_pages[video] += 1
        return blocked

    @property
    def ends(self) -> float | None:
        """time.monotonic() when the last refusal window ends (None: not begun), for a block
        without ``videos``."""
        if self.started is None:
            return None
        return self.started + self.seconds + (self.again_after + self.seconds if self.again_after is not None else 0)


def _handler(media: bytes, stats: Stats, rng: random.Random,
             delay_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            host = self.headers.get("Host", "").rsplit(":", 1)[0]
            self._host, self._counted = host, True
            with stats.lock:
                stats.in_flight += 1
                stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
                by_host = stats.in_flight_by_host
                by_host[host] = by_host.get(host, 0) + 1
                stats.max_in_flight_by_host[host] = max(stats.max_in_flight_by_host.get(host, 0),
                                                        by_host[host])
                stats.requests += 1
                stats.first_at = stats.first_at or time.time()
                video = self.path.rsplit("/", 1)[-1].split(".", 1)[0]
                refused = stats.block is not None and stats.block.refuses(stats.requests, video,
                                                                            self.path.endswith(".html"))
                roll = rng.random()
            try:
                if refused:
                    self._send(stats.block.code, b"refused", "text/plain")
                else:
                    self._answer(roll)
            finally:
                self._answered()

        def _answered(self) -> None:
            """The request leaves the in-flight count once, before its answer goes out: a client
            that has its answer may send its next request before this thread runs again, and
            that request must not count as one more at once."""
            if self._counted:
                self._counted = False
                with stats.lock:
                    stats.in_flight -= 1
                    stats.in_flight_by_host[self._host] -= 1

        def _answer(self, roll: float) -> None:
            threading.Event().wait(delay_s)
            if roll < stats.pdrop:
                with stats.lock:
                    stats.dropped += 1
                self._answered()
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if roll < stats.pdrop + stats.p429:
                with stats.lock:
                    stats.throttled += 1
                self._send(stats.error_code, b"slow down", "text/plain", {"Retry-After": "0"})
                return
            name = self.path.rsplit("/", 1)[-1]
            stem = name.split(".", 1)[0]
            if self.path.startswith("/v/") and name.endswith(".html"):
                with stats.lock:
                    stats.served_pages[stem] = stats.served_pages.get(stem, 0) + 1
                if "forbidden" in stem:
                    self._send(403, b"forbidden", "text/plain")
                    return
                page = (f'<html><head><title>video {stem}</title></head><body>'
                        f'<video controls><source src="/media/{stem}.mp4" type="video/mp4">'
                        f'<track kind="captions" src="/subs/{stem}.vtt" srclang="en">'
                        f'<track kind="captions" src="/subs/{stem}.auto.vtt" srclang="en-auto">'
                        f'</video></body></html>')
                self._send(200, page.encode(), "text/html")
            elif self.path.startswith("/list/") and name.endswith(".html"):
                videos = "".join(f'<video controls><source src="/media/{stem}-{i}.mp4" type="video/mp4"></video>'
                                 for i in range(3))
                self._send(200, f"<html><head><title>list {stem}</title></head><body>{videos}</body></html>".encode(),
                           "text/html")
            elif self.path.startswith("/media/"):
                with stats.lock:
                    expire = "expiring" in stem and stem not in stats.expired
                    if expire:
                        stats.expired.add(stem)
                    else:
                        stats.served_media[name] = stats.served_media.get(name, 0) + 1
                if expire:
                    self._send(403, b"signature expired", "text/plain")
                else:
                    body = (media[: len(media) // 2] if "truncated" in stem
                            else b"no video" if "notvideo" in stem else media)
                    self._send(200, body, "video/mp4")
            elif self.path.startswith("/subs/"):
                auto = name.endswith(".auto.vtt")
                if "cap404" in stem and not auto:
                    self._send(404, b"not found", "text/plain")
                elif "capbad" in stem and not auto:
                    self._send(200, b"<html>this is no subtitle file</html>", "text/vtt")
                else:
                    self._send(200, (AUTO_VTT if auto else VTT).encode(), "text/vtt")
            else:
                self._send(404, b"not found", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str,
                  headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self._answered()
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def flaky_server(media: bytes, p429: float = 0.1, pdrop: float = 0.05, seed: int = 0,
                 delay_s: float = 0.01, error_code: int = 429,
                 block: Block | None = None) -> Iterator[tuple[str, Stats]]:
    stats = Stats(p429=p429, pdrop=pdrop, error_code=error_code, block=block)
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


@contextmanager
def forward_proxy(password: str | None = None,
                  refuse: int | None = None) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """A forward HTTP proxy on 127.0.0.1: answers 407 without ``user:<password>`` (when given),
    ``refuse`` (e.g. 429) to every request (when given), and otherwise forwards, recording the
    headers of every request it was asked; yields (port, those headers)."""
    seen: list[dict[str, str]] = []
    expected = "Basic " + base64.b64encode(f"user:{password}".encode()).decode()
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    class Proxy(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _reply(self, code: int, ctype: str, body: bytes,
                   headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if password is not None and self.headers.get("Proxy-Authorization") != expected:
                self._reply(407, "text/plain", b"", {"Proxy-Authenticate": 'Basic realm="test"'})
                return
            seen.append(dict(self.headers))
            if refuse is not None:
                self._reply(refuse, "text/plain", b"refused")
                return
            try:
                with direct.open(self.path, timeout=30) as answer:
                    code, ctype, body = answer.status, answer.headers.get("Content-Type"), answer.read()
            except urllib.error.HTTPError as exc:
                code, ctype, body = exc.code, "text/plain", b""
            self._reply(code, ctype or "application/octet-stream", body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()
