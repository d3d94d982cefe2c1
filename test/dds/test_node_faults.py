# SPDX-License-Identifier: Apache-2.0
"""
Fault tests of the installed node (issue 6): inputs that stop, bad parameter files, signals.

One node process (default.yaml) on its own ROS domain (loopback discovery only) is
driven by the integration test's robot probe; the tests run in file order. Each fault must
stop commands (one hold, nothing from stale data), show up in /diagnostics at WARN or ERROR
naming the input, and clear by itself when the input returns. Policy faults: a deadline
too short for any inference (the raising and non-finite policies are in test_node_episodes
and test_node_worker). Signals during the first inference run the real ``main`` with a
scripted slow policy (scripted_policy_node.py).
"""

from __future__ import annotations

import json
from pathlib import Path
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from rcl_interfaces.msg import Parameter as ParameterMsg, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy._rclpy_pybind11 import NodeNameNonExistentError
from rclpy.duration import Duration
from ros_harness import (DEFAULT_CONFIG, installed_executable, next_domain_id, node_with_probe,
                         NodeProcess, RANDOM_WEIGHTS_ARGS, ROOT, ros_env)
from test_node_integration import CONFIG, JOINTS, RobotProbe, wait_until

from vla_policy_node.ros.conversions import rgb_to_image

pytestmark = pytest.mark.dds

NODE = '/vla_policy_node'
WARN, ERROR = '1', '2'


class FaultyRobot(RobotProbe):
    """
    The probe with stamped frames and streams that can go wrong.

    Modes: 'camera_stopped', 'joints_stopped'; 'stamps_late' (front frames stamped 2 s ago);
    'stamps_backwards' (each front frame stamped 10 ms before the previous one).
    """

    _backwards = None

    def _publish_images(self) -> None:
        if self.mode == 'camera_stopped':
            return
        now = self.node.get_clock().now()
        front = now
        if self.mode == 'stamps_late':
            front = now - Duration(seconds=2.0)
        if self.mode == 'stamps_backwards':
            self._backwards = (self._backwards or now) - Duration(seconds=0.01)
            front = self._backwards
        for stamp, publisher in zip((front, now), self._cameras):
            msg = rgb_to_image(np.full((48, 64, 3), 90, dtype=np.uint8))
            msg.header.stamp = stamp.to_msg()
            publisher.publish(msg)

    def _publish_joints(self) -> None:
        if self.mode != 'joints_stopped':
            super()._publish_joints()

    def set_parameter(self, name: str, value: ParameterValue) -> bool:
        """Set one parameter of the node; whether it was accepted."""
        client = self.node.create_client(SetParameters, f'{NODE}/set_parameters')
        try:
            assert client.wait_for_service(timeout_sec=10.0)
            future = client.call_async(SetParameters.Request(
                parameters=[ParameterMsg(name=name, value=value)]))
            assert wait_until(future.done, 10.0)
            return future.result().results[0].successful
        finally:
            self.node.destroy_client(client)

    def output_level(self) -> str:
        """Diagnostic level of the policy's output (ERROR after a faulty chunk)."""
        with self._lock:
            return self.inputs_status.get('vla_policy_node: policy output', {}).get('level', '')

    def input_level(self, name: str) -> str:
        """Diagnostic level of one input ('0' OK, '1' WARN, '2' ERROR; '' before any)."""
        with self._lock:
            return self.inputs_status.get(f'vla_policy_node: input {name}', {}).get('level', '')


@pytest.fixture(scope='module')
def system():
    with node_with_probe([DEFAULT_CONFIG], next_domain_id(), FaultyRobot) as pair:
        yield pair


@pytest.mark.parametrize('mode, stream', [('camera_stopped', 'front'),
                                          ('joints_stopped', 'joint_states')])
def test_stopped_input_holds_reports_and_resumes(system, mode, stream):
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 30.0), node.output
    holds = probe.counter('holds_published')
    probe.mode = mode
    age = CONFIG['max_observation_age']
    holding = f'holding: {stream}'
    assert wait_until(lambda: probe.state().startswith(holding), age + 3.0), node.output
    assert wait_until(lambda: probe.input_level(stream) in (WARN, ERROR), 3.0)
    assert wait_until(lambda: probe.counter('holds_published') > holds, 3.0)
    held, count = probe.last_command(), probe.command_count()
    time.sleep(1.0)
    assert probe.command_count() == count, 'a command was sent from stale data'
    np.testing.assert_allclose(probe.last_command(), held)
    probe.mode = 'good'
    assert wait_until(lambda: probe.command_count() > count + 3, 10.0), node.output
    assert wait_until(lambda: probe.input_level(stream) == '0', 3.0)


@pytest.mark.parametrize('mode', ['stamps_late', 'stamps_backwards'])
def test_late_or_out_of_order_stamps_hold_report_and_resume(system, mode):
    """Refused by stamp (which check speaks first is load-dependent; see test_node_inputs)."""
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 30.0), node.output
    probe.mode = mode
    assert wait_until(lambda: probe.state().startswith('holding: front: header stamp'), 3.0), \
        node.output
    assert wait_until(lambda: probe.input_level('front') == ERROR, 3.0)
    count = probe.command_count()
    time.sleep(0.5)
    assert probe.command_count() == count, 'a command was sent from a late or reordered frame'
    if mode == 'stamps_late':
        # Switching the stamp check off would let the late frames drive the arm: like the age
        # limits, it only tightens at run time (a camera on another clock takes a restart).
        assert not probe.set_parameter('use_header_stamps', ParameterValue(
            type=ParameterType.PARAMETER_BOOL, bool_value=False))
        time.sleep(0.3)
        assert probe.command_count() == count
    probe.mode = 'good'
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    assert wait_until(lambda: probe.input_level('front') == '0', 3.0)


def test_policy_deadline_discards_late_chunks_and_relaxing_it_resumes(system):
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 30.0), node.output
    late = probe.counter('policy_late')
    assert probe.set_parameter('policy_deadline', ParameterValue(
        type=ParameterType.PARAMETER_DOUBLE, double_value=0.001))
    assert wait_until(lambda: probe.state().startswith('holding: policy late'), 5.0), \
        probe.state()
    assert wait_until(lambda: probe.counter('policy_late') > late + 2, 3.0)
    assert wait_until(lambda: probe.output_level() == ERROR, 3.0)
    count = probe.command_count()
    time.sleep(0.5)
    assert probe.command_count() == count, 'a late chunk was executed'
    assert 'more than policy_deadline = 0.001 s' in node.output
    assert probe.set_parameter('policy_deadline', ParameterValue(
        type=ParameterType.PARAMETER_DOUBLE, double_value=CONFIG['policy_deadline']))
    assert wait_until(lambda: probe.command_count() > count + 3, 10.0), node.output
    assert wait_until(lambda: probe.output_level() == '0', 3.0)


def test_only_documented_interfaces(system):
    node, probe = system
    graph = probe.node
    name = 'vla_policy_node'

    def discovered() -> bool:
        try:
            return bool(graph.get_publisher_names_and_types_by_node(name, '/'))
        except NodeNameNonExistentError:        # not discovered yet
            return False
    assert wait_until(discovered, 10.0)
    published = {n for n, _ in graph.get_publisher_names_and_types_by_node(name, '/')}
    subscribed = {n for n, _ in graph.get_subscriber_names_and_types_by_node(name, '/')}
    services = {n for n, _ in graph.get_service_names_and_types_by_node(name, '/')}
    action = f'{NODE}/run_instruction/_action'          # the RunInstruction action's topics and services
    assert published <= {'/' + CONFIG['command_topic'], '/diagnostics', '/rosout',
                         '/parameter_events', f'{action}/feedback', f'{action}/status', f'{NODE}/episode'}
    inputs = {'/' + t for t in CONFIG['camera_topics']} | {
        '/joint_states', '/instruction', '/' + CONFIG['task_success_topic']}
    watched = {'/' + CONFIG['command_topic']}          # matched events only: who else publishes there
    assert subscribed <= inputs | watched | {'/parameter_events', '/clock'}
    parameter_services = {f'{NODE}/{s}' for s in (
        'describe_parameters', 'get_parameter_types', 'get_parameters', 'list_parameters',
        'set_parameters', 'set_parameters_atomically', 'get_type_description')}
    action_services = {f'{action}/{s}' for s in ('send_goal', 'cancel_goal', 'get_result')}
    assert services <= ({f'{NODE}/reset_episode', f'{NODE}/restart_from_measured'} | parameter_services
                        | action_services), services


@pytest.mark.parametrize('name, value', [('command_topic', 'elsewhere'), ('checkpoint', '/tmp')])
def test_read_only_parameters_refused_at_run_time(system, name, value):
    node, probe = system
    client = probe.node.create_client(SetParameters, f'{NODE}/set_parameters')
    assert client.wait_for_service(timeout_sec=10.0)
    param = ParameterMsg(name=name, value=ParameterValue(
        type=ParameterType.PARAMETER_STRING, string_value=value))
    future = client.call_async(SetParameters.Request(parameters=[param]))
    assert wait_until(future.done, 10.0)
    result = future.result().results[0]
    assert not result.successful and result.reason
    probe.node.destroy_client(client)


def test_sigterm_publishes_hold_and_exits_zero(system):
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    count = probe.command_count()
    start = time.monotonic()
    node.process.send_signal(signal.SIGTERM)
    assert node.wait(timeout=10.0) == 0, node.output
    assert time.monotonic() - start < 5.0
    assert 'stopped after publishing a hold' in node.output
    assert wait_until(lambda: probe.command_count() > count, 2.0)


@pytest.mark.parametrize('params, message', [
    ('control_rate_hz: "fast"', "parameter 'control_rate_hz' must be a double in [1.0, 1000.0], "
                                "but {path} gives a string ('fast')"),
    ('control_rate_hz: 5000.0', "parameter 'control_rate_hz' must be a double in [1.0, 1000.0]"),
    ('bogus_key: 3', "unknown parameters: ['bogus_key']"),
])
def test_bad_params_file_exits_one_with_reason(tmp_path, params, message):
    path = tmp_path / 'bad.yaml'
    path.write_text(f'/**:\n  ros__parameters:\n    {params}\n')
    node = NodeProcess([DEFAULT_CONFIG, path], next_domain_id())
    try:
        assert node.wait(timeout=30.0) == 1, node.output
        message = message.format(path=path)
        assert 'cannot start' in node.output and message in node.output, node.output
    finally:
        node.kill()


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_signal_during_the_first_inference_holds_and_exits_zero(signum):
    """Stopped while the first (3 s) step runs: hold at the measured joints, exit 0, fast."""
    domain_id = next_domain_id()
    node = subprocess.Popen(
        [sys.executable, str(ROOT / 'test' / 'scripted_policy_node.py'), '--ros-args',
         '--params-file', str(DEFAULT_CONFIG), *RANDOM_WEIGHTS_ARGS], env=ros_env(domain_id),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    probe = FaultyRobot(domain_id)
    try:
        assert wait_until(lambda: probe.node.count_subscribers('instruction') > 0, 30.0)
        time.sleep(1.0)  # inputs arrive within 0.1 s, the first request on the next tick
        assert probe.command_count() == 0
        start = time.monotonic()
        node.send_signal(signum)
        output, _ = node.communicate(timeout=10.0)
        assert node.returncode == 0, output
        assert time.monotonic() - start < 5.0, output
        assert 'stopped after publishing a hold' in output and 'commands_published=0' in output
        assert wait_until(lambda: probe.command_count() == 1, 2.0), output
        np.testing.assert_allclose(probe.commands[0].points[0].positions,
                                   [0.1 * i for i in range(len(JOINTS))])
    finally:
        probe.close()
        if node.poll() is None:
            node.kill()
            node.wait(5.0)


def _catches_sigterm(pid: int) -> bool:
    """Tell whether process ``pid`` has a handler for SIGTERM (``SigCgt`` in /proc/PID/status)."""
    try:
        status = Path(f'/proc/{pid}/status').read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith('SigCgt:')), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_signal_while_still_importing_exits_zero(signum):
    """A signal in the first second (rclpy and torch still importing) ends the process cleanly."""
    node = subprocess.Popen([str(installed_executable()), '--ros-args', '--params-file', str(DEFAULT_CONFIG)],
                            env=ros_env(next_domain_id()), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        # Once the entry point has installed its handlers (the kernel lists SIGTERM as caught):
        # before that the interpreter is still starting (the ROS wheels re-exec it once), and a
        # signal there is the default action's, not the node's. The heavy imports come after.
        assert wait_until(lambda: _catches_sigterm(node.pid), 30.0), 'the entry point never installed its handlers'
        node.send_signal(signum)
        output, _ = node.communicate(timeout=10.0)
        assert node.returncode == 0, output
        assert 'Traceback' not in output, output
    finally:
        if node.poll() is None:
            node.kill()


def start_refused(folder: Path, root: Path, params: Path) -> str:
    """Start the node on ``folder`` under ``checkpoint_root: root``; assert it exits 1 with its line; its output."""
    params.write_text(f'/**:\n  ros__parameters:\n    checkpoint: "{folder}"\n    checkpoint_root: "{root}"\n')
    node = NodeProcess([DEFAULT_CONFIG, params], next_domain_id())
    try:
        assert node.wait(timeout=60.0) == 1, node.output
        assert 'cannot start' in node.output and 'Traceback' not in node.output, node.output
        return node.output
    finally:
        node.kill()


def test_checkpoint_outside_checkpoint_root_is_refused(tmp_path, reference_dir):
    """The node loads nothing from outside ``checkpoint_root`` and says why."""
    output = start_refused(reference_dir('smolvla'), tmp_path, tmp_path / 'root.yaml')
    assert 'outside the allowed roots' in output, output


def test_a_checkpoint_declaring_impossible_sizes_is_refused_with_the_nodes_line(tmp_path, reference_dir):
    """resize_imgs_with_padding [60000, 60000] once grew the node to 19.8 GB until the kernel killed it."""
    folder = tmp_path / 'huge'
    shutil.copytree(reference_dir('smolvla'), folder)
    config = json.loads((folder / 'config.json').read_text())
    config['resize_imgs_with_padding'] = [60000, 60000]
    (folder / 'config.json').write_text(json.dumps(config))
    output = start_refused(folder, tmp_path, tmp_path / 'huge.yaml')
    assert 'is beyond 4096' in output, output


@pytest.mark.parametrize('case, args, said', [
    ('missing params file', ['--params-file', '/nonexistent/vla.yaml'], 'Error opening YAML file'),
    ('params file that is not YAML parameters', ['--params-file', '{bad}'], "Couldn't parse params file"),
    ('mixed-type list', ['--params-file', '{mixed}'], 'Sequence should be of same type'),
    ('-p without a value', ['-p', 'control_rate_hz'], "Couldn't parse parameter override rule"),
    ('malformed remap', ['-r', 'foo'], "Couldn't parse remap rule"),
    ('unknown log level', ['--log-level', 'nonsense'], "Couldn't parse log level"),
    ("rclpy's own parameter of the wrong type", ['-p', 'use_sim_time:=maybe'], "parameter 'use_sim_time'"),
])
def test_a_command_line_rcl_refuses_ends_in_the_nodes_line(tmp_path, case, args, said):
    """These once ended in an RCLError (or rclpy exception) traceback."""
    (tmp_path / 'bad.yaml').write_text('a: [b\n')
    (tmp_path / 'mixed.yaml').write_text('/**:\n  ros__parameters:\n    joint_names: [1, "a"]\n')
    args = [a.format(bad=tmp_path / 'bad.yaml', mixed=tmp_path / 'mixed.yaml') for a in args]
    result = subprocess.run([str(installed_executable()), '--ros-args', *args], env=ros_env(next_domain_id()),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert result.returncode == 1, result.stdout
    assert 'cannot start' in result.stdout and said in result.stdout, result.stdout
    assert 'Traceback' not in result.stdout, result.stdout


@pytest.mark.parametrize('executable', ['vla_policy_node', 'vla_policy_lifecycle_node'])
@pytest.mark.parametrize('line, said', [('control_rate_hz: 20', 'must be a double in [1.0, 1000.0]'),
                                        ('max_stepp: 0.1', "unknown parameters: ['max_stepp']")])
def test_a_bad_parameter_file_ends_in_the_fatal_line_alone(tmp_path, executable, line, said):
    """``ros2 run``'s way: once the FATAL line was followed by a double traceback (a half-built node destroyed)."""
    bad = tmp_path / 'bad.yaml'
    bad.write_text(f'/**:\n  ros__parameters:\n    {line}\n')
    result = subprocess.run([str(installed_executable(executable)), '--ros-args', '--params-file', str(DEFAULT_CONFIG),
                             '--params-file', str(bad)], env=ros_env(next_domain_id()), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=60)
    assert result.returncode == 1, result.stdout
    assert result.stdout.count('cannot start') == 1 and said in result.stdout, result.stdout
    assert 'Traceback' not in result.stdout, result.stdout


def test_the_simulated_robot_ends_on_sigterm_with_its_summary_not_a_traceback():
    robot = subprocess.Popen(
        [str(installed_executable('vla_policy_sim_robot')), '--ros-args', '--params-file',
         str(ROOT / 'config' / 'planar.yaml'), '-p', 'episodes:=1'],
        env=ros_env(next_domain_id()), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_until(lambda: _catches_sigterm(robot.pid), 30.0), 'rclpy never installed its handlers'
        time.sleep(2.0)                                 # spinning, waiting for a node that is not there
        robot.send_signal(signal.SIGTERM)
        output, _ = robot.communicate(timeout=10.0)
        assert 'Traceback' not in output, output
        assert 'no episode finished' in output, output
    finally:
        if robot.poll() is None:
            robot.kill()
