"""What the corpus root keeps: the `storage` section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class StorageConfig(BaseModel):
    """What stays under the root once a partition is done."""

    model_config = ConfigDict(extra="forbid")

    keep_media: bool = Field(
        True, description="false: a partition's media files are deleted once its clips are "
                          "featurized and sharded (the downloads table records it); a stage "
                          "that needs them later downloads them again")
