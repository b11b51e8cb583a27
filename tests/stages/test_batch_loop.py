"""The featurize batch loop never makes the model wait on the host: each batch is queued as soon
as it is assembled, and a batch's results are read only after the next batch is queued; the
features are those of one batch at a time, in order."""

from __future__ import annotations

import numpy as np
import pytest

# The extractors are torch modules; the Python 3.12 run (make test-py312) has no torch.
torch = pytest.importorskip("torch")

from pipeline.config import ExtractorConfig, FeaturesConfig, FramesConfig  # noqa: E402
from pipeline.features import build_extractor  # noqa: E402


@pytest.fixture
def extractor():
    torch.manual_seed(0)
    return build_extractor(ExtractorConfig(name="resnet34", weights="none", fps=1, frames=2),
                           FramesConfig(short_side=64, crop=56), FeaturesConfig(device="cpu"))


def _batches(extractor, sizes: list[list[int]]) -> list[list[torch.Tensor]]:
    rng = np.random.default_rng(0)
    return [[extractor.prepare(rng.integers(0, 256, (t, 72, 96, 3), dtype=np.uint8)) for t in batch]
            for batch in sizes]


def test_a_batch_is_read_only_after_the_next_is_queued(extractor, monkeypatch):
    events: list[str] = []
    launch, collect = extractor._launch, extractor._collect

    def spy_launch(staged):
        events.append(f"queue {len(events)}")
        return launch(staged)

    def spy_collect(launched):
        events.append("read")
        return collect(launched)

    monkeypatch.setattr(extractor, "_launch", spy_launch)
    monkeypatch.setattr(extractor, "_collect", spy_collect)
    batches = _batches(extractor, [[2, 2], [1, 2, 2], [2]])
    consumed = []
    for results in extractor.run_batches(iter(batches)):
        consumed.append(len(results))
    assert [e.split()[0] for e in events] == ["queue", "queue", "read", "queue", "read", "read"]
    assert consumed == [2, 3, 1]


def test_the_loop_gives_each_batchs_features_in_order(extractor):
    batches = _batches(extractor, [[2, 1], [2, 2, 1], [1]])
    looped = list(extractor.run_batches(iter(batches)))
    one_by_one = [extractor.run(batch) for batch in batches]
    assert [len(b) for b in looped] == [len(b) for b in one_by_one] == [2, 3, 1]
    for got, want in zip(looped, one_by_one):
        for g, w in zip(got, want):
            assert g.dtype == torch.float32 and g.device.type == "cpu"
            torch.testing.assert_close(g, w)
