"""How stages run: the `execution` section."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.config.problems import raise_if

class ExecutionConfig(BaseModel):
    """How stages run: batching, retries, the Dask cluster, logging."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(16, ge=1, description="items per committed batch")
    retries: int = Field(3, ge=0, description="extra attempts for transient errors")
    retry_backoff_s: float = Field(1.0, ge=0)
    retry_backoff_max_s: float = Field(60.0, ge=0)
    dask_address: str | None = Field(None, description="None: start a local cluster")
    n_workers: int | None = Field(None, ge=1)
    threads_per_worker: int = Field(1, ge=1)
    gpu_resource: bool = Field(False, description="featurize tasks ask Dask for the resource GPU=1")
    log_format: Literal["rich", "json"] = "rich"

    @model_validator(mode="after")
    def _backoff_range(self) -> "ExecutionConfig":
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise_if([(("retry_backoff_max_s",), f"less than retry_backoff_s "
                        f"({self.retry_backoff_max_s} < {self.retry_backoff_s})")])
        return self
