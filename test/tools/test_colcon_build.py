# SPDX-License-Identifier: Apache-2.0
"""
colcon builds and tests the package as a ROS 2 workspace would.

colcon sees an ament_python package and installs the share folder and executables, and
``colcon test`` runs the tests against the installed executables.
"""

import os
from pathlib import Path
import shutil
import subprocess
import sys

import pytest
from ros_harness import installed_executable

ROOT = Path(__file__).resolve().parents[2]
COLCON = [sys.executable, '-m', 'colcon']
# The colcon test below runs one of the node's DDS tests.
pytestmark = pytest.mark.dds


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
                 'config/demo.yaml', 'config/so101.yaml', 'config/planar.yaml', 'config/fastdds_shm.xml'):
        assert (share / name).is_file(), name
    # The SO-101's model and policy are package data, installed beside the module.
    so101 = list((tmp_path / 'install' / 'vla_policy_node').glob('lib/python*/site-packages/vla_policy_node/sim/so101'))
    assert so101, 'vla_policy_node.sim.so101 was not installed'
    for name in ('assets/touch_scene.xml', 'assets/so101_new_calib.xml', 'assets/meshes/base_so101_v2.stl',
                 'assets/LICENSE', 'touch_policy/config.json', 'touch_policy/model.safetensors'):
        assert (so101[0] / name).is_file(), name
    planar = so101[0].parent / 'planar'          # the planar test arm's policy, the same way
    for name in ('touch_policy/config.json', 'touch_policy/model.safetensors', 'touch_policy/vlm/tokenizer.json'):
        assert (planar / name).is_file(), name
    index = tmp_path / 'install' / 'vla_policy_node' / 'share' / 'ament_index'
    assert (index / 'resource_index' / 'packages' / 'vla_policy_node').is_file()
    lib = tmp_path / 'install' / 'vla_policy_node' / 'lib' / 'vla_policy_node'
    for name in ('vla_policy_node', 'vla_policy_lifecycle_node', 'vla_policy_sim_robot'):
        assert (lib / name).is_file(), name
    assert (tmp_path / 'install' / 'vla_policy_node' / 'share' / 'doc' / 'vla_policy_node' /
            'LICENSE').is_file()
    # The user's commands are on PATH once the workspace is sourced (issue 33, item 6), the ROS
    # executables stay in lib/ for ros2 run.
    shell = subprocess.run(['bash', '-c', 'source install/setup.bash && command -v vla-policy-replay vla_policy_node; '
                            'vla-policy-replay --help'], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    bin_dir = tmp_path / 'install' / 'vla_policy_node' / 'bin'
    assert shell.stdout.split('\n')[0] == str(bin_dir / 'vla-policy-replay'), shell.stdout + shell.stderr
    assert 'usage: vla-policy-replay' in shell.stdout, shell.stdout + shell.stderr
    assert sorted(path.name for path in bin_dir.iterdir()) == [
        'vla-policy-bench', 'vla-policy-record', 'vla-policy-replay', 'vla-policy-sim-eval', 'vla-policy-train']
    # colcon test: a test that starts the node finds the executable colcon installed (its
    # harness looks in the ament index first); the package's own checkout is not importable.
    env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
    result = subprocess.run(
        COLCON + ['test', '--base-paths', 'src', '--event-handlers', 'console_direct+',
                  '--pytest-args', 'test/ros/test_params.py', '-k',
                  'test_node_exits_1_with_the_reason_on_a_bad_params_file and control_rate'],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0 and '1 passed' in result.stdout, result.stdout + result.stderr
    results = subprocess.run(COLCON + ['test-result', '--all'], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert results.returncode == 0 and '0 errors, 0 failures' in results.stdout, results.stdout


@pytest.mark.slow
def test_colcon_builds_the_interface_package_the_node_serves(tmp_path: Path):
    """vla_policy_interfaces (action, server messages), inside the package's folder, as the README's workspace does."""
    source = tmp_path / 'src' / 'vla_policy_node'
    shutil.copytree(ROOT / 'interfaces', source / 'interfaces')
    venv = Path(sys.prefix)
    prefixes = os.pathsep.join(filter(None, [str(venv), os.environ.get('AMENT_PREFIX_PATH')]))
    env = {**os.environ, 'AMENT_PREFIX_PATH': prefixes, 'CMAKE_PREFIX_PATH': str(venv),
           'PATH': f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        COLCON + ['build', '--base-paths', 'src', 'src/vla_policy_node/interfaces', '--event-handlers',
                  'console_cohesion-', '--cmake-args', f'-DPython3_EXECUTABLE={sys.executable}', '-DBUILD_TESTING=OFF'],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    install = tmp_path / 'install' / 'vla_policy_interfaces'
    share = install / 'share' / 'vla_policy_interfaces'
    for name in ('action/RunInstruction.action', 'msg/PolicyRequest.msg', 'msg/ActionChunk.msg'):
        assert (share / name).is_file(), name
    shell = subprocess.run(['bash', '-c', 'source install/setup.bash && python -c "import vla_policy_interfaces.action '
                            'as a; import vla_policy_interfaces.msg as m; print(a.__file__); '
                            'print(a.RunInstruction.Result.PREEMPTED, m.PolicyRequest.VERSION)"'],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    from vla_policy_interfaces.action import RunInstruction
    from vla_policy_interfaces.msg import PolicyRequest
    expected = [str(RunInstruction.Result.PREEMPTED), str(PolicyRequest.VERSION)]     # as make setup built them
    assert shell.stdout.startswith(str(install)) and shell.stdout.split()[-2:] == expected, \
        shell.stdout + shell.stderr


def test_installed_executable_prefers_the_ament_index(tmp_path: Path, monkeypatch):
    lib = tmp_path / 'lib' / 'vla_policy_node'
    lib.mkdir(parents=True)
    (lib / 'vla_policy_node').write_text('#!/bin/sh\n')
    monkeypatch.setenv('AMENT_PREFIX_PATH', str(tmp_path))
    assert installed_executable() == Path(sys.executable).parent / 'vla_policy_node', \
        'a prefix without the package marker was used'
    marker = tmp_path / 'share' / 'ament_index' / 'resource_index' / 'packages'
    marker.mkdir(parents=True)
    (marker / 'vla_policy_node').touch()
    assert installed_executable() == lib / 'vla_policy_node'
