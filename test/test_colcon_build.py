"""colcon sees an ament_python package and installs the share folder and executables."""

from pathlib import Path
import shutil
import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parents[1]
COLCON = [sys.executable, '-m', 'colcon']


def test_colcon_list_shows_ros_ament_python():
    out = subprocess.run(COLCON + ['list', '--base-paths', str(ROOT)], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    assert 'vla_policy_node' in out and '(ros.ament_python)' in out, out


@pytest.mark.slow
def test_colcon_build_installs_share_folder(tmp_path: Path):
    source = tmp_path / 'src' / 'vla_policy_node'
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        '.venv*', '.git', 'build', 'install', 'log', '__pycache__', '*.egg-info', '.pytest_cache',
        '.hypothesis'))
    result = subprocess.run(
        COLCON + ['build', '--base-paths', 'src', '--event-handlers', 'console_cohesion-'],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    share = tmp_path / 'install' / 'vla_policy_node' / 'share' / 'vla_policy_node'
    for name in ('package.xml', 'launch/vla_policy.launch.py', 'config/default.yaml',
                 'config/demo.yaml', 'config/fastdds_shm.xml'):
        assert (share / name).is_file(), name
    index = tmp_path / 'install' / 'vla_policy_node' / 'share' / 'ament_index'
    assert (index / 'resource_index' / 'packages' / 'vla_policy_node').is_file()
    lib = tmp_path / 'install' / 'vla_policy_node' / 'lib' / 'vla_policy_node'
    assert (lib / 'vla_policy_node').is_file() and (lib / 'vla_policy_sim_robot').is_file()
