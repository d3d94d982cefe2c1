# SPDX-License-Identifier: Apache-2.0
"""ament_pep257 (the ROS 2 docstring conventions) over the package, its tests and its launch file."""

from pathlib import Path

from ament_pep257.main import main
import pytest

ROOT = Path(__file__).resolve().parents[2]
PATHS = ['vla_policy_node', 'benchmarks', 'launch', 'setup.py', 'test']


@pytest.mark.linter
@pytest.mark.pep257
def test_pep257():
    rc = main(argv=[str(ROOT / path) for path in PATHS])
    assert rc == 0, 'Found code style errors / warnings'
