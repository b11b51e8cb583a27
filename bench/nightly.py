"""Nightly rebuilds at HowTo100M's size, run whole: a root of its shape written through the
project's own storage code, with a config that names it, then `vlcorpus build` with nothing to
do, `vlcorpus status`, `vlcorpus report` (and `vlcorpus validate`) on it as a user types them,
and a night that adds new videos spread over every partition, each command timed whole: its
wall seconds, the CPU seconds of it and of every process it started (by role: the command, the
setup checks' process, Prefect's server, the Dask workers), the largest RSS of any of them.

    python bench/nightly.py                                       # 2048 partitions, 1.22M videos
    python bench/nightly.py --partitions 64 --night 0.01          # the same videos a partition
    python bench/nightly.py --root /data/h100m --keep             # keep the root (1.8 GB)
    python bench/nightly.py --root /data/h100m --skip-write --night 0.01

The root (in a temporary folder unless ``--root``; deleted at the end unless ``--keep``):
``--videos`` videos (default: HowTo100M's 1.22M carried to ``--partitions``, about 596 a
partition), listed by YouTube id in ``videos.csv`` as configs/howto100m.yaml lists them, each
downloaded (its media released, as ``storage.keep_media: false`` leaves it) with ``--sentences``
timed sentences and as many clips (align's ``fixed`` policy, 5 candidates each), a features row
per clip (one float16 value: the table's shape, not its bytes), 1 video a partition failed for
good, the partition's Parquet shards and their index, the shard listings, and each partition's
summary stored by the code that stores it at the end of a build's chain. ``nightly.yaml``
beside the tables names the root (``root: .``), so that the commands run on it as typed.
HowTo100M has about 110 clips a video; 16 keep the root at 1.8 GB (WebDataset tars are off: a
tar's 512-byte headers make even an empty member 1 KB, about 40 GB for 19.5M clips).

``--night F`` first builds with every partition's summary removed, so that each partition's
chain runs and finds nothing to do: the fixed cost of a chain (worker CPU seconds over chains).
Then F x videos new videos, served on 127.0.0.1 (demo-sized: 10 s test patterns with captions,
pages mirroring four media files), go on the list of a second source, and a build does them:
download, transcribe, align, featurize (ResNet-34, random weights, 1 fps, 64 px), shard,
report. Its workers' CPU seconds less its chains' fixed cost are the new videos' own work.

Prints each goal's ratio (issue 60: the idle rebuild <= 120 s at 2048 partitions and <= 20 s at
64, status and report <= 60 s at 2048, the largest process of those three <= 1 GB, a chain's
fixed cost <= 3 s of worker time; <= 1.0 is met), then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import pyarrow as pa  # noqa: E402
import yaml  # noqa: E402

from pipeline.corpus import partitions  # noqa: E402
from pipeline.corpus.storage import Corpus  # noqa: E402
from pipeline.align.stage import split_for  # noqa: E402
from pipeline.ids import clip_id, video_id  # noqa: E402
from schemas.tables import schema_for, shard_schema  # noqa: E402

HOWTO100M_VIDEOS = 1_220_000
HOWTO100M_PARTITIONS = 2048
NOW = datetime(2026, 1, 1, tzinfo=UTC)
SENTENCE_S = 3.5  # narrations back to back, each a fixed 3.2 s clip around its middle
CLIP_S = 3.2
CANDIDATES = 5
SPLITS = {"train": 0.9, "val": 0.05, "test": 0.05}
EXTRACTOR = "resnet34"
LIST, NIGHT_LIST, CONFIG = "videos.csv", "nightly.txt", "nightly.yaml"
URL_TEMPLATE = "https://www.youtube.com/watch?v={id}"
_ALPHABET = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", np.uint8)
_WORDS = ("now", "take", "the", "cut", "mix", "add", "a", "little", "of", "this", "and", "then",
          "slowly", "pour", "it", "into", "bowl", "we", "need", "two", "cups", "flour", "water")
# Goals of issue 60, seconds (and MB): the idle rebuild at 2048 and at 64 partitions, status and
# report at 2048, any command's peak memory, a chain's fixed cost in worker seconds.
GOALS = {"idle_2048_s": 120, "idle_64_s": 20, "status_2048_s": 60, "report_2048_s": 60,
         "peak_mb": 1024, "chain_fixed_s": 3}


def config(root: Path, partitions_: int) -> dict:
    """The corpus's config: HowTo100M's shape (a list of YouTube ids, align's fixed 3.2 s clips
    with 5 candidates), with cheap media and models for the nights' new videos."""
    return {
        "name": "nightly",
        "root": ".",
        "sources": [{"type": "list", "name": "howto100m", "path": LIST, "id_column": "video_id",
                     "url_template": URL_TEMPLATE},
                    {"type": "list", "name": "nightly", "path": NIGHT_LIST}],
        "download": {"subtitle_langs": ["en"], "rate_limit": None, "per_host": None, "concurrency": 8},
        "transcribe": {"prefer": ["manual", "auto"]},
        "align": {"policy": "fixed", "length_s": CLIP_S, "candidates": CANDIDATES, "splits": SPLITS},
        "features": {"extractors": [{"name": EXTRACTOR, "weights": "none", "fps": 1, "short_side": 64,
                                     "crop": 64}]},
        "shards": {"webdataset": {"enabled": False}},
        "storage": {"keep_media": False},
        "execution": {"partitions": partitions_},
    }


# -- the root ------------------------------------------------------------------------------------
def youtube_ids(count: int) -> list[str]:
    """``count`` distinct 11-character ids, as YouTube's look, the same on every run."""
    digest = np.frombuffer(b"".join(hashlib.sha256(f"nightly:{i}".encode()).digest()[:11]
                                    for i in range(count)), np.uint8).reshape(count, 11)
    return [bytes(row).decode() for row in _ALPHABET[digest % 64]]


def _videos_by_partition(ids: list[str], count: int) -> dict[str, list[tuple[str, str]]]:
    chosen: dict[str, list[tuple[str, str]]] = {}
    for ident in ids:
        vid = video_id("youtube", ident)
        chosen.setdefault(partitions.partition_of(vid, count), []).append((vid, ident))
    return chosen


def _full(table: str, columns: dict[str, pa.Array | list]) -> pa.Table:
    schema = schema_for(table)
    n = len(next(iter(columns.values())))
    return pa.table([columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in schema],
                    schema=schema)


def _sentences(rng: np.random.Generator, n: int) -> list[str]:
    lengths = rng.integers(4, 12, n)
    picks = rng.integers(0, len(_WORDS), int(lengths.sum()))
    out, at = [], 0
    for length in lengths:
        out.append(" ".join(_WORDS[i] for i in picks[at:at + length]))
        at += length
    return out


def write_partition(root: str, label: str, videos: list[tuple[str, str]], sentences: int,
                    samples_per_shard: int) -> None:
    """One partition's tables, shards, index and summary, as a finished build leaves them."""
    from pipeline.compose.stages import context
    from pipeline.compose.summarize_partition import store_summary
    from pipeline.config import parse_config
    from pipeline.shards.hashing import HashingWriter
    from pipeline.shards.index import PartitionIndex, ShardEntry, ShardFile
    from pipeline.shards.parquet import FOLDER, part_name

    corpus = Corpus(root)
    rng = np.random.default_rng(int(label))
    videos = sorted(videos)
    ids = [v for v, _ in videos]
    n = len(ids)
    failed, done = ids[-1], ids[:-1]  # one video a partition failed for good at download
    corpus.write_batch("videos", _full("videos", {
        "video_id": ids, "url": [URL_TEMPLATE.format(id=i) for _, i in videos], "extractor": ["youtube"] * n,
        "source": ["list"] * n, "query": [LIST] * n, "discovered_at": pa.array([NOW] * n, pa.timestamp("us", "UTC"))}),
        "bench-videos", label, done=ids)
    k = len(done)
    duration = sentences * SENTENCE_S + 1.0
    subtitle = pa.array([[{"lang": "en", "kind": "auto", "path": f"subs/{v}.en.vtt"}] for v in done],
                        schema_for("downloads").field("subtitles").type)
    corpus.write_batch("downloads", _full("downloads", {
        "video_id": done, "media_path": [f"media/{v}.mp4" for v in done], "subtitles": subtitle,
        "format_id": ["18"] * k, "width": pa.array([640] * k, pa.int32()), "height": pa.array([360] * k, pa.int32()),
        "fps": [25.0] * k, "duration_s": [duration] * k, "bytes": [20_000_000] * k, "has_audio": [True] * k,
        "status": ["ok"] * k, "downloaded_at": pa.array([NOW] * k, pa.timestamp("us", "UTC")),
        "released_at": pa.array([NOW] * k, pa.timestamp("us", "UTC"))}), "bench-downloads", label, done=done)
    from pipeline.runner import error_row

    corpus.write_batch("errors", [error_row("download", failed, "permanent", "Video unavailable", 1, NOW)],
                       "bench-errors", label)
    owner = np.repeat(np.array(done, dtype=object), sentences)
    index = np.tile(np.arange(sentences, dtype=np.int32), k)
    starts = index * SENTENCE_S
    texts = _sentences(rng, len(owner))
    corpus.write_batch("segments", _full("segments", {
        "video_id": owner, "index": index, "start_s": starts, "end_s": starts + SENTENCE_S, "text": texts,
        "source": ["auto"] * len(owner), "lang": ["en"] * len(owner)}), "bench-segments", label, done=done)
    middle = starts + SENTENCE_S / 2
    clip_start, clip_end = middle - CLIP_S / 2, middle + CLIP_S / 2
    clips = [clip_id(v, s, e) for v, s, e in zip(owner, clip_start, clip_end)]
    splits = np.repeat(np.array([split_for(v, SPLITS) for v in done], dtype=object), sentences)
    near = [texts[max(0, min(i - i % sentences + sentences - CANDIDATES, i - CANDIDATES // 2)):][:CANDIDATES]
            for i in range(len(texts))]
    clip_table = _full("clips", {
        "clip_id": clips, "video_id": owner, "start_s": clip_start, "end_s": clip_end, "text": texts,
        "source": ["auto"] * len(owner), "policy": ["fixed"] * len(owner), "segment_index": index,
        "candidates": near, "split": splits})
    corpus.write_batch("clips", clip_table, "bench-clips", label, done=done)
    features = _full("features", {
        "clip_id": clips, "extractor": [EXTRACTOR] * len(clips), "weights": ["none"] * len(clips),
        "fps": pa.array([1.0] * len(clips), pa.float32()), "frames": pa.array([3] * len(clips), pa.int32()),
        "shape": pa.array([[1]] * len(clips), pa.list_(pa.int32())),
        "values": pa.array([[0.0]] * len(clips), pa.list_(pa.float16()))})
    corpus.write_batch(f"features/{EXTRACTOR}", features, "bench-features", label, done=clips)
    shard = PartitionIndex(label)
    schema = shard_schema([EXTRACTOR])
    for split in SPLITS:
        rows = clip_table.filter(pa.compute.equal(clip_table.column("split"), split)).sort_by(
            [("video_id", "ascending"), ("start_s", "ascending"), ("clip_id", "ascending")])
        for number, first in enumerate(range(0, rows.num_rows, samples_per_shard)):
            part = rows.slice(first, samples_per_shard)
            m = part.num_rows
            table = pa.table([part.column(f.name) if f.name in part.column_names else
                              pa.array([[0.0]] * m, f.type) if f.name == EXTRACTOR else
                              pa.array([[1]] * m, f.type) if f.name == f"{EXTRACTOR}_shape" else
                              pa.nulls(m, f.type) for f in schema], schema=schema)
            name = part_name(split, label, number)
            with corpus.atomic_file(f"{FOLDER}/{name}") as handle:
                hasher = HashingWriter(handle)
                pa.parquet.write_table(table, hasher, row_group_size=1024, compression="zstd")
            entry = ShardEntry(number, split, m, {"parquet": ShardFile(name, hasher.bytes, hasher.sha256)})
            shard.add(entry, part.column("clip_id").to_pylist())
    shard.save(corpus)
    cfg = parse_config(config(Path(root), corpus.partitions))
    store_summary(context(corpus, cfg), label)


def _write_one(args: tuple) -> None:
    write_partition(*args)


def write_root(root: Path, count: int, videos: int, sentences: int, workers: int) -> float:
    """The whole root: its list, layout, partitions (``workers`` processes), listings, config."""
    import pyarrow.csv  # noqa: F401

    from pipeline.shards.index import refresh_listings

    started = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    ids = youtube_ids(videos)
    pa.csv.write_csv(pa.table({"video_id": ids}), root / LIST)
    (root / NIGHT_LIST).write_text("")
    (root / CONFIG).write_text(yaml.safe_dump(config(root, count), sort_keys=False))
    corpus = Corpus(str(root))
    corpus.init_partitions(count)
    by_partition = _videos_by_partition(ids, count)
    samples = 1000
    jobs = [(str(root), label, by_partition.get(label, []), sentences, samples) for label in corpus.labels()
            if by_partition.get(label)]
    with ProcessPoolExecutor(workers) as pool:
        for done, _ in enumerate(pool.map(_write_one, jobs, chunksize=4), 1):
            if done % 256 == 0:
                print(f"  {done}/{len(jobs)} partitions written", file=sys.stderr, flush=True)
    refresh_listings(corpus)
    return time.perf_counter() - started


def root_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# -- timing a command whole ----------------------------------------------------------------------
class Watch:
    """A command's processes (it and every descendant), sampled while it runs: each one's own
    CPU seconds (the last seen; its children's are theirs), its largest RSS and its parent, and
    the largest sum of their proportional set sizes (the memory they take together, the pages
    forked workers share counted once)."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.cpu: dict[int, float] = {}
        self.rss: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.parents: dict[int, int] = {}
        self.pss = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(0.2)

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        pss = 0
        for proc in procs:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    self.cpu[proc.pid] = times.user + times.system
                    memory = proc.memory_full_info()
                    self.rss[proc.pid] = max(self.rss.get(proc.pid, 0), memory.rss)
                    pss += memory.pss
                    if proc.pid not in self.names:
                        self.names[proc.pid] = " ".join(proc.cmdline()[:4])[-80:]
                        self.parents[proc.pid] = proc.ppid()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self.pss = max(self.pss, pss)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def role(self, pid: int) -> str:
        """"command", "server" (Prefect's temporary server), "workers" (what the command's
        fork server forked: the Dask workers and their decoders and ffmpegs) or "other"."""
        if pid == self.root.pid:
            return "command"
        if "temporary_server" in self.names.get(pid, ""):
            return "server"
        return "workers" if self.parents.get(pid) != self.root.pid else "other"


def timed_command(args: list[str], cwd: Path, log: Path, env: dict | None = None) -> dict:
    """``vlcorpus ARGS`` as a user types it: wall seconds, CPU seconds of it and every process
    it started (its own rusage at exit: they are all reaped by then), the same per role as
    sampled (``Watch.role``), the largest RSS of any of them."""
    exe = str(Path(sys.executable).with_name("vlcorpus"))
    started = time.perf_counter()
    before = os.times()
    with open(log, "w") as out:
        proc = subprocess.Popen([exe, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
        watch = Watch(proc.pid)
        code = proc.wait()
    watch.stop()
    wall = time.perf_counter() - started
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    if code:
        raise SystemExit(f"vlcorpus {' '.join(args)} failed ({code}); its log: {log}\n"
                         + log.read_text()[-3000:])
    roles: dict[str, float] = {}
    for pid, seconds in watch.cpu.items():
        roles[watch.role(pid)] = roles.get(watch.role(pid), 0.0) + seconds
    heaviest = max(watch.rss, key=watch.rss.get)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "cpu_by_role_s": {role: round(n, 2) for role, n in sorted(roles.items())},
            "peak_rss_mb": round(watch.rss[heaviest] / 2**20), "peak_process": watch.role(heaviest),
            "peak_pss_all_mb": round(watch.pss / 2**20), "processes": len(watch.cpu)}


# -- the commands --------------------------------------------------------------------------------
def _build_record(root: Path) -> dict:
    """What the newest build's timing record says of its partition pass: each stage's tasks
    (one a partition with work) and their seconds."""
    records = sorted((root / "runs" / "build").glob("*.json"))
    if not records:
        return {}
    stages = json.loads(records[-1].read_text())["stages"]
    parts = {name: s for name, s in stages.items() if isinstance(s, dict) and "task_seconds" in s}
    return {"chains": max((s["partitions"] for s in parts.values()), default=0),
            "task_s": {name: s["task_seconds"] for name, s in parts.items()},
            "done": {name: s.get("ok", 0) for name, s in parts.items()}}


def build(root: Path, log: Path) -> dict:
    """``vlcorpus build nightly.yaml`` in the root, timed whole, the CPU seconds of its Dask
    workers apart, and what its timing record says of its chains."""
    figures = timed_command(["build", CONFIG, "--json"], root, log)
    figures["workers_cpu_s"] = figures["cpu_by_role_s"].get("workers", 0.0)
    figures.update(_build_record(root))
    return figures


def mirror_site(site: Path, videos: int) -> list[str]:
    """Pages of ``videos`` distinct videos on a small site of captioned test patterns (each page
    names one of a few media files): the nights' new videos, demo-sized."""
    from benchkit import make_caption_site

    made = make_caption_site(site, videos=4, seconds=10, size="320x240")
    pages = []
    for i in range(videos):
        source = site / made.videos[i % len(made.videos)].page
        name = f"pages/night-{i:07d}.html"
        shutil.copy(source, site / name)
        pages.append(name)
    return pages


def night(root: Path, work: Path, fraction: float, videos: int) -> dict:
    """Two builds over every partition: first each partition's chain with nothing to do (its
    summary removed, so the build must plan it): the fixed cost of a chain; then ``fraction`` x
    ``videos`` new videos on the list, spread over the partitions by their hash: the night. The
    night's workers' CPU seconds less its chains' fixed cost are the new videos' own work."""
    from pipeline.demo import serve_demo

    shutil.rmtree(root / "_summaries")
    fixed = build(root, work / "chains.log")
    fixed["per_chain_worker_s"] = round(fixed["workers_cpu_s"] / max(1, fixed["chains"]), 3)
    new = max(1, round(fraction * videos))
    pages = mirror_site(work / "site", new)
    with serve_demo(work / "site") as base:
        (root / NIGHT_LIST).write_text("".join(f"{base}{page}\n" for page in pages))
        tonight = build(root, work / "night.log")
    chains = tonight["chains"]
    own = tonight["workers_cpu_s"] - chains * fixed["per_chain_worker_s"]
    return {"new_videos": new, "fixed_chains": fixed, "night": tonight,
            "own_work_worker_s": round(own, 1), "own_work_per_video_s": round(own / new, 3),
            "fixed_worker_s": round(chains * fixed["per_chain_worker_s"], 1)}


def goals(figures: dict) -> dict:
    """Each measured figure against its goal (<= 1.0: met). Memory: the largest process of the
    idle rebuild, status and report (a night's featurizing workers hold torch and a model)."""
    out = {}
    scale = "2048" if figures["partitions"] >= 2048 else "64" if figures["partitions"] == 64 else None
    if scale:
        out[f"idle_{scale}"] = round(figures["idle"]["wall_s"] / GOALS[f"idle_{scale}_s"], 2)
    if scale == "2048":
        for name in ("status", "report"):
            out[f"{name}_2048"] = round(figures[name]["wall_s"] / GOALS[f"{name}_2048_s"], 2)
    commands = [figures[name] for name in ("idle", "status", "report")]
    out["peak_memory"] = round(max(c["peak_rss_mb"] for c in commands) / GOALS["peak_mb"], 2)
    if "night" in figures:
        out["chain_fixed"] = round(figures["night"]["fixed_chains"]["per_chain_worker_s"]
                                   / GOALS["chain_fixed_s"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="where the root goes (default: a temporary folder)")
    parser.add_argument("--partitions", type=int, default=HOWTO100M_PARTITIONS)
    parser.add_argument("--videos", type=int, help="default: HowTo100M's videos a partition, carried")
    parser.add_argument("--sentences", type=int, default=16, help="timed sentences (and clips) a video")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes writing the root")
    parser.add_argument("--skip-write", action="store_true", help="use the root as it is (a night changes it)")
    parser.add_argument("--validate", action="store_true", help="time `vlcorpus validate` too (it reads every file)")
    parser.add_argument("--night", type=float, default=0.0, help="new videos, as a fraction of the corpus")
    parser.add_argument("--keep", action="store_true", help="keep the root and the logs (default: deleted)")
    args = parser.parse_args()
    videos = args.videos or round(HOWTO100M_VIDEOS * args.partitions / HOWTO100M_PARTITIONS)
    figures: dict = {"partitions": args.partitions, "videos": videos, "sentences": args.sentences}
    work = Path(tempfile.mkdtemp(prefix="vlc-nightly-"))
    root = args.root or work / "root"
    try:
        if not args.skip_write:
            if root.exists():
                shutil.rmtree(root)
            figures["write_s"] = round(write_root(root, args.partitions, videos, args.sentences, args.workers), 1)
        figures["root_bytes"] = root_bytes(root)
        figures["idle"] = build(root, work / "idle.log")
        figures["status"] = timed_command(["status", ".", "--json"], root, work / "status.log")
        figures["report"] = timed_command(["report", "."], root, work / "report.log")
        if args.validate:
            figures["validate"] = timed_command(["validate", "."], root, work / "validate.log")
        if args.night:
            figures["night"] = night(root, work, args.night, videos)
        figures["goals"] = goals(figures)
    finally:
        if args.keep:
            print(f"root {root}, logs {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)
    for name, ratio in figures["goals"].items():
        print(f"{name}: {ratio:.2f} of its goal")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
