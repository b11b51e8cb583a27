from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The training tests' models are tiny: one thread runs them fastest and leaves the other
    core to the rest of the suite (CPU results match at equal thread counts)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
