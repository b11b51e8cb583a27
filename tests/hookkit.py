"""A webhook on 127.0.0.1 that keeps what is posted to it, for the alert of infra/alerts.py."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Hook:
    """The webhook's address and the texts posted to it (``{"text": ...}``, as the alert posts)."""

    def __init__(self, url: str, texts: list[str]) -> None:
        self.url = url
        self.texts = texts

    def with_line(self, line: str) -> list[str]:
        """The texts posted so far that have ``line`` in them."""
        return [text for text in self.texts if line in text]

    def wait(self, line: str, seconds: float = 120, why: Callable[[], str] = str) -> str:
        """The first text with ``line`` in it, once one came; ``why()`` says what went wrong if
        none came."""
        deadline = time.monotonic() + seconds
        while not (found := self.with_line(line)):
            assert time.monotonic() < deadline, why()
            time.sleep(0.5)
        return found[0]


@contextmanager
def webhook() -> Iterator[Hook]:
    texts: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the handler's name
            length = int(self.headers.get("Content-Length", 0))
            texts.append(json.loads(self.rfile.read(length))["text"])
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Hook(f"http://127.0.0.1:{server.server_port}/hook", texts)
    finally:
        server.shutdown()
        server.server_close()
