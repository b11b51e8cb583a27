"""How stages run: the `execution` section."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.config.cluster import Cluster, LocalCluster
from pipeline.config.problems import raise_if
from pipeline.corpus.partitions import MAX_PARTITIONS


class ExecutionConfig(BaseModel):
    """How stages run: batching, retries, the Dask cluster, logging."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(16, ge=1, description="items per committed batch")
    retries: int = Field(3, ge=0, description="extra attempts for transient errors")
    retry_backoff_s: float = Field(1.0, ge=0)
    retry_backoff_max_s: float = Field(60.0, ge=0)
    cluster: Cluster = Field(
        default_factory=LocalCluster,
        description="where the workers come from: kind local (this machine, the default), "
                    "address (a running scheduler) or slurm (jobs submitted as the work needs them)")
    dask_address: str | None = Field(None, description="a running scheduler: the same as cluster "
                                                       "kind address; None: the cluster section")
    n_workers: int | None = Field(None, ge=1, description="CPU workers of the local cluster")
    threads_per_worker: int = Field(1, ge=1, description="threads of each local worker")
    stall_s: float | None = Field(
        900.0, gt=0,
        description="seconds a batch may go without progress (an item done, an ASR segment, a "
                    "download's progress) before it counts as stalled: its stacks go to the log, "
                    "its items fail as internal (the next run retries them) and the stage stops "
                    "for this run. Longer than the slowest honest step (a model's first download, "
                    "an ffmpeg merge of a long video); null: never")
    gpu_resource: bool = Field(
        False, description="the GPU stages' tasks (featurize, and transcribe with faster-whisper on a GPU) "
                           "ask Dask for the resource GPU=1 whatever the cluster offers when the build "
                           "starts (GPU workers still to come: a Kubernetes GPU group scaled from zero); "
                           "false: where a worker offers GPU=1")
    log_format: Literal["rich", "json"] = "rich"
    partitions: int | None = Field(
        None, ge=1, le=MAX_PARTITIONS,
        description="videos are hashed into this many partitions; fixed at a corpus's first "
                    "build and recorded in its root. None: chosen from the number of videos "
                    "first discovered (about 1000 videos each at scale, up to 8 for small corpora)")
    pipelined: bool = Field(
        True, description="run partition by partition (download -> ... -> shard as a chain per "
                          "partition, several partitions at once); false: each stage over the "
                          "whole corpus before the next")
    max_inflight_partitions: int = Field(
        4, ge=1, description="partitions between download and shard at once: bounds the media "
                             "on disk when storage.keep_media is false, and the parallelism")

    @model_validator(mode="after")
    def _backoff_range(self) -> "ExecutionConfig":
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise_if([(("retry_backoff_max_s",), f"less than retry_backoff_s "
                        f"({self.retry_backoff_max_s} < {self.retry_backoff_s})")])
        if self.dask_address is not None and self.cluster.kind != "local":
            raise_if([(("dask_address",), f"the cluster section names one already (kind "
                        f"{self.cluster.kind}): give one of the two")])
        return self
