import os

import pytest

# Tests never reach the internet: nothing may be fetched from a real hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture
def workspace(tmp_path):
    """An empty KFP run workspace directory."""
    path = tmp_path / "workspace"
    path.mkdir()
    return path
