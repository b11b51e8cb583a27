"""serve_demo: the site over HTTP from a daemon thread, quietly (no request log, no tracebacks
for clients that hang up), with urls.txt written for the server's address."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pipeline.demo.model import DemoSite
from pipeline.demo.pages import write_text


class QuietHandler(SimpleHTTPRequestHandler):
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".vtt": "text/vtt", ".mp4": "video/mp4"}

    def log_message(self, format: str, *args: object) -> None:
        """Requests are not logged: the demo server runs inside tests and pipelines."""


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """Clients that hang up early (yt-dlp probing, ffmpeg seeking) are not errors here."""


@contextlib.contextmanager
def serve_demo(site_dir: Path, host: str = "127.0.0.1", port: int = 0,
               handler: Callable[..., QuietHandler] = QuietHandler) -> Iterator[str]:
    """Serve site_dir over HTTP in a daemon thread; yields the base URL, ending in '/'.
    Writes urls.txt (every page URL for this server, one a line) into site_dir. ``handler``
    answers the requests (the tests' own, to hold some back), given ``directory``."""
    site_dir = Path(site_dir)
    site = DemoSite.load(site_dir)
    server = _QuietServer((host, port), functools.partial(handler, directory=str(site_dir)))
    base_url = f"http://{host}:{server.server_address[1]}/"
    write_text(site_dir / "urls.txt", "".join(f"{u}\n" for u in site.page_urls(base_url)))
    thread = threading.Thread(target=server.serve_forever, name="demo-http", daemon=True)
    thread.start()
    try:
        yield base_url
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
