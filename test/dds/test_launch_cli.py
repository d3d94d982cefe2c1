# SPDX-License-Identifier: Apache-2.0
"""
``ros2 launch`` / ``ros2 pkg`` as a user types them: arguments, failures, the lifecycle variant.

The package is found through the ament index (the prefix ``make install`` registers, here a
temporary one for this checkout). Undeclared launch arguments and a node that fails at start
make ``ros2 launch`` exit non-zero; ``lifecycle:=true`` starts the managed node.
"""

from __future__ import annotations

import os
from pathlib import Path
import signal
import subprocess

from launch_setup import require_launch_tools

require_launch_tools()

from launch_setup import ament_env, ros2_command  # noqa: E402
import pytest  # noqa: E402
from ros_harness import DEFAULT_CONFIG, next_domain_id, ros_env  # noqa: E402
import yaml  # noqa: E402

from vla_policy_node.ament_registration import EXECUTABLES  # noqa: E402

LAUNCH = ['launch', 'vla_policy_node', 'vla_policy.launch.py']
pytestmark = pytest.mark.dds


@pytest.fixture(scope='module')
def env(tmp_path_factory) -> dict[str, str]:
    """Give a domain of its own and this checkout registered in a temporary ament prefix."""
    prefix = tmp_path_factory.mktemp('ament') / 'prefix'
    return {**ros_env(next_domain_id()), **ament_env(prefix), 'RCUTILS_LOGGING_USE_STDOUT': '1'}


def ros2(env: dict[str, str], *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run a ros2 command to its end, output merged."""
    return subprocess.run([ros2_command(), *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def test_the_registered_prefix_serves_ros2_pkg(env):
    prefix = env['AMENT_PREFIX_PATH'].split(':')[0]
    assert ros2(env, 'pkg', 'prefix', 'vla_policy_node').stdout.strip() == prefix
    listed = ros2(env, 'pkg', 'executables', 'vla_policy_node').stdout.split('\n')
    assert {f'vla_policy_node {name}' for name in EXECUTABLES} <= set(listed)
    share = Path(prefix, 'share', 'vla_policy_node')
    assert (share / 'launch' / 'vla_policy.launch.py').is_file()
    assert (share / 'config' / 'default.yaml').is_file()


def test_show_args_lists_every_argument(env):
    out = ros2(env, *LAUNCH, '--show-args').stdout
    for name in ('config_file', 'namespace', 'lifecycle', 'checkpoint', 'device', 'use_sim_time'):
        assert f"'{name}'" in out, out


def test_an_undeclared_argument_is_an_error(env):
    result = ros2(env, *LAUNCH, 'checkpont:=/models/smolvla')
    assert result.returncode != 0
    assert "unknown launch arguments ['checkpont']" in result.stdout, result.stdout
    assert 'process started' not in result.stdout, 'the node started despite the typo'


def test_a_boolean_argument_must_be_true_or_false(env):
    result = ros2(env, *LAUNCH, 'use_sim_time:=maybe')
    assert result.returncode != 0 and 'must be true or false' in result.stdout, result.stdout


def test_a_node_that_fails_at_start_fails_the_launch(env, tmp_path):
    """... and the override's parameter file does not stay in the temp folder (launch_ros's would)."""
    temp = tmp_path / 'temp'
    temp.mkdir()
    result = ros2({**env, 'TMPDIR': str(temp)}, *LAUNCH, f'checkpoint:={tmp_path / "missing"}', timeout=120.0)
    assert 'cannot start' in result.stdout and 'does not exist' in result.stdout, result.stdout
    assert result.returncode != 0, result.stdout
    assert not list(temp.iterdir()), 'a parameter file of the launch was left in the temp folder'


def test_a_config_file_that_is_not_there_is_named(env, tmp_path):
    result = ros2(env, *LAUNCH, f'config_file:={tmp_path / "nope.yaml"}')
    assert result.returncode != 0
    assert f"config_file '{tmp_path / 'nope.yaml'}' is not a file" in result.stdout, result.stdout
    assert 'process started' not in result.stdout


def test_lifecycle_argument_starts_the_managed_node(env, tmp_path):
    document = yaml.safe_load(DEFAULT_CONFIG.read_text())
    document['/**']['ros__parameters']['allow_random_weights'] = True
    config = tmp_path / 'plumbing.yaml'
    config.write_text(yaml.safe_dump(document))
    process = subprocess.Popen(
        [ros2_command(), *LAUNCH, 'lifecycle:=true', 'namespace:=lc2', f'config_file:={config}'],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if 'unconfigured: configure loads' in line:
                break
        assert process.poll() is None, ''.join(lines)
        state = ros2(env, 'lifecycle', 'get', '--no-daemon', '--spin-time', '5',
                     '/lc2/vla_policy_node')
        assert state.stdout.startswith('unconfigured'), state.stdout
    finally:
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=30)
    assert process.returncode == 0, ''.join(lines) + out


PARENT = '''
from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, GroupAction, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource


def generate_launch_description():
    child = get_package_share_directory('vla_policy_node') + '/launch/vla_policy.launch.py'
    include = IncludeLaunchDescription(PythonLaunchDescriptionSource(child), launch_arguments={
        'namespace': 'robot1', 'checkpoint': '{checkpoint}'}.items())
    return LaunchDescription([
        DeclareLaunchArgument('robots', default_value='1'),
        GroupAction([include], scoped=True, forwarding=False),
    ])
'''


def test_an_include_in_its_own_scope_passes_only_its_arguments(env, tmp_path):
    parent = tmp_path / 'fleet.launch.py'
    parent.write_text(PARENT.replace('{checkpoint}', str(tmp_path / 'missing')))
    result = ros2(env, 'launch', str(parent), 'robots:=2', timeout=120.0)
    assert 'unknown launch arguments' not in result.stdout, result.stdout
    assert 'cannot start: could not load the policy' in result.stdout, result.stdout
    assert '-r __ns:=/robot1' in result.stdout, result.stdout
    assert result.returncode != 0


def test_the_sim_demo_launch_ends_with_its_episodes(env, tmp_path):
    launch = subprocess.Popen([ros2_command(), 'launch', 'vla_policy_node', 'sim_demo.launch.py', 'episodes:=1'],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        output, _ = launch.communicate(timeout=120.0)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)        # the launch and both of its processes
        output, _ = launch.communicate()
        pytest.fail(f'the launch did not end after its episode:\n{output}')
    assert launch.returncode == 0, output
    assert 'success rate: 1/1' in output, output
