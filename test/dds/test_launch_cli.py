# SPDX-License-Identifier: Apache-2.0
"""
``ros2 launch`` / ``ros2 pkg`` as a user types them: arguments, failures, the lifecycle variant.

The package is found through the ament index (the prefix ``make install`` registers, here a
temporary one for this checkout). Undeclared launch arguments and a node that fails at start
make ``ros2 launch`` exit non-zero; ``lifecycle:=true`` starts the managed node.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
import re
import signal
import subprocess
import threading

from launch_setup import require_launch_tools

require_launch_tools()

from launch_setup import ament_env, ros2_command  # noqa: E402
import pytest  # noqa: E402
from ros_harness import DEFAULT_CONFIG, installed_executable, next_domain_id, ros_env, wait_until  # noqa: E402
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
    for name in ('config_file', 'params_files', 'namespace', 'lifecycle', 'autostart', 'log_level',
                 'checkpoint', 'device', 'use_sim_time'):
        assert f"'{name}'" in out, out


def test_an_undeclared_argument_is_an_error(env):
    result = ros2(env, *LAUNCH, 'checkpont:=/models/smolvla')
    assert result.returncode != 0
    assert "unknown launch arguments ['checkpont']" in result.stdout, result.stdout
    assert 'process started' not in result.stdout, 'the node started despite the typo'


def test_a_boolean_argument_must_be_true_or_false(env):
    result = ros2(env, *LAUNCH, 'use_sim_time:=maybe')
    assert result.returncode != 0 and 'must be true or false' in result.stdout, result.stdout


def test_autostart_needs_the_lifecycle_node(env):
    result = ros2(env, *LAUNCH, 'autostart:=true')
    assert result.returncode != 0 and 'give lifecycle:=true too' in result.stdout, result.stdout
    assert 'process started' not in result.stdout


def test_a_parameter_file_that_is_not_there_is_named(env):
    result = ros2(env, *LAUNCH, 'params_files:=planar.yaml,nope.yaml')
    assert result.returncode != 0 and "params_files 'nope.yaml' is not a file" in result.stdout, result.stdout


def test_a_node_that_fails_at_start_fails_the_launch(env, tmp_path):
    """... and the override's parameter file does not stay in the temp folder (launch_ros's would)."""
    temp = tmp_path / 'temp'
    temp.mkdir()
    result = ros2({**env, 'TMPDIR': str(temp)}, *LAUNCH, f'checkpoint:={tmp_path / "missing"}', timeout=120.0)
    assert 'cannot start' in result.stdout and 'does not exist' in result.stdout, result.stdout
    assert result.returncode != 0, result.stdout
    assert not list(temp.iterdir()), 'a parameter file of the launch was left in the temp folder'


BAD_PARAMETER_FILES = {
    'an integer for a double': ('control_rate_hz: 20', "must be a double in [1.0, 1000.0]"),
    'an unknown key': ('max_stepp: 0.1', "unknown parameters: ['max_stepp']"),
}


@pytest.mark.parametrize('case', sorted(BAD_PARAMETER_FILES))
@pytest.mark.parametrize('lifecycle', ['false', 'true'])
def test_a_bad_parameter_file_ends_the_launch_with_one_fatal_line(env, tmp_path, case, lifecycle):
    """Once the FATAL line was followed by a 40-line double traceback (a node built only in part, destroyed)."""
    line, said = BAD_PARAMETER_FILES[case]
    bad = tmp_path / 'bad.yaml'
    bad.write_text(f'/**:\n  ros__parameters:\n    {line}\n')
    result = ros2(env, *LAUNCH, f'params_files:={bad}', f'lifecycle:={lifecycle}', timeout=120.0)
    assert result.returncode != 0, result.stdout
    assert result.stdout.count('cannot start') == 1 and said in result.stdout, result.stdout
    assert 'Traceback' not in result.stdout, result.stdout


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


class Launched:
    """A ``ros2 launch`` run in the background, its output read by a thread (a full pipe would stall the node)."""

    def __init__(self, env: dict[str, str], *arguments: str, cwd: Path | None = None) -> None:
        self.process = subprocess.Popen([ros2_command(), *arguments], env=env, cwd=cwd, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()

    def wait_for(self, text: str, timeout: float = 120.0) -> None:
        """Wait until a line holds ``text``; fail with the output if the launch ends first or it does not come."""
        if not wait_until(lambda: any(text in line for line in self.lines) or not self.reader.is_alive(), timeout):
            pytest.fail(f'no {text!r} within {timeout} s:\n' + ''.join(self.lines))
        if not any(text in line for line in self.lines):
            pytest.fail(f'the launch ended before {text!r}:\n' + ''.join(self.lines))

    def stop(self) -> str:
        """Stop the launch with SIGINT, as Ctrl-C; return the whole output."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.reader.join(timeout=10)
        return ''.join(self.lines)


def test_layered_files_follow_the_namespace_at_the_log_level(env, tmp_path):
    """The issue's ``config_file:=planar.yaml namespace:=arm``, with a later file over it and debug logging."""
    from vla_policy_node.sim import PLANAR_CHECKPOINT
    mine = tmp_path / 'mine.yaml'
    mine.write_text(yaml.safe_dump({'/**': {'ros__parameters': {'control_rate_hz': 25.0, 'num_threads': 2}}}))
    launched = Launched(env, *LAUNCH, 'config_file:=planar.yaml', f'params_files:={mine}', 'namespace:=arm',
                        f'checkpoint:={PLANAR_CHECKPOINT}', 'log_level:=debug')
    try:
        launched.wait_for('ready:')
        values = {name: ros2(env, 'param', 'get', '--no-daemon', '--spin-time', '5', '--hide-type',
                             '/arm/vla_policy_node', name).stdout.strip()
                  for name in ('camera_names', 'joint_names', 'control_rate_hz', 'num_threads')}
        info = ros2(env, 'node', 'info', '--no-daemon', '--spin-time', '5', '/arm/vla_policy_node').stdout
        nodes = ros2(env, 'node', 'list', '--no-daemon', '--spin-time', '5').stdout.split()
    finally:
        output = launched.stop()
    # The joint states are polled, not spun, but the subscription is the node's own (issue 33, item 6).
    subscribers = info.split('Subscribers:')[1].split('Publishers:')[0]
    assert '/arm/joint_states: sensor_msgs/msg/JointState' in subscribers, info
    assert nodes == ['/arm/vla_policy_node'], nodes
    assert values == {'camera_names': "['top']", 'joint_names': "['shoulder', 'elbow', 'wrist']",
                      'control_rate_hz': '25.0', 'num_threads': '2'}, output
    assert '[DEBUG]' in output, 'log_level:=debug did not reach the node'
    assert launched.process.returncode == 0, output


def test_autostart_configures_and_activates_the_lifecycle_node(env):
    from vla_policy_node.sim import PLANAR_CHECKPOINT
    launched = Launched(env, *LAUNCH, 'lifecycle:=true', 'autostart:=true', 'namespace:=auto',
                        'params_files:=planar.yaml', f'checkpoint:={PLANAR_CHECKPOINT}', 'log_level:=info')
    try:
        launched.wait_for('active: commanding')
        state = ros2(env, 'lifecycle', 'get', '--no-daemon', '--spin-time', '5', '/auto/vla_policy_node')
    finally:
        output = launched.stop()
    assert state.stdout.startswith('active'), state.stdout + output
    assert launched.process.returncode == 0, output


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
    assert re.search(r'success rate: [01]/1 = ', output), output
    assert re.search(r"episode +1/1: 'touch the (red|green|blue|purple) block'", output), output
    assert 'real-time factor' in output and 'unanswered' not in output, output     # lockstep, every tick answered


def test_the_multi_robot_launch_ends_with_the_combined_success_rate(env, tmp_path):
    launch = subprocess.Popen([ros2_command(), 'launch', 'vla_policy_node', 'multi_robot.launch.py', 'robots:=2',
                               'episodes:=1', 'device:=cpu'],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        output, _ = launch.communicate(timeout=240.0)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)        # the launch and its five processes
        output, _ = launch.communicate()
        pytest.fail(f'the launch did not end after its episodes:\n{output}')
    assert launch.returncode == 0, output
    assert re.search(r'combined success rate: [0-2]/2 = \d+% over 2 robots', output), output


def test_record_true_writes_a_bag_that_vla_policy_replay_replays(env, tmp_path):
    """
    The node drives the simulated arm while the launch records; the bag replays.

    Three episodes: the recorder discovers the arm's publishers some time after the node does, and one episode
    of the shipped policy can be over in a second.
    """
    from vla_policy_node.replay.bag import topic_types
    from vla_policy_node.replay.cli import main as replay_main
    from vla_policy_node.sim import PLANAR_CHECKPOINT
    demo = DEFAULT_CONFIG.parent / 'planar.yaml'
    launched = Launched(env, *LAUNCH, 'config_file:=planar.yaml', f'checkpoint:={PLANAR_CHECKPOINT}', 'record:=true',
                        cwd=tmp_path)
    try:
        launched.wait_for('ready:')
        launched.wait_for('recording [')
        robot = subprocess.run([str(installed_executable('vla_policy_sim_robot')), '--ros-args', '--params-file',
                                str(demo), '-p', 'episodes:=3'], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=120)
    finally:
        output = launched.stop()
    assert robot.returncode == 0 and 'success rate: ' in robot.stdout, robot.stdout
    assert launched.process.returncode == 0, output
    (bag,) = tmp_path.glob('vla_policy_*')
    assert (bag / 'metadata.yaml').is_file() and list(bag.glob('*.mcap')), output
    assert topic_types(bag) == {
        '/camera/top/image_raw': 'sensor_msgs/msg/Image', '/joint_states': 'sensor_msgs/msg/JointState',
        '/instruction': 'std_msgs/msg/String', '/diagnostics': 'diagnostic_msgs/msg/DiagnosticArray',
        '/joint_trajectory_controller/joint_trajectory': 'trajectory_msgs/msg/JointTrajectory',
        '/vla_policy_node/episode': 'vla_policy_interfaces/msg/Episode',
        '/vla_policy_node/command_goals': 'vla_policy_interfaces/msg/CommandGoal'}
    summary = tmp_path / 'replay.json'
    code = replay_main([str(bag), '--params-file', str(DEFAULT_CONFIG), '--params-file', str(demo),
                        '-p', f'checkpoint:={PLANAR_CHECKPOINT}', '--json', str(summary)])
    assert code == 0
    result = json.loads(summary.read_text())
    assert result['chunks'] > 0 and result['recorded_commands'] > 0, result
    assert all(joint['points'] > 0 and math.isfinite(joint['mae']) for joint in result['joints'].values()), result


def test_a_recorder_that_cannot_start_fails_the_launch(env):
    """record:=true in a folder where no bag can be made: the launch ends, failed, instead of running unrecorded."""
    from vla_policy_node.sim import PLANAR_CHECKPOINT
    launched = Launched(env, *LAUNCH, 'config_file:=planar.yaml', f'checkpoint:={PLANAR_CHECKPOINT}', 'record:=true',
                        cwd=Path('/proc'))
    try:
        launched.process.wait(timeout=120)
    finally:
        output = launched.stop()
    assert launched.process.returncode != 0, output
    assert 'vla-policy-record: cannot record' in output and 'exited with code 1' in output, output


def test_two_recording_launches_in_the_same_second_in_one_folder_both_record(env, tmp_path):
    """Two robots (namespaces) launched together with record:=true: a bag each, named apart."""
    from vla_policy_node.sim import PLANAR_CHECKPOINT
    launches = [Launched(env, *LAUNCH, 'config_file:=planar.yaml', f'checkpoint:={PLANAR_CHECKPOINT}', 'record:=true',
                         f'namespace:={namespace}', cwd=tmp_path) for namespace in ('arm1', 'arm2')]
    try:
        for launched in launches:
            launched.wait_for('recording [')
    finally:
        outputs = '\n'.join(launched.stop() for launched in launches)     # a str: pytest would cut a list's repr
    assert [launched.process.returncode for launched in launches] == [0, 0], outputs
    bags = sorted(path.name for path in tmp_path.glob('vla_policy_*'))
    assert [name.split('_')[2] for name in bags] == ['arm1', 'arm2'], bags
    for bag in bags:
        assert (tmp_path / bag / 'metadata.yaml').is_file() and list((tmp_path / bag).glob('*.mcap')), outputs
