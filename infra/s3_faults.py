"""An HTTP proxy in front of an S3-compatible store (infra/stack.py puts it before moto's
server) that counts the requests and bytes the store sees and fails the share of them it is
told to: HTTP 500 (InternalError), HTTP 503 (SlowDown), or a reply held back for a while, as
real object stores do now and then.

    GET  /__faults__   {"requests": n, "bytes_in": n, "bytes_out": n, "failed": n, "slowed": n,
                        "by_method": {...}, "faults": {...}}
    POST /__faults__   {"p500": 0.05, "p503": 0.05, "pslow": 0.05, "slow_s": 3}: from now on
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

CONTROL = "/__faults__"
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}
_ERRORS = {500: ("InternalError", "We encountered an internal error. Please try again."),
           503: ("SlowDown", "Please reduce your request rate.")}


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults = {"p500": 0.0, "p503": 0.0, "pslow": 0.0, "slow_s": 3.0}
        self.counts = {"requests": 0, "bytes_in": 0, "bytes_out": 0, "failed": 0, "slowed": 0}
        self.by_method: dict[str, int] = {}
        self.rng = random.Random(0)

    def snapshot(self) -> dict:
        with self.lock:
            return {**self.counts, "by_method": dict(self.by_method), "faults": dict(self.faults)}


def handler(upstream: str, tally: Tally) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _control(self, body: bytes) -> None:
            if self.command == "POST":
                with tally.lock:
                    tally.faults.update({k: float(v) for k, v in json.loads(body or b"{}").items()})
            data = json.dumps(tally.snapshot()).encode()
            self._reply(200, data, {"Content-Type": "application/json", "Content-Length": str(len(data))})

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith(CONTROL):
                self._control(body)
                return
            with tally.lock:
                roll, faults = tally.rng.random(), dict(tally.faults)
                tally.counts["requests"] += 1
                tally.counts["bytes_in"] += len(body)
                tally.by_method[self.command] = tally.by_method.get(self.command, 0) + 1
            status = 500 if roll < faults["p500"] else 503 if roll < faults["p500"] + faults["p503"] else None
            if status is not None:
                code, message = _ERRORS[status]
                data = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                        f"<Message>{message}</Message></Error>").encode()
                with tally.lock:
                    tally.counts["failed"] += 1
                self._reply(status, data, {"Content-Type": "application/xml", "Content-Length": str(len(data))})
                return
            if roll < faults["p500"] + faults["p503"] + faults["pslow"]:
                with tally.lock:
                    tally.counts["slowed"] += 1
                time.sleep(faults["slow_s"])
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=300)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                out = {k: v for k, v in response.getheaders() if k.lower() not in _HOP}
            finally:
                connection.close()
            if self.command != "HEAD":
                out["Content-Length"] = str(len(data))
            with tally.lock:
                tally.counts["bytes_out"] += len(data)
            self._reply(response.status, data, out)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815 - http.server's names

    return Proxy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the store, e.g. http://127.0.0.1:5000")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(args.upstream, Tally()))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
