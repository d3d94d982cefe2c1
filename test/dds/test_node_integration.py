# SPDX-License-Identifier: Apache-2.0
"""
The installed node, started with config/default.yaml, driven over real DDS on localhost.

A probe node in its own rclpy Context plays the robot: two cameras, joint states and the
instruction. The tests run in file order against one node process (start-up costs a few
seconds): commands flow, reset service and instruction change reset the episode, bad input
stops commands without killing the node, and SIGINT publishes a hold and exits 0.
"""

from __future__ import annotations

import math
import signal
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import pytest
import rclpy
from rclpy.serialization import serialize_message
from rclpy.executors import SingleThreadedExecutor
from ros_harness import DEFAULT_CONFIG, next_domain_id, node_with_probe, wait_until
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory
import yaml

from vla_policy_node.control.real_time import refill_threshold_for
from vla_policy_node.ros.conversions import rgb_to_image
from vla_policy_node.ros.diagnostics import diagnostics_to_dict
from vla_policy_node.ros.qos import (CAMERA_QOS, COMMAND_QOS, DIAGNOSTICS_QOS, INSTRUCTION_QOS,
                                     INSTRUCTION_VOLATILE_QOS, JOINT_STATES_QOS)

pytestmark = pytest.mark.dds

CONFIG = yaml.safe_load(DEFAULT_CONFIG.read_text())['/**']['ros__parameters']
JOINTS = CONFIG['joint_names']
TASK = 'pick up the red cube'
# Serialized bytes that deserialize as no message type: a CDR header, then a string length past the end.
GARBAGE = b'\x00\x01\x00\x00' + b'\xff' * 12


class RobotProbe:
    """Publishes the node's inputs at fixed rates and records what the node sends back."""

    def __init__(self, domain_id: int, command_type: type = JointTrajectory,
                 command_topic: str = CONFIG['command_topic']) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node('robot_probe', context=self.context)
        self.mode = 'good'
        self.commands: list = []
        self.policy_status: dict[str, str] = {}
        self.last_diagnostics: dict[str, dict[str, str]] = {}     # every status of the newest message
        # (node stamp in seconds, commands received by then, policy status) per /diagnostics
        self.policy_history: list[tuple[float, int, dict[str, str]]] = []
        self.inputs_status: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        self._cameras = [self.node.create_publisher(Image, topic, CAMERA_QOS)
                         for topic in CONFIG['camera_topics']]
        self._joints = self.node.create_publisher(JointState, '/joint_states', JOINT_STATES_QOS)
        self._instruction = self.node.create_publisher(String, 'instruction', INSTRUCTION_QOS)
        self.command_subscription = self.node.create_subscription(
            command_type, command_topic, self._on_command, COMMAND_QOS)
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics,
                                      DIAGNOSTICS_QOS)
        self.reset_client = self.node.create_client(Trigger, '/vla_policy_node/reset_episode')
        self.node.create_timer(1.0 / 15.0, self._publish_images)
        self.node.create_timer(1.0 / 50.0, self._publish_joints)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._spinner = threading.Thread(target=self.executor.spin, daemon=True)
        self._spinner.start()
        self.publish_instruction(TASK)

    def publish_instruction(self, text: str) -> None:
        """Send a task (latched: the node gets it whenever it subscribes)."""
        self._instruction.publish(String(data=text))

    def _publish_images(self) -> None:
        rgb = np.full((48, 64, 3), 90, dtype=np.uint8)
        for index, publisher in enumerate(self._cameras):
            msg = rgb_to_image(rgb)
            if index == 0 and self.mode == 'bad_encoding':
                msg.encoding = '16UC1'
            if index == 0 and self.mode == 'truncated_image':
                msg.data = msg.data[:-7]
            if index == 0 and self.mode == 'garbage_image':
                msg = GARBAGE                         # raw bytes that are no Image at all
            publisher.publish(msg)

    def _publish_joints(self) -> None:
        positions = [0.1 * i for i in range(len(JOINTS))]
        if self.mode == 'nan_joint':
            positions[2] = math.nan
        if self.mode == 'garbage_joints':
            self._joints.publish(GARBAGE)
            return
        # Reordered on purpose: the node maps joint states by name.
        self._joints.publish(JointState(name=JOINTS[::-1], position=positions[::-1]))
        if self.mode == 'garbage_after_good':        # the newest message is the bad one
            self._joints.publish(GARBAGE)

    def _on_command(self, msg) -> None:
        with self._lock:
            self.commands.append(msg)

    def _on_diagnostics(self, msg) -> None:
        flat = diagnostics_to_dict(msg)
        with self._lock:
            self.last_diagnostics = flat
            for name, values in flat.items():
                if name.endswith(': policy'):
                    self.policy_status = values
                    stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
                    self.policy_history.append((stamp, len(self.commands), values))
                else:
                    self.inputs_status[name] = values

    def counter(self, key: str) -> int:
        """Return a counter from the node's latest /diagnostics (-1 before any)."""
        with self._lock:
            return int(self.policy_status.get(key, -1))

    def counters(self, *keys: str) -> tuple[int, ...]:
        """Return several counters from one /diagnostics message, so they agree."""
        with self._lock:
            return tuple(int(self.policy_status.get(key, -1)) for key in keys)

    def state(self) -> str:
        """Return the node's state string from its latest /diagnostics."""
        with self._lock:
            return self.policy_status.get('state', '')

    def command_count(self) -> int:
        """Commands received so far."""
        with self._lock:
            return len(self.commands)

    def last_command(self) -> np.ndarray:
        """Positions of the newest command."""
        with self._lock:
            return np.array(self.commands[-1].points[0].positions)

    def close(self) -> None:
        """Stop spinning and shut the probe's context down."""
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.fixture(scope='module')
def system():
    """Start the installed node (default.yaml) and a probe on a domain of their own."""
    with node_with_probe([DEFAULT_CONFIG], next_domain_id(), RobotProbe) as pair:
        yield pair


def test_commands_flow_within_limits(system):
    node, probe = system
    assert wait_until(lambda: probe.command_count() >= 10, 30.0), node.output
    command = probe.commands[-1]
    assert list(command.joint_names) == JOINTS
    assert max(len(c.points) for c in probe.commands) > 1, 'the plan goes out as points'
    lower, upper = np.array(CONFIG['limits']['lower']), np.array(CONFIG['limits']['upper'])
    max_step, period = CONFIG['limits']['max_step'], 1.0 / CONFIG['control_rate_hz']
    for trajectory in probe.commands:
        points = np.array([list(p.positions) for p in trajectory.points])
        times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9
                 for p in trajectory.points]
        np.testing.assert_allclose(times, period * np.arange(1, len(points) + 1), atol=1e-9)
        assert np.all(points >= lower - 1e-9) and np.all(points <= upper + 1e-9)
        assert np.all(np.abs(np.diff(points, axis=0)) <= max_step + 1e-9)
    positions = np.array([list(c.points[0].positions) for c in probe.commands])
    steps = np.abs(np.diff(positions, axis=0))
    assert np.all(steps <= max_step + 1e-9)
    assert wait_until(lambda: probe.counter('commands_published') > 0, 5.0)
    assert probe.counter('control_steps') > 0
    prefixes, denoises, steps = probe.counters('prefix_passes', 'denoise_steps', 'control_steps')
    assert prefixes == steps
    assert denoises == steps * 5
    assert wait_until(lambda: probe.state() == 'commanding', 3.0)


def test_reset_service_resets_episode(system):
    node, probe = system
    before = probe.counter('cache_resets')
    assert probe.reset_client.wait_for_service(timeout_sec=10.0)
    future = probe.reset_client.call_async(Trigger.Request())
    assert wait_until(future.done, 10.0)
    assert future.result().success
    assert wait_until(lambda: probe.counter('episode_resets') == 1, 5.0)
    assert wait_until(lambda: probe.counter('cache_resets') > before, 5.0)
    count = probe.command_count()
    assert wait_until(lambda: probe.command_count() > count + 5, 10.0), node.output


def test_instruction_change_resets_episode(system):
    node, probe = system
    probe.publish_instruction('put the cube back')
    assert wait_until(lambda: probe.counter('episode_resets') == 2, 5.0), node.output
    assert 'episode reset #2 (instruction changed)' in node.output
    probe.publish_instruction(TASK)
    assert wait_until(lambda: probe.counter('episode_resets') == 3, 5.0)


def test_a_volatile_instruction_publisher_is_taken_without_a_qos_warning(system):
    """As ``ros2 topic pub`` publishes (volatile): taken, and no incompatible-QoS warning is logged."""
    node, probe = system
    before = probe.counter('episode_resets')
    volatile = probe.node.create_publisher(String, 'instruction', INSTRUCTION_VOLATILE_QOS)
    try:
        assert wait_until(lambda: volatile.get_subscription_count() >= 1, 5.0)
        volatile.publish(String(data='touch the cube'))
        assert wait_until(lambda: probe.counter('episode_resets') > before, 5.0), node.output
    finally:
        probe.node.destroy_publisher(volatile)
    probe.publish_instruction(TASK)
    assert wait_until(lambda: probe.counter('episode_resets') > before + 1, 5.0)
    assert 'incompatible QoS' not in node.output, node.output


@pytest.mark.parametrize('raw, said', [
    # As a C++ publisher sends 'touch\x00the cube' (rclpy's own would cut it before sending).
    (b'\x00\x01\x00\x00\x0f\x00\x00\x00touch\x00the cube\x00', 'instruction contains a NUL character at byte 5'),
    (serialize_message(String(data='touch the \u202eebuc')), "instruction contains format characters ['U+202E']"),
])
def test_an_instruction_with_a_nul_or_a_bidi_override_is_refused_not_cut(system, raw, said):
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 10.0)
    resets = node.output.count('episode reset #')
    volatile = probe.node.create_publisher(String, 'instruction', INSTRUCTION_VOLATILE_QOS)
    try:
        assert wait_until(lambda: volatile.get_subscription_count() >= 1, 5.0)
        volatile.publish(raw)
        assert wait_until(lambda: probe.state().startswith('holding: instruction'), 5.0), node.output
        assert said in node.output and "instruction: 'touch'" not in node.output, node.output
        assert 'episode reset #' not in node.output.split(said)[-1], 'the refused instruction started an episode'
    finally:
        probe.node.destroy_publisher(volatile)
        probe.publish_instruction('touch the cube')
        assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
        probe.publish_instruction(TASK)
        assert wait_until(lambda: node.output.count('episode reset #') >= resets + 2, 5.0), node.output
        assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
        reports = len(probe.policy_history)     # the next test reads counters of a settled /diagnostics
        assert wait_until(lambda: len(probe.policy_history) >= reports + 2, 5.0)


@pytest.mark.parametrize('mode, stream, log', [
    ('nan_joint', 'joint_states', "joint state position of 'elbow_flex' is not finite"),
    ('bad_encoding', 'front', "unsupported image encoding '16UC1'"),
    ('truncated_image', 'front', 'image data has 9209 bytes, expected step * height = 9216'),
    ('garbage_image', 'front', 'undecodable message'),
    ('garbage_joints', 'joint_states', 'undecodable message'),
    ('garbage_after_good', 'joint_states', 'undecodable message'),
])
def test_bad_input_stops_commands_and_node_recovers(system, mode, stream, log):
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 10.0)
    rejected = probe.counter('rejected_inputs')
    holds = probe.counter('holds_published')
    probe.mode = mode
    assert wait_until(lambda: probe.state().startswith(f'holding: {stream}'), 5.0), node.output
    assert log in node.output
    assert probe.counter('rejected_inputs') > rejected
    assert probe.counter('holds_published') == holds + 1
    held = probe.last_command()
    count = probe.command_count()
    time.sleep(1.0)
    assert probe.command_count() == count, 'a command was sent from bad input'
    np.testing.assert_allclose(probe.last_command(), held)
    probe.mode = 'good'
    assert wait_until(lambda: probe.command_count() > count + 3, 10.0), node.output
    assert node.process.poll() is None


def test_empty_instruction_is_refused(system):
    node, probe = system
    probe.publish_instruction('')
    assert wait_until(lambda: probe.state().startswith('holding: instruction'), 5.0)
    assert 'instruction is empty' in node.output
    level = 'vla_policy_node: input instruction'
    assert wait_until(lambda: probe.inputs_status.get(level, {}).get('level') == '2', 3.0)
    count = probe.command_count()
    time.sleep(0.5)
    assert probe.command_count() == count
    probe.publish_instruction(TASK)
    assert wait_until(lambda: probe.command_count() > count + 3, 10.0), node.output
    assert wait_until(lambda: probe.inputs_status.get(level, {}).get('level') == '0', 3.0)
    assert 'age_s' not in probe.inputs_status[level], 'a latched instruction has no age'
    assert float(probe.inputs_status['vla_policy_node: input front']['age_s']) < 1.0


def test_diagnostics_say_whether_the_measured_latency_keeps_the_robot_fed(system):
    """The verdict and the latency it judged come in one message; the threshold it needs is the rule's for that p95."""
    node, probe = system
    assert wait_until(lambda: probe.counter('chunks_received') >= 2, 30.0), node.output
    assert wait_until(lambda: 'vla_policy_node: real time' in probe.last_diagnostics, 5.0)
    with probe._lock:
        message = dict(probe.last_diagnostics)
    verdict, policy = message['vla_policy_node: real time'], message['vla_policy_node: policy']
    p95 = float(policy['total_latency_p95_ms']) / 1e3
    needed = refill_threshold_for(p95, CONFIG['control_rate_hz'], CONFIG['tiny_model']['chunk_size'])
    assert verdict['refill_threshold_needed'] == ('n/a' if needed is None else f'{needed:.4g}'), (verdict, policy)
    if needed is None:
        assert verdict['level'] == '1' and verdict['message'].startswith('too slow for real time'), verdict
    elif verdict['level'] != '0':       # the refill in use (a threshold, or the latencies it follows) is too late
        too_late = ('chunking.refill_threshold', 'chunking.refill_from_latency asks')
        assert verdict['message'].startswith(too_late), verdict


def test_a_refill_threshold_too_low_for_the_latency_warns_and_the_robot_does_starve(tmp_path):
    """
    refill_threshold 0 asks for a chunk only when none is left: /diagnostics and the log say so, and ticks starve.

    At 100 Hz a 20-step tiny-model chunk (15 ms or more) outlasts a period, so the starving is sure.
    """
    override = tmp_path / 'late.yaml'
    override.write_text(yaml.safe_dump({'/**': {'ros__parameters': {
        'control_rate_hz': 100.0, 'num_threads': 1, 'tiny_model': {'chunk_size': 32, 'num_steps': 20},
        'chunking': {'refill_threshold': 0.0, 'refill_from_latency': False}}}}))
    with node_with_probe([DEFAULT_CONFIG, override], next_domain_id(), RobotProbe) as (node, probe):
        assert wait_until(lambda: probe.counter('starved_ticks') > 0, 30.0), node.output
        assert wait_until(lambda: probe.last_diagnostics.get('vla_policy_node: real time', {}).get('level') == '1',
                          5.0), probe.last_diagnostics
        verdict = probe.last_diagnostics['vla_policy_node: real time']
        assert verdict['message'].startswith('chunking.refill_threshold 0 is too low: chunks take '), verdict
        assert float(verdict['refill_threshold_needed']) > 0.0
        assert wait_until(lambda: 'chunking.refill_threshold 0 is too low' in node.output, 5.0), node.output
    assert node.output.count('chunking.refill_threshold 0 is too low') == 1, 'logged once a minute, not each period'


def test_the_refill_from_latency_raises_a_threshold_too_low_and_the_robot_is_fed(tmp_path):
    """
    The same settings with the refill from latency (the default): ticks no longer starve at every chunk.

    The node asks for each chunk while the actions left still cover its measured latency, and says so.
    """
    override = tmp_path / 'raised.yaml'
    override.write_text(yaml.safe_dump({'/**': {'ros__parameters': {
        'control_rate_hz': 100.0, 'num_threads': 1, 'tiny_model': {'chunk_size': 32, 'num_steps': 20},
        'chunking': {'refill_threshold': 0.0}}}}))
    with node_with_probe([DEFAULT_CONFIG, override], next_domain_id(), RobotProbe) as (node, probe):
        assert wait_until(lambda: probe.counter('chunks_received') >= 10, 30.0), node.output
        starved, chunks = probe.counter('starved_ticks'), probe.counter('chunks_received')
        assert wait_until(lambda: probe.counter('chunks_received') >= chunks + 30, 30.0), node.output
        more_starved, more_chunks = probe.counter('starved_ticks') - starved, probe.counter('chunks_received') - chunks
        assert more_starved < more_chunks / 2, (more_starved, more_chunks)      # threshold 0 alone: each chunk
        assert wait_until(lambda: 'raises' in probe.last_diagnostics.get('vla_policy_node: real time', {}).get(
            'message', ''), 5.0), probe.last_diagnostics
        verdict = probe.last_diagnostics['vla_policy_node: real time']
        assert verdict['level'] == '0' and verdict['message'].startswith('chunks take '), verdict
        assert 'chunking.refill_from_latency raises chunking.refill_threshold 0 to ' in verdict['message'], verdict
    assert 'is too low' not in node.output


def test_sigint_publishes_hold_and_exits_zero(system):
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 10.0)
    count = probe.command_count()
    node.process.send_signal(signal.SIGINT)
    assert node.wait(timeout=10.0) == 0, node.output
    assert 'stopped after publishing a hold' in node.output
    assert wait_until(lambda: probe.command_count() > count, 2.0)
    final = probe.commands[-1]
    np.testing.assert_allclose(final.points[0].positions, probe.commands[-2].points[0].positions)


def test_forward_command_interface_with_real_time_chunking(tmp_path):
    """The other command interface and the rtc blend mode, end to end in a second process."""
    override = tmp_path / 'forward.yaml'
    override.write_text(yaml.safe_dump({'/**': {'ros__parameters': {
        'command_interface': 'forward_command',
        'command_topic': 'forward_position_controller/commands',
        'chunking': {'blend': 'rtc'}}}}))

    def forward_probe(domain_id: int) -> RobotProbe:
        return RobotProbe(domain_id, Float64MultiArray, '/forward_position_controller/commands')

    with node_with_probe([DEFAULT_CONFIG, override], next_domain_id(), forward_probe) as (node, probe):
        assert wait_until(lambda: probe.counter('chunks_received') >= 3, 30.0), node.output
        assert probe.command_count() > 5
        assert len(probe.commands[-1].data) == len(JOINTS)
        for fault in ('raised', 'non_finite', 'late'):
            assert probe.counter(f'policy_{fault}') == 0
        assert probe.counter('rejected_chunks') == 0


def test_command_rate_holds_while_inference_is_slower_than_a_period(tmp_path):
    """
    At 100 Hz a 20-step tiny-model chunk (15 ms or more) outlasts the period; the timer keeps the rate.

    Judged on the node's own counters between two /diagnostics stamps: ticks at 100 per second,
    many commands per chunk (inference never gates them), here and at the probe. How many
    ticks publish depends on the machine's load (a tick with no action yet lets the trajectory
    sent before run on; stale inputs hold), not on the loop.
    """
    override = tmp_path / 'fast.yaml'
    override.write_text(yaml.safe_dump({'/**': {'ros__parameters': {
        'control_rate_hz': 100.0, 'num_threads': 1, 'tiny_model': {'chunk_size': 32, 'num_steps': 20}}}}))
    with node_with_probe([DEFAULT_CONFIG, override], next_domain_id(), RobotProbe) as (node, probe):
        assert wait_until(lambda: probe.counter('chunks_received') >= 3, 30.0), node.output
        first = len(probe.policy_history) - 1
        assert wait_until(lambda: probe.policy_history[-1][0] - probe.policy_history[first][0] >= 4.0, 15.0)
        (t0, received0, s0), (t1, received1, s1) = probe.policy_history[first], probe.policy_history[-1]

    def delta(key: str) -> int:
        return int(s1[key]) - int(s0[key])

    ticks, published = delta('control_ticks'), delta('commands_published') + delta('holds_published')
    assert float(s1['total_latency_p50_ms']) > 10.0, 'inference is not slower than the 10 ms period'
    assert abs(ticks / (t1 - t0) - 100.0) <= 5.0, f'{ticks / (t1 - t0):.1f} ticks/s at control_rate_hz 100'
    assert published > 5 * delta('chunks_received'), s1
    # Not all of them need to arrive: on an overloaded machine the probe's KEEP_LAST history drops some.
    assert received1 - received0 > 5 * delta('chunks_received'), f'{received1 - received0} of {published} arrived'


@pytest.mark.parametrize('case', ['compiled', 'no_compiler', 'rtc'])
def test_compile_parameter_compiles_during_the_warm_up_or_falls_back_to_eager(tmp_path, case):
    """
    compile: true builds (or loads) the compiled programs before 'ready'; else the node runs eager.

    Eager: without a C++ compiler (found at once, before exporting), or with rtc blending.

    The tiny model is test_compiled's (one camera, chunk 8, 2 steps), whose programs make test
    builds before the DDS tests run: the node loads them from the tests' cache instead of
    compiling for a minute (run alone, it compiles them).
    """
    params = {'compile': True, 'num_threads': 1, 'tiny_model': {'chunk_size': 8, 'num_steps': 2},
              'camera_names': ['front'], 'camera_topics': ['camera/front/image_raw']}
    if case == 'rtc':
        params['chunking'] = {'blend': 'rtc'}
    override = tmp_path / 'compiled.yaml'
    override.write_text(yaml.safe_dump({'/**': {'ros__parameters': params}}))
    env = {}
    if case == 'no_compiler':       # and empty compile caches, or a cached build would hide it
        env = {'CXX': str(tmp_path / 'no-such-compiler'), 'TORCHINDUCTOR_CACHE_DIR': str(tmp_path / 'inductor'),
               'VLA_POLICY_NODE_CACHE_DIR': str(tmp_path / 'programs')}
    with node_with_probe([DEFAULT_CONFIG, override], next_domain_id(), RobotProbe, ready_timeout=240.0,
                         env=env) as (node, probe):
        expected = {'compiled': '(compiled)', 'no_compiler': 'compile failed, running eager',
                    'rtc': "compile is off: with chunking.blend 'rtc'"}[case]
        assert expected in node.output, node.output
        if case != 'compiled':
            assert '(compiled)' not in node.output
        else:                       # programs loaded from the cache or compiled, and the warm-up's race
            assert 'compile cache' in node.output and 'compiled code kept' in node.output, node.output
        assert wait_until(lambda: probe.counter('chunks_received') >= 3, 30.0), node.output
        assert probe.command_count() > 5
        for fault in ('raised', 'non_finite', 'late'):
            assert probe.counter(f'policy_{fault}') == 0
