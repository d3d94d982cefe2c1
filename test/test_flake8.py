"""ament_flake8 over the package (the ROS 2 configuration: line length 99, import order)."""

from pathlib import Path

from ament_flake8.main import main_with_errors
import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ['vla_policy_node/ros', 'vla_policy_node/core/safety.py', 'launch', 'setup.py',
         'test/test_conversions.py', 'test/test_safety.py', 'test/test_params.py',
         'test/test_node_integration.py', 'test/test_launch.py', 'test/test_colcon_build.py',
         'test/test_flake8.py', 'test/test_pep257.py', 'test/ros_harness.py']


@pytest.mark.flake8
@pytest.mark.linter
def test_flake8():
    rc, errors = main_with_errors(argv=[str(ROOT / path) for path in PATHS])
    assert rc == 0, f'Found {len(errors)} code style errors / warnings:\n' + '\n'.join(errors)
