"""Disk use of a real pipelined build with `storage.keep_media: false`, against its bound, and
its wall time beside a stage-at-a-time build of the same site.

The site: --videos test-pattern videos of --seconds at 854x480 with author captions
(benchkit.make_caption_site), served on 127.0.0.1 at --rate MB/s per connection, as the
internet would. Two builds (`vlcorpus build CONFIG --root FRESH --until shard`, no features,
WebDataset samples with stream-copied clip mp4s, so the shard stage reads the media):
- pipelined: `execution.pipelined: true`, `max_inflight_partitions: K` (--inflight),
  `partitions: --partitions`, `storage.keep_media: false`;
- stage at a time: the same with `execution.pipelined: false`, into another root.
A thread samples the bytes under each root's media/ folder, under the whole root, and under the
root less shards/ (the output, which stays: with clip mp4s it grows to about the media's size)
every 0.2 s. The bound is the media of the K + 1 largest partitions together (from the
downloads table's `bytes`); the pipelined build's peak under media/ must be at most that (the
root less shards/ is shown beside it: media, .part files, subtitles, tables). After each build
every downloads row must carry `released_at`, media/ must be empty, and `vlcorpus validate`
must pass. Prints the peaks, the bound and whether it holds, both wall times and their ratio,
then one JSON line; exits 1 when a check fails (never on a time).
Usage: python bench/bounded_disk.py [--videos 24] [--seconds 60] [--rate 2] [--partitions 8] [--inflight 2]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow.compute as pc
import yaml
from benchkit import make_caption_site, vlcorpus

from pipeline.demo import DemoSite
from pipeline.corpus.storage import Corpus

MB = 1e6
CHUNK = 64 * 1024
SAMPLE_S = 0.2


class _Throttled(SimpleHTTPRequestHandler):
    """Serves files at ``rate`` bytes/s per connection, quietly."""

    def __init__(self, *args: Any, rate: float, **kwargs: Any) -> None:
        self.rate = rate  # set first: the base class handles the request in __init__
        super().__init__(*args, **kwargs)

    def copyfile(self, source: BinaryIO, outputfile: BinaryIO) -> None:
        started, sent = time.monotonic(), 0
        while chunk := source.read(CHUNK):
            outputfile.write(chunk)
            sent += len(chunk)
            ahead = sent / self.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)

    def log_message(self, format: str, *args: object) -> None:
        """No request log: it would drown the bench's output."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up early are not errors here."""


@contextlib.contextmanager
def serve_throttled(site: Path, rate: float) -> Iterator[str]:
    """The site over HTTP on 127.0.0.1 at ``rate`` bytes/s per connection; yields the base URL."""
    handler = functools.partial(_Throttled, rate=rate, directory=str(site))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="throttled-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def tree_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``, tolerating files that vanish while it looks."""
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(folder):
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir(follow_symlinks=False):
                    total += tree_bytes(Path(entry.path))
                else:
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def top_level_bytes(root: Path) -> dict[str, int]:
    """Bytes under each entry of ``root`` (a file's own size for a file)."""
    sizes = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(root):
            with contextlib.suppress(FileNotFoundError):
                sizes[entry.name] = (tree_bytes(Path(entry.path)) if entry.is_dir(follow_symlinks=False)
                                     else entry.stat(follow_symlinks=False).st_size)
    return sizes


class DiskSampler(threading.Thread):
    """Every SAMPLE_S until stopped, the bytes under root/media, under the whole root, and under
    the root less its shards (the build's output, which stays); keeps the peak of each."""

    def __init__(self, root: Path) -> None:
        super().__init__(name="disk-sampler", daemon=True)
        self.root = root
        self.peak = {"media": 0, "root": 0, "root_less_shards": 0}
        self.samples = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            sizes = top_level_bytes(self.root)
            total = sum(sizes.values())
            sample = {"media": sizes.get("media", 0), "root": total,
                      "root_less_shards": total - sizes.get("shards", 0)}
            self.peak = {k: max(v, sample[k]) for k, v in self.peak.items()}
            self.samples += 1
            self._done.wait(SAMPLE_S)

    def stop(self) -> None:
        self._done.set()
        self.join()


def write_config(path: Path, urls: Path, args: argparse.Namespace, pipelined: bool) -> Path:
    config = {
        "name": "bounded-disk",
        "sources": [{"type": "list", "path": str(urls)}],
        "transcribe": {"prefer": ["manual"]},
        "storage": {"keep_media": False},
        "execution": {"partitions": args.partitions, "pipelined": pipelined,
                      "max_inflight_partitions": args.inflight},
        "shards": {"webdataset": {"include_media": True, "media": {"precision": "copy"}}},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def build(config: Path, root: Path) -> tuple[float, DiskSampler]:
    """Wall time of one build while its root is sampled."""
    root.mkdir()
    sampler = DiskSampler(root)
    sampler.start()
    started = time.perf_counter()
    log = root.with_suffix(".log")
    done = vlcorpus(["build", str(config), "--root", str(root), "--until", "shard", "--quiet"], log)
    elapsed = time.perf_counter() - started
    sampler.stop()
    if done.returncode:
        raise SystemExit(f"build into {root} failed ({done.returncode}):\n{log.read_text()[-4000:]}")
    return elapsed, sampler


def partition_media(root: Path) -> dict[str, int]:
    """Bytes of media each partition downloaded, from the downloads table."""
    corpus = Corpus(str(root))
    sizes: dict[str, int] = {}
    for label in corpus.partitions_of("downloads"):
        data = corpus.read("downloads", columns=["bytes"], partition=label).column("bytes")
        sizes[label] = pc.sum(data).as_py() or 0
    return sizes


def released_checks(root: Path) -> dict[str, Any]:
    """Whether every downloads row records `released_at`, media/ is empty and validate passes."""
    downloads = Corpus(str(root)).read("downloads", columns=["released_at"])
    unreleased = pc.sum(pc.is_null(downloads.column("released_at"))).as_py() or 0
    left = [p.name for p in (root / "media").glob("*")] if (root / "media").exists() else []
    log = root.with_suffix(".validate.log")
    validate = vlcorpus(["validate", str(root)], log)
    return {"downloads": downloads.num_rows, "released": downloads.num_rows - unreleased,
            "media_left": len(left), "validate_ok": validate.returncode == 0,
            "validate_output": log.read_text().strip()[-1500:]}


def measure(name: str, work: Path, urls: Path, args: argparse.Namespace, pipelined: bool) -> dict[str, Any]:
    config = write_config(work / f"{name}.yaml", urls, args, pipelined)
    root = work / name
    seconds, sampler = build(config, root)
    sizes = partition_media(root)
    largest = sorted(sizes.values(), reverse=True)
    return {"seconds": round(seconds, 1), "samples": sampler.samples,
            **{f"peak_{k}_mb": round(v / MB, 1) for k, v in sampler.peak.items()},
            "media_mb": round(sum(largest) / MB, 1),
            "partition_media_mb": {k: round(v / MB, 1) for k, v in sorted(sizes.items())},
            "bound_mb": round(sum(largest[: args.inflight + 1]) / MB, 1),
            "shards_mb": round(tree_bytes(root / "shards") / MB, 1),
            "checks": released_checks(root)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=24)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--rate", type=float, default=2.0, help="MB/s per connection")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--inflight", type=int, default=2, help="execution.max_inflight_partitions")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vlcorpus-disk-") as tmp:
        work = Path(tmp)
        print(f"making {args.videos} videos of {args.seconds} s ...", flush=True)
        site: DemoSite = make_caption_site(work / "site", args.videos, args.seconds)
        with serve_throttled(site.out_dir, args.rate * MB) as base:
            urls = work / "urls.txt"
            urls.write_text("".join(f"{u}\n" for u in site.page_urls(base)))
            runs = {}
            for name, pipelined in (("pipelined", True), ("stage_at_a_time", False)):
                runs[name] = measure(name, work, urls, args, pipelined)
                print(f"{name}: {runs[name]['seconds']:.1f} s", flush=True)
    failed = report(args, runs)
    sys.exit(1 if failed else 0)


def report(args: argparse.Namespace, runs: dict[str, dict[str, Any]]) -> list[str]:
    """Prints the figures and the JSON line; returns the checks that failed."""
    piped, staged = runs["pipelined"], runs["stage_at_a_time"]
    holds = piped["peak_media_mb"] <= piped["bound_mb"]
    print(f"\n{args.videos} videos x {args.seconds} s ({piped['media_mb']:.0f} MB of media) in "
          f"{args.partitions} partitions, served at {args.rate:g} MB/s per connection")
    print("media per partition (MB): " + ", ".join(f"{k} {v:.1f}" for k, v in piped["partition_media_mb"].items()))
    print(f"{'peaks in MB':<26} {'wall s':>7} {'media/':>8} {'root less shards/':>18} {'root':>8} "
          f"{'shards at the end':>18}")
    for name, label in (("pipelined", f"pipelined, {args.inflight} in flight"), ("stage_at_a_time", "stage at a time")):
        r = runs[name]
        print(f"{label:<26} {r['seconds']:>7.1f} {r['peak_media_mb']:>8.1f} {r['peak_root_less_shards_mb']:>18.1f} "
              f"{r['peak_root_mb']:>8.1f} {r['shards_mb']:>18.1f}")
    print(f"bound: the {args.inflight + 1} largest partitions' media = {piped['bound_mb']:.1f} MB; "
          f"pipelined peak under media/ {piped['peak_media_mb']:.1f} MB: {'holds' if holds else 'DOES NOT HOLD'}; "
          f"under the root less shards/ {piped['peak_root_less_shards_mb']:.1f} MB "
          f"({'within' if piped['peak_root_less_shards_mb'] <= piped['bound_mb'] else 'over'} the bound)")
    ratio = piped["seconds"] / staged["seconds"]
    print(f"wall time pipelined / stage at a time: {ratio:.2f}")
    failed = [] if holds else ["bound"]
    for name, r in runs.items():
        c = r["checks"]
        print(f"{name}: released_at on {c['released']}/{c['downloads']} downloads rows, "
              f"{c['media_left']} files left in media/, validate {'ok' if c['validate_ok'] else 'FAILED'}")
        if not c["validate_ok"]:
            print(c["validate_output"])
        if c["released"] != c["downloads"] or c["media_left"] or not c["validate_ok"]:
            failed.append(name)
    print(json.dumps({"videos": args.videos, "seconds": args.seconds, "rate_mb_s": args.rate,
                      "partitions": args.partitions, "inflight": args.inflight, "bound_holds": holds,
                      "pipelined_over_staged": round(ratio, 2), "failed": failed,
                      **{k: {n: v for n, v in r.items() if n != "checks"} | {"checks": {
                          n: v for n, v in r["checks"].items() if n != "validate_output"}}
                         for k, r in runs.items()}}))
    return failed


if __name__ == "__main__":
    main()
