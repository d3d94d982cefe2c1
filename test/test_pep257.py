"""ament_pep257 over the package's ROS layer and the files written to its conventions."""

from pathlib import Path

from ament_pep257.main import main
import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ['vla_policy_node/ros', 'vla_policy_node/core/safety.py', 'launch', 'setup.py']


@pytest.mark.linter
@pytest.mark.pep257
def test_pep257():
    rc = main(argv=[str(ROOT / path) for path in PATHS])
    assert rc == 0, 'Found code style errors / warnings'
