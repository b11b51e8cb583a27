from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def memory_root() -> str:
    """A fresh in-memory corpus root (fsspec ``memory://``)."""
    return f"memory://vlc-{uuid.uuid4().hex}"


def require_binaries(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install -y ffmpeg espeak-ng)")


@pytest.fixture(scope="session")
def prefect_harness():
    """Prefect's temporary local server, once per test session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
