"""Where a build's Dask workers come from: the ``execution.cluster`` section.

The same corpus config runs on a laptop, a GPU box, SLURM and an existing scheduler, changing
only this section; flows/clusters/ starts (or reaches) what it names.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.config.problems import raise_if

# A size as SLURM and Dask both read it: "32GB", "512MB", "64G".
_MEMORY = r"^\d+(\.\d+)?\s*([KMGT]i?B?)$"
# SLURM's time formats: "minutes", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS".
_WALLTIME = r"^(\d+-)?\d+(:\d{2}){0,2}$"


class LocalCluster(BaseModel):
    """Workers forked on this machine (the default): ``execution.n_workers`` CPU workers of
    ``execution.threads_per_worker`` threads, and one worker per GPU that sees it alone."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["local"] = "local"


class AddressCluster(BaseModel):
    """A Dask scheduler that is already running, with its workers (a cluster you started, the
    Dask operator's on Kubernetes). GPU workers offer the resource GPU=1 (`dask worker
    --resources GPU=1`)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["address"]
    address: str = Field(pattern=r"^(tcp|tls|ucx|inproc)://", description="the scheduler, e.g. tls://host:8786")


class SlurmPool(BaseModel):
    """One kind of SLURM job: each job runs ``processes`` Dask workers sharing its cores and
    memory. Jobs are submitted as the build's tasks need them, up to ``max_jobs``, and
    cancelled when idle."""

    model_config = ConfigDict(extra="forbid")
    cores: int = Field(ge=1, description="CPUs a job asks for (--cpus-per-task)")
    memory: str = Field(pattern=_MEMORY, description="memory a job asks for, e.g. 32GB (--mem)")
    processes: int = Field(1, ge=1, description="Dask workers a job runs; in the GPU pool, one per GPU")
    max_jobs: int = Field(ge=1, description="jobs of this pool at once, pending ones included")
    partition: str | None = Field(None, description="overrides the cluster's partition (-p)")
    qos: str | None = Field(None, description="overrides the cluster's QOS (--qos)")
    walltime: str | None = Field(None, pattern=_WALLTIME, description="overrides the cluster's walltime (-t)")
    extra_directives: list[str] = Field(
        default_factory=list, description="more #SBATCH options, each as on sbatch's command "
                                          "line (e.g. --constraint=a100, --exclusive)")


class SlurmGpuPool(SlurmPool):
    """The GPU jobs: each asks for ``processes`` GPUs, and each of its workers offers the Dask
    resource GPU=1 and sees its own GPU alone (CUDA_VISIBLE_DEVICES). GPU jobs exist only
    while the stages whose models run on a GPU (featurize, faster-whisper) have tasks."""

    gpu_type: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$",
                                 description="a GRES type, e.g. a100: --gres=gpu:a100:N")
    gpu_option: Literal["gres", "gpus"] = Field(
        "gres", description="how a job asks for its GPUs: --gres=gpu:N or --gpus=N")


class SlurmCluster(BaseModel):
    """Workers as SLURM jobs, submitted with sbatch from the machine the build runs on (a login
    node): a CPU pool for download, transcribe from subtitles, align and shard (and the
    corpus-wide steps), and a GPU pool for the stages whose models run on a GPU. The build's
    scheduler and Prefect server run in its own process, which runs no stage."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["slurm"]
    partition: str | None = Field(None, description="-p; none: the cluster's default partition")
    account: str | None = Field(None, description="-A")
    qos: str | None = Field(None, description="--qos")
    walltime: str = Field("04:00:00", pattern=_WALLTIME,
                          description="-t of every job; its workers retire before it ends "
                                      "and hand their work on")
    prologue: list[str] = Field(
        default_factory=list,
        description="shell lines each job runs before its workers start (module load, source a "
                    "venv's activate, conda activate)")
    python: str | None = Field(
        None, description="the Python the workers run, with vlcorpus installed; none: this "
                          "build's own interpreter (a path the compute nodes share)")
    log_dir: str | None = Field(
        None, description="where the jobs' logs go (a folder the compute nodes share); none: "
                          "logs/slurm under a local root, vlcorpus-logs/slurm otherwise")
    host: str | None = Field(
        None, description="the address the scheduler and the build's Prefect server listen on; "
                          "none: this machine's host name's address")
    interface: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="the network interface the scheduler, the build's Prefect server and the "
                    "workers listen on (e.g. ib0), instead of host")
    tls: str | None = Field(
        None, description="the folder of certificates `make secrets` made (infra/tls): the "
                          "scheduler and the workers then speak TLS only; none: TCP")
    idle_s: float = Field(
        20.0, ge=0, description="seconds a CPU job may stay idle before it is cancelled (GPU jobs "
                                "go as soon as no GPU work waits)")
    cpu: SlurmPool
    gpu: SlurmGpuPool | None = Field(None, description="none: every stage runs in the CPU pool")

    @model_validator(mode="after")
    def _one_address(self) -> "SlurmCluster":
        if self.host is not None and self.interface is not None:
            raise_if([(("interface",), "give host or interface, not both")])
        return self


Cluster = Annotated[LocalCluster | AddressCluster | SlurmCluster, Field(discriminator="kind")]


def slurm_memory(text: str) -> str:
    """A pool's ``memory`` as sbatch's --mem takes it ("32GB" -> "32G"): what the user wrote,
    where Dask's reading of "GB" as 10^9 bytes would ask SLURM for 30G."""
    number, unit = re.match(r"^(\d+(?:\.\d+)?)\s*([KMGT])", text.upper()).groups()
    return f"{number}{unit}"
