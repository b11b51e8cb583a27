"""Workers as SLURM jobs (``execution.cluster.kind: slurm``), submitted with sbatch from the
machine the build runs on, on dask-jobqueue's job classes: one scheduler in the build's
process, a CPU pool and a GPU pool of jobs (dask-jobqueue#381 leaves two pools in one cluster
to its users), scaled by flows/clusters/scaling.py.

- Jobs are named for the corpus and the pool (``vlcorpus-<name>-gpu``), their logs go to the
  cluster's ``log_dir``, and every job is cancelled when the build ends, however it ends.
- A GPU job asks for ``processes`` GPUs (``--gres=gpu:N`` or ``--gpus=N``); each of its workers
  offers GPU=1 and sees its own GPU alone (``flows.gpu_worker_start``). CPU workers offer
  CPU=<threads>, which every other task asks for: no GPU job runs a download.
- Workers retire before the job's walltime (``--lifetime``), and a job that ends mid-task
  (walltime, preemption, scancel) loses nothing: the scheduler hands its tasks to another job,
  and a task's committed batches stay committed.
- Before anything is written, ``sbatch --test-only`` of each pool's job says whether SLURM would
  take it (a partition, an account, a QOS that does not exist), in SLURM's own words.
"""

from __future__ import annotations

import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from types import ModuleType
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flows.clusters.fork_server import WORKER_START
from flows.clusters.scaling import Pool, Scaler, sbatch_error
from pipeline.config import Config
from pipeline.config.cluster import SlurmCluster, SlurmGpuPool, SlurmPool, slurm_memory
from pipeline.corpus.storage import Corpus
from pipeline.errors import SetupError
from pipeline.media.decode_pool import DECODE_WORKERS_ENV
from pipeline.setup import require_package

GPU_WORKER_START = "flows.gpu_worker_start"
# Seconds before the walltime at which a worker retires (a tenth of it at most), and the spread
# of those retirements, so that a pool's jobs do not all go at once.
RETIRE_BEFORE_S = 300
STAGGER_S = 60
# A worker whose scheduler is gone (the build was killed outright) exits after this long.
DEATH_TIMEOUT_S = 60


def _jobqueue() -> ModuleType:
    """dask_jobqueue's SLURM module, imported without the SIGINT handler that its runner module
    sets as it is imported (``sys.exit()``: a build's Ctrl-C would end it with exit 0 and no
    clean-up, and outside the main thread the import would fail)."""
    if "dask_jobqueue.slurm" not in sys.modules:
        install = signal.signal
        signal.signal = lambda signum, handler: signal.getsignal(signum)
        try:
            import dask_jobqueue.slurm  # noqa: F401
        finally:
            signal.signal = install
    return sys.modules["dask_jobqueue.slurm"]


def job_name(cfg: Config, pool: str) -> str:
    return f"vlcorpus-{cfg.name}-{pool}"


def log_dir(spec: SlurmCluster, root: str) -> Path:
    """Where the jobs' logs go: the config's ``log_dir``, else logs/slurm under a local root
    (beside the build's own log), else vlcorpus-logs/slurm here."""
    if spec.log_dir:
        return Path(spec.log_dir).expanduser()
    corpus = Corpus(root)
    return Path(corpus.local_path("logs", "slurm")) if corpus.is_local else Path("vlcorpus-logs/slurm").resolve()


def check(spec: SlurmCluster, cfg: Config, root: str) -> None:
    """That SLURM would take each pool's job, before the build writes anything: SetupError with
    SLURM's own words otherwise."""
    if shutil.which("sbatch") is None:
        raise SetupError("execution.cluster is slurm, but there is no sbatch on the PATH: run the "
                         "build on a SLURM login node (or `module load slurm` first)")
    try:
        _jobqueue()
    except ImportError:
        require_package("dask_jobqueue", "execution.cluster kind slurm", extra="slurm")
    # The job class makes its log folder: a scratch one, so that nothing is written under the
    # root before the build starts.
    with tempfile.TemporaryDirectory(prefix="vlcorpus-test-only-") as scratch:
        for pool, script in job_scripts(spec, cfg, root, Path(scratch)).items():
            path = Path(scratch) / f"{pool}.sh"
            path.write_text(script)
            done = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True)
            if done.returncode != 0:
                raise SetupError(f"SLURM refuses the {pool} pool's jobs: {sbatch_error(done.stderr or done.stdout)}")


def job_scripts(spec: SlurmCluster, cfg: Config, root: str, logs: Path | None = None) -> dict[str, str]:
    """Each pool's job script as it would be submitted, with a placeholder scheduler (and its
    logs in ``logs`` instead of the cluster's folder)."""
    scripts = {}
    for pool in pools(spec, cfg, root, {}, None):
        options = {**pool.spec["options"], **({"log_directory": str(logs)} if logs else {})}
        scripts[pool.name] = _jobqueue().SLURMJob("tcp://scheduler:8786", name=f"{pool.name}-0", **options).job_script()
    return scripts


def pools(spec: SlurmCluster, cfg: Config, root: str, env: dict[str, str], security: Any) -> list[Pool]:
    """The CPU pool and, with a ``gpu`` section, the GPU pool: their job classes' options."""
    job = _jobqueue().SLURMJob
    logs = log_dir(spec, root)
    threads = cfg.execution.threads_per_worker
    out = [Pool("cpu", _spec(job, _job_options(spec, spec.cpu, cfg, "cpu", logs, env, security,
                                                threads, ["--resources", f"CPU={threads}"],
                                                preload=WORKER_START)),
                job_name(cfg, "cpu"), slots=spec.cpu.processes * threads, max_jobs=spec.cpu.max_jobs,
                idle_s=spec.idle_s, gpu=False, log_dir=logs)]
    if spec.gpu is not None:
        per_worker = max(1, spec.gpu.cores // spec.gpu.processes)
        options = _job_options(spec, spec.gpu, cfg, "gpu", logs, {**env, DECODE_WORKERS_ENV: str(per_worker)},
                               security, 1, ["--resources", "GPU=1"], preload=GPU_WORKER_START)
        options["job_extra_directives"] = [_gpu_request(spec.gpu), *options["job_extra_directives"]]
        out.append(Pool("gpu", _spec(job, options), job_name(cfg, "gpu"), slots=spec.gpu.processes,
                        max_jobs=spec.gpu.max_jobs, idle_s=0.0, gpu=True, log_dir=logs))
    return out


def _spec(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    spec = {"cls": cls, "options": options}
    if options["processes"] > 1:  # the workers of one job are named <job>-0, <job>-1, ...
        spec["group"] = [f"-{i}" for i in range(options["processes"])]
    return spec


def _gpu_request(pool: SlurmGpuPool) -> str:
    kind = f"{pool.gpu_type}:" if pool.gpu_type else ""
    return f"--gres=gpu:{kind}{pool.processes}" if pool.gpu_option == "gres" else f"--gpus={kind}{pool.processes}"


def _job_options(spec: SlurmCluster, pool: SlurmPool, cfg: Config, name: str, logs: Path,
                 env: dict[str, str], security: Any, threads: int, worker_args: list[str],
                 preload: str) -> dict[str, Any]:
    walltime = pool.walltime or spec.walltime
    lifetime = max(60, _seconds(walltime) - min(RETIRE_BEFORE_S, _seconds(walltime) // 10))
    qos = pool.qos or spec.qos
    directives = [*([f"--qos={qos}"] if qos else []), *pool.extra_directives]
    return {
        # Dask's cores are the job's threads (processes x threads each); SLURM's, the CPUs the
        # job asks for, which its stages' own processes (ffmpeg, decoding) use too.
        "cores": pool.processes * threads, "job_cpu": pool.cores,
        "memory": pool.memory, "job_mem": slurm_memory(pool.memory),
        # One worker a job needs no nanny: its start (a second interpreter importing Dask) is
        # time a GPU is held without work, and SLURM ends a job whose worker dies.
        "processes": pool.processes, "nanny": pool.processes > 1,
        "queue": pool.partition or spec.partition, "account": spec.account,
        "walltime": walltime, "job_name": job_name(cfg, name), "log_directory": str(logs),
        "python": spec.python or sys.executable, "interface": spec.interface,
        "protocol": "tls://" if security is not None else None, "security": security,
        "death_timeout": DEATH_TIMEOUT_S,
        "job_extra_directives": directives,
        # What the job runs before its workers: the user's prologue, then the build's own
        # settings (the Prefect server's address and auth), whatever sbatch's --export.
        "job_script_prologue": [*spec.prologue, *(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))],
        "worker_extra_args": [*worker_args, "--preload", preload,
                              "--lifetime", f"{lifetime}s", "--lifetime-stagger", f"{STAGGER_S}s"],
    }


def _seconds(walltime: str) -> int:
    """SLURM's walltime formats in seconds: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    days, _, clock = walltime.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, *parts
    else:
        hours, minutes, seconds = parts
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


@contextmanager
def slurm_cluster(spec: SlurmCluster, cfg: Config, root: str, env: dict[str, str]) -> Iterator[Any]:
    """The build's scheduler, here, and its pools of jobs, scaled while the block runs; yields
    the Scaler (``.cluster.scheduler_address``, ``.status()``, ``.failure``). Every job is
    cancelled when the block ends."""
    import dask

    security = scheduler_security(spec.tls) if spec.tls else None
    chosen = pools(spec, cfg, root, {**env, **_worker_tls_env(spec.tls)}, security)
    scheduler = {"dashboard_address": None, **({} if spec.interface else {"host": listen_host(spec)})}
    # The cluster's own job options are the CPU pool's; the pools' specs replace them.
    options = {k: v for k, v in chosen[0].spec["options"].items() if k not in ("interface", "protocol", "security")}
    with dask.config.set(_client_tls(spec.tls)):
        cluster = _jobqueue().SLURMCluster(n_workers=0, name=f"vlcorpus-{cfg.name}", scheduler_options=scheduler,
                               interface=spec.interface, security=security, **options)
        scaler = Scaler(cluster, chosen)
        try:
            cluster.loop.add_callback(scaler.start)
            yield scaler
        finally:
            cluster.sync(scaler.stop)
            cluster.close()


def listen_host(spec: SlurmCluster) -> str:
    """The address the scheduler and the build's Prefect server listen on: the config's host,
    its interface's IPv4 address, or this machine's as its host name resolves (how compute nodes
    reach a login node); never every interface."""
    if spec.host:
        return spec.host
    if spec.interface:
        import psutil

        for address in psutil.net_if_addrs().get(spec.interface, []):
            if address.family == socket.AF_INET:
                return address.address
        raise SetupError(f"execution.cluster.interface: this machine has no IPv4 address on {spec.interface!r}")
    return socket.gethostbyname(socket.gethostname())


def _certificates(folder: str) -> Path:
    base = Path(folder).expanduser()
    if not (base / "ca.pem").exists():
        raise SetupError(f"execution.cluster.tls: no certificates in {base} (run `make secrets`)")
    return base


def scheduler_security(folder: str) -> Any:
    """The cluster's TLS from the certificates of ``folder`` (``make secrets``): the scheduler's,
    the workers' for their command line, and the client's for the cluster's own connection to
    its scheduler."""
    from distributed.security import Security

    base = _certificates(folder)
    return Security(tls_ca_file=str(base / "ca.pem"), require_encryption=True,
                    tls_scheduler_cert=str(base / "scheduler.pem"), tls_scheduler_key=str(base / "scheduler-key.pem"),
                    tls_worker_cert=str(base / "worker.pem"), tls_worker_key=str(base / "worker-key.pem"),
                    tls_client_cert=str(base / "client.pem"), tls_client_key=str(base / "client-key.pem"))


def _worker_tls_env(folder: str | None) -> dict[str, str]:
    """A worker is a client too (the limits' semaphores, a task's own client): it shows the
    worker's certificate, as infra/tls/worker.env says."""
    if not folder:
        return {}
    base = _certificates(folder)
    prefix = "DASK_DISTRIBUTED__COMM__"
    return {f"{prefix}REQUIRE_ENCRYPTION": "True", f"{prefix}TLS__CA_FILE": str(base / "ca.pem"),
            f"{prefix}TLS__CLIENT__CERT": str(base / "worker.pem"),
            f"{prefix}TLS__CLIENT__KEY": str(base / "worker-key.pem")}


def _client_tls(folder: str | None) -> dict[str, Any]:
    """The build's own Dask clients (Prefect's task runner, the flow's limits) over TLS with the
    client's certificate."""
    if not folder:
        return {}
    base = _certificates(folder)
    return {"distributed.comm.require-encryption": True, "distributed.comm.tls.ca-file": str(base / "ca.pem"),
            "distributed.comm.tls.client.cert": str(base / "client.pem"),
            "distributed.comm.tls.client.key": str(base / "client-key.pem")}
