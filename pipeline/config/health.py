"""What a healthy build is: the `health` section. An unhealthy build commits what it did, then
ends Failed (a Prefect run) or exits 1 (the CLI), so a dead source or a broken stage raises an
alert instead of a quiet Completed."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class HealthConfig(BaseModel):
    """Limits a build must meet to count as healthy; the defaults catch a source that yields
    nothing and a stage that fails most of what it tries."""

    model_config = ConfigDict(extra="forbid")

    min_found_videos: int = Field(
        1, ge=0, description="videos the sources must list (new or known) when discover runs; "
                             "0 allows a build that finds nothing")
    min_new_videos: int = Field(0, ge=0, description="new videos discover must add")
    max_failed_fraction: float | dict[str, float] = Field(
        0.5, description="most of what a stage tried that may fail in one build: one fraction "
                         "for every stage, or per stage name (download, featurize, train, ...; "
                         "others keep 0.5)")
    min_clips: int = Field(0, ge=0, description="clips the corpus must hold after the build")

    def failed_limit(self, stage: str) -> float:
        """The largest failed fraction ``stage`` (or its part, e.g. featurize:resnet34) may have."""
        if isinstance(self.max_failed_fraction, float | int):
            return float(self.max_failed_fraction)
        limits = self.max_failed_fraction
        return float(limits.get(stage, limits.get(stage.split(":", 1)[0], 0.5)))
