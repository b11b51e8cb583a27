"""YouTube on 127.0.0.1, for yt-dlp's own YouTube extractors: an HTTPS server with a certificate
for www.youtube.com from a test CA, answering what tests/data/ytdlp/youtube.json saved: the
innertube search API (``POST /youtubei/v1/search``, what ``ytsearchN:`` calls) for each query
there, and channel pages (``GET /@SomeRealtor/videos``, a channel's videos tab). Its name and
trust come from tests/resolverkit.py: ``shared(..., hosts=site.hosts, trusted=site.bundle)``
points www.youtube.com at it and has yt-dlp trust its CA, in the test's build processes. Every
request is recorded, with its headers."""

from __future__ import annotations

import datetime
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from conftest import TESTS

SAVED = TESTS / "data" / "ytdlp" / "youtube.json"
NAMES = ("www.youtube.com", "youtube.com")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: dict = field(default_factory=dict)


@dataclass
class YouTube:
    port: int
    bundle: str  # certifi's CA bundle with the test CA added
    requests: list[Request]
    saved: dict

    @property
    def hosts(self) -> dict[str, int]:
        return dict.fromkeys(NAMES, self.port)

    def searched(self) -> list[str]:
        return [r.body.get("query") for r in self.requests if r.path.startswith("/youtubei/v1/search")]


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate of www.youtube.com it signed: (the bundle of certifi's CAs and
    this one, the server's certificate, its key)."""
    import certifi
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid = {"not_valid_before": now - datetime.timedelta(days=1), "not_valid_after": now + datetime.timedelta(days=7)}

    def signed(subject: str, key, issuer: x509.Name, issuer_key, serial: int, extensions) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer).public_key(key.public_key()).serial_number(serial)
                   .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"]))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vlcorpus test CA")])
    ca = signed("vlcorpus test CA", ca_key, ca_name, ca_key, 1, [
        (x509.BasicConstraints(ca=True, path_length=None), True),
        (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                       encipher_only=False, decipher_only=False), True),
        (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)])
    leaf = signed(NAMES[0], key, ca_name, ca_key, 2, [
        (x509.SubjectAlternativeName([x509.DNSName(n) for n in NAMES]), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)])
    bundle, cert, key_file = folder / "bundle.pem", folder / "youtube.pem", folder / "youtube-key.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes() + ca.public_bytes(serialization.Encoding.PEM))
    cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return bundle, cert, key_file


def _handler(saved: dict, requests: list[Request], lock: threading.Lock) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._record({})
            path = urlsplit(self.path).path
            if path in saved["pages"]:
                data = json.dumps(saved["pages"][path])
                self._send(200, f"<html><body><script>var ytInitialData = {data};</script></body></html>", "text/html")
            elif path == "/":  # the web client's config page: yt-dlp takes its defaults without one
                self._send(200, "<html><body></body></html>", "text/html")
            else:
                self._send(404, "not found", "text/plain")

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            self._record(body)
            if urlsplit(self.path).path == "/youtubei/v1/search":
                empty = {"contents": {"twoColumnSearchResultsRenderer": {"primaryContents": {
                    "sectionListRenderer": {"contents": []}}}}}
                self._send(200, json.dumps(saved["search"].get(body.get("query"), empty)), "application/json")
            else:
                self._send(404, "{}", "application/json")

        def _record(self, body: dict) -> None:
            with lock:
                requests.append(Request(self.command, self.path, dict(self.headers), body))

        def _send(self, code: int, text: str, ctype: str) -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", f"{ctype}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextmanager
def youtube_site(folder: Path) -> Iterator[YouTube]:
    """The server, up on a port of its own until the block ends; its certificates in ``folder``."""
    bundle, cert, key = _certificates(folder)
    saved = json.loads(SAVED.read_text())
    requests: list[Request] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(saved, requests, threading.Lock()))
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="youtube", daemon=True)
    thread.start()
    try:
        yield YouTube(server.server_address[1], str(bundle), requests, saved)
    finally:
        server.shutdown()
        server.server_close()
