"""Secrets never leak (issue #10): a build whose downloads go through an authenticating proxy
with a cookies file, with Google credentials in the environment, leaves none of the three
planted secrets in any file of the corpus (tables, media, shards, report), in the Prefect
server's database (flow parameters, task runs, logs) or in the output of the run and its Dask
workers. The proxy checks the password and sees the cookie, so the secrets were really used.

Shard member names and the report's escaping are checked in test_shards.py and test_report.py.
"""

from __future__ import annotations

import base64
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import require_binaries
from flows.build import run_build
from pipeline.config import parse_config
from pipeline.demo import serve_demo
from pipeline.storage import Corpus
from pipeline.validate import validate

pytestmark = pytest.mark.slow
PROXY_PASSWORD = "pr0xy-pa55-7f3a9c"
COOKIE_VALUE = "c00kie-5ess10n-b81e4d"
GOOGLE_KEY = "g00gle-pr1vate-key-2c6d0e"


@contextmanager
def authenticating_proxy(password: str) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """A forward HTTP proxy on 127.0.0.1 that answers 407 without ``user:<password>`` and
    records the headers of every request it forwards."""
    seen: list[dict[str, str]] = []
    expected = "Basic " + base64.b64encode(f"user:{password}".encode()).decode()
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    class Proxy(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.headers.get("Proxy-Authorization") != expected:
                self.send_response(407)
                self.send_header("Proxy-Authenticate", 'Basic realm="test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            seen.append(dict(self.headers))
            try:
                with direct.open(self.path, timeout=30) as answer:
                    code, ctype, body = answer.status, answer.headers.get("Content-Type"), answer.read()
            except urllib.error.HTTPError as exc:
                code, ctype, body = exc.code, "text/plain", b""
            self.send_response(code)
            self.send_header("Content-Type", ctype or "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def _files(folder: Path) -> Iterator[Path]:
    return (p for p in folder.rglob("*") if p.is_file())


def test_planted_secrets_appear_in_no_output_of_a_build(demo_corpus, tmp_path, prefect_server,
                                                        monkeypatch, capfd):
    require_binaries("ffmpeg", "ffprobe")
    _, site = demo_corpus
    cookies = tmp_path / "secret" / "cookies.txt"
    cookies.parent.mkdir()
    credentials = tmp_path / "secret" / "google.json"
    credentials.write_text(f'{{"type": "service_account", "private_key": "{GOOGLE_KEY}"}}')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials))
    root = tmp_path / "corpus"
    with serve_demo(site) as base, authenticating_proxy(PROXY_PASSWORD) as (port, seen):
        host = base.split("//", 1)[1].split(":", 1)[0]
        cookies.write_text("# Netscape HTTP Cookie File\n"
                           f"{host}\tFALSE\t/\tFALSE\t0\tsession\t{COOKIE_VALUE}\n")
        cfg = parse_config({
            "name": "secrets",
            "sources": [{"type": "urls", "urls": [f"{base}pages/tour-0.html", f"{base}pages/gone.html"]}],
            "download": {"proxy": f"http://user:{PROXY_PASSWORD}@127.0.0.1:{port}",
                         "cookies_file": str(cookies), "subtitle_langs": ["en"]},
            "transcribe": {"prefer": ["manual"]},
            "features": {"extractors": [{"name": "resnet34", "fps": 1, "weights": "none"}]},
            "execution": {"retry_backoff_s": 0},
        })
        summary = run_build(cfg, root=str(root), until="report")
    # The secrets were used: every request went through the proxy with the password, and
    # the cookie reached the site.
    assert summary["tables"]["clips"] > 0 and summary["errors"] == {"download": {"permanent": 1}}
    assert seen and any(COOKIE_VALUE in h.get("Cookie", "") for h in seen)
    assert validate(Corpus(str(root))) == []

    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL

    APILogWorker.drain_all()  # the run's logs, into the server's database
    out, err = capfd.readouterr()
    # The server's SQLite file and its journal files (a session-wide test harness may have
    # moved the database out of PREFECT_HOME).
    db = Path(PREFECT_API_DATABASE_CONNECTION_URL.value().split(":///", 1)[1])
    database = [p for p in db.parent.iterdir() if p.name.startswith(db.name)]
    searched = [*_files(root), *_files(Path(os.environ["PREFECT_HOME"])), *database]
    assert any(p.suffix == ".parquet" for p in searched) and db in database
    # Control: the database does hold the flow's parameters (the config, cookies path included).
    assert any(str(cookies).encode() in p.read_bytes() for p in database)
    for secret in (PROXY_PASSWORD, COOKIE_VALUE, GOOGLE_KEY):
        leaks = [str(p) for p in searched if secret.encode() in p.read_bytes()]
        assert leaks == [], f"{secret} found in {leaks}"
        assert secret not in out and secret not in err
