"""Shared test setup: the repository on sys.path, the reference fixtures, a quiet torch."""

import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
REFERENCE = Path(os.environ.get("VLA_REFERENCE_DIR", REPO.parent / "shared" / "reference"))

torch.set_num_threads(1)


@pytest.fixture
def reference_dir():
    """Folder of one family's LeRobot reference fixture; skips only when the shared folder is absent."""
    def get(family: str) -> Path:
        folder = REFERENCE / family
        if not folder.is_dir():
            pytest.skip(f"reference fixtures not found at {folder} (set VLA_REFERENCE_DIR)")
        return folder
    return get
