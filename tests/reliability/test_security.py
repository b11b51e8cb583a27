"""Secrets never leak (issues #10, #16): a build whose downloads go through authenticating
proxies with a cookies file, with Google credentials in the environment, leaves none of the
planted secrets in any file of the corpus (tables, media, shards, report, run figures), in the
Prefect server's database (flow parameters, task runs, logs, the breaker's variables) or in the
output of the run and its Dask workers. The first proxy refuses every request (a blocked
egress), so downloads rotate to the second; the second checks its password and sees the
cookie, so the secrets were really used.

Shard member names and the report's escaping are checked in test_shards.py and test_report.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import require_binaries
from flakyserver import forward_proxy
from flows.build import run_build
from pipeline.config import parse_config
from pipeline.demo import serve_demo
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

pytestmark = pytest.mark.slow
PROXY_PASSWORD = "pr0xy-pa55-7f3a9c"
BLOCKED_PROXY_PASSWORD = "b10cked-pr0xy-pa55-4e1d"
COOKIE_VALUE = "c00kie-5ess10n-b81e4d"
GOOGLE_KEY = "g00gle-pr1vate-key-2c6d0e"


def _files(folder: Path) -> Iterator[Path]:
    return (p for p in folder.rglob("*") if p.is_file())


def test_planted_secrets_appear_in_no_output_of_a_build(demo_corpus, tmp_path, temporary_server,
                                                        monkeypatch, capfd):
    require_binaries("ffmpeg", "ffprobe")
    _, site = demo_corpus
    cookies = tmp_path / "secret" / "cookies.txt"
    cookies.parent.mkdir()
    credentials = tmp_path / "secret" / "google.json"
    credentials.write_text(f'{{"type": "service_account", "private_key": "{GOOGLE_KEY}"}}')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials))
    root = tmp_path / "corpus"
    with (serve_demo(site) as base,
          forward_proxy(BLOCKED_PROXY_PASSWORD, refuse=429) as (blocked_port, refused),
          forward_proxy(PROXY_PASSWORD) as (port, seen)):
        host = base.split("//", 1)[1].split(":", 1)[0]
        cookies.write_text("# Netscape HTTP Cookie File\n"
                           f"{host}\tFALSE\t/\tFALSE\t0\tsession\t{COOKIE_VALUE}\n")
        cfg = parse_config({
            "name": "secrets",
            "sources": [{"type": "urls", "urls": [f"{base}pages/tour-0.html", f"{base}pages/gone.html"]}],
            "download": {"proxies": [
                             f"http://user:{BLOCKED_PROXY_PASSWORD}@127.0.0.1:{blocked_port}",
                             f"http://user:{PROXY_PASSWORD}@127.0.0.1:{port}"],
                         "block_threshold": 1, "cookies_file": str(cookies),
                         "subtitle_langs": ["en"]},
            "transcribe": {"prefer": ["manual"]},
            "features": {"extractors": [{"name": "resnet34", "fps": 1, "weights": "none"}]},
            "frames": {"short_side": 64, "crop": 56},
            "execution": {"retry_backoff_s": 0},
        })
        summary = run_build(cfg, root=str(root), until="report")
    # The secrets were used: the first proxy was tried and refused, every request then went
    # through the second with its password, and the cookie reached the site.
    assert summary["tables"]["clips"] > 0 and summary["errors"] == {"download": {"permanent": 1}}
    assert refused and summary["stages"]["download"]["counters"]["refusals"] >= 1
    assert seen and any(COOKIE_VALUE in h.get("Cookie", "") for h in seen)
    assert validate(Corpus(str(root))) == []

    from flows.services import drain

    drain()  # the run's logs and events, into the server's database
    out, err = capfd.readouterr()
    # The server's SQLite file and its journal files.
    db = Path(temporary_server.database)
    database = [p for p in db.parent.iterdir() if p.name.startswith(db.name)]
    searched = [*_files(root), *_files(Path(os.environ["PREFECT_HOME"])), *database]
    assert any(p.suffix == ".parquet" for p in searched) and database
    # Control: the database does hold the flow's parameters (the config, cookies path included).
    assert any(str(cookies).encode() in p.read_bytes() for p in database)
    # Control: the breaker's state went through the server.
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        variables = {v.name: v.value for v in client.read_variables()}
    assert any(name.startswith("vlcorpus-download-breaker-proxy-") for name in variables)
    assert not any(secret in json.dumps(variables) for secret in (PROXY_PASSWORD, BLOCKED_PROXY_PASSWORD))
    for secret in (PROXY_PASSWORD, BLOCKED_PROXY_PASSWORD, COOKIE_VALUE, GOOGLE_KEY):
        leaks = [str(p) for p in searched if secret.encode() in p.read_bytes()]
        assert leaks == [], f"{secret} found in {leaks}"
        assert secret not in out and secret not in err
