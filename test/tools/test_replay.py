# SPDX-License-Identifier: Apache-2.0
"""
vla-policy-replay on bags the tests record themselves (MCAP, written as rosbag2 writes them; sqlite3 copies).

A scripted policy that always answers the recorded command checks the bookkeeping (errors 0,
the state in training units, the times of the predicted rows); the tiny model runs the whole
command line: table, JSON and PNG.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import hypothesis
from hypothesis import given, strategies as st
import numpy as np
from PIL import Image as PILImage
import pytest
from ros_harness import DEFAULT_CONFIG
from test_node_robot_fit import FIT
import yaml

from benchmarks.synthetic_bag import write_synthetic_episode
from vla_policy_node.replay.bag import read_messages, topic_types
from vla_policy_node.replay.bag_replay import replay, settings_from_files
from vla_policy_node.replay.cli import main


@pytest.fixture(scope='module')
def fit_config(tmp_path_factory):
    folder = tmp_path_factory.mktemp('replay')
    override = folder / 'fit.yaml'
    override.write_text(yaml.safe_dump({'/**': {'ros__parameters': {
        **FIT, 'allow_random_weights': True, 'num_threads': 1}}}))
    settings = settings_from_files([str(DEFAULT_CONFIG), str(override)])
    bag = folder / 'episode.mcap'
    write_synthetic_episode(bag, settings, seconds=3.0)
    return settings, override, bag


def test_the_recorded_bag_holds_what_the_node_reads(fit_config):
    settings, _, bag = fit_config
    assert topic_types(bag) == {
        '/camera/front/image_raw/compressed': 'sensor_msgs/msg/CompressedImage',
        '/camera/wrist/image_raw': 'sensor_msgs/msg/Image',
        '/joint_states': 'sensor_msgs/msg/JointState',
        '/instruction': 'std_msgs/msg/String',
        '/arm_controller/joint_trajectory': 'trajectory_msgs/msg/JointTrajectory',
        '/gripper_controller/commands': 'std_msgs/msg/Float64MultiArray'}
    times = [log_time for *_, log_time in read_messages(bag)]
    assert times == sorted(times)


class RecordedCommandPolicy:
    """Answers every observation with the command the bag holds 0.1 s ahead of the state."""

    chunk_size = 8

    def __init__(self, joint_map) -> None:
        self.joint_map = joint_map
        self.states = []

    def predict_action_chunk(self, observation):
        self.states.append(observation['state'])
        ros = self.joint_map.action_to_ros(observation['state'].astype(np.float64))
        # The synthetic joints are 0.3 sin(0.8 t + phase): find t from joint 0 is awkward, so
        # answer a constant chunk of the (mapped) state; its error is the command's lead.
        return np.tile(self.joint_map.state_to_policy(ros), (1, self.chunk_size, 1))


def test_predictions_are_compared_with_the_command_in_force(fit_config):
    settings, _, bag = fit_config
    policy = RecordedCommandPolicy(settings.joint_map)
    result = replay(str(bag), settings, policy)
    horizon, dt = policy.chunk_size, 1.0 / settings.control_rate_hz
    assert result.chunks == len(policy.states) >= 6
    # One observation per horizon, each predicting `horizon` rows dt apart.
    np.testing.assert_allclose(np.diff(result.predicted_times[::horizon]), horizon * dt, atol=1e-9)
    np.testing.assert_allclose(np.diff(result.predicted_times[:horizon]), dt, atol=1e-9)
    # The state reached the policy in training units: degrees, gripper percent.
    ros = settings.joint_map.action_to_ros(np.asarray(policy.states[0], np.float64))
    assert np.all(np.abs(ros) <= 0.3 + 1e-6)
    assert np.max(np.abs(policy.states[0][:5])) > 1.0, 'the state was not in degrees'
    # Each error is the prediction minus the newest recorded command at or before its time.
    k = len(result.predicted_times) // 2
    index = np.searchsorted(result.recorded_times, result.predicted_times[k], side='right') - 1
    np.testing.assert_allclose(result.errors[k], result.predicted[k] - result.recorded[index])
    # Constant chunks of a sine whose commands lead by 0.1 s: errors bounded by its slope.
    summary = result.summary()['joints']
    for name, row in summary.items():
        assert row['points'] == len(result.predicted_times)
        assert 0.0 < row['mae'] <= row['max_abs'] <= 0.3 * 0.8 * (0.1 + horizon * dt + 0.1) + 1e-6, name


def as_sqlite3(mcap: Path, folder: Path) -> Path:
    """Copy the bag's messages, as stored, into a rosbag2 folder of sqlite3 storage (``.db3``)."""
    from rosbags.highlevel import AnyReader
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import get_typestore, Stores
    typestore = get_typestore(Stores.ROS2_KILTED)
    with AnyReader([mcap], default_typestore=typestore) as reader, \
            Writer(folder, version=9, storage_plugin=StoragePlugin.SQLITE3) as writer:
        copies = {c.id: writer.add_connection(c.topic, c.msgtype, typestore=typestore) for c in reader.connections}
        for connection, log_time, raw in reader.messages():
            writer.write(copies[connection.id], log_time, raw)
    return folder


def test_a_sqlite3_bag_replays_as_its_mcap_twin(fit_config, tmp_path):
    settings, _, bag = fit_config
    folder = as_sqlite3(bag, tmp_path / 'episode_db3')
    (db3,) = folder.glob('*.db3')
    for sqlite3 in (folder, db3):          # the rosbag2 folder, and its .db3 file alone
        assert topic_types(sqlite3) == topic_types(bag)
        assert [(topic, t) for topic, _, _, t in read_messages(sqlite3)] == [
            (topic, t) for topic, _, _, t in read_messages(bag)]
    twins = [replay(str(path), settings, RecordedCommandPolicy(settings.joint_map)) for path in (bag, folder)]
    np.testing.assert_array_equal(twins[0].errors, twins[1].errors)
    assert twins[1].chunks >= 6


def test_missing_topics_are_named(fit_config, tmp_path):
    settings, _, bag = fit_config
    other = settings_from_files([str(DEFAULT_CONFIG)], ['allow_random_weights:=true'])
    with pytest.raises(ValueError, match=r"the bag has no topics \['/camera/front/image_raw'"):
        replay(str(bag), other, RecordedCommandPolicy(other.joint_map))


def test_command_line_with_the_tiny_model_writes_table_json_and_png(fit_config, tmp_path, capsys):
    _, override, bag = fit_config
    png, report = tmp_path / 'replay.png', tmp_path / 'replay.json'
    code = main([str(bag), '--params-file', str(DEFAULT_CONFIG), '--params-file', str(override),
                 '--plot', str(png), '--json', str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert 'shoulder_pan' in out and 'MAE' in out
    summary = json.loads(report.read_text())
    assert summary['chunks'] >= 3
    assert all(math.isfinite(row['mae']) and row['points'] > 0 for row in summary['joints'].values())
    with PILImage.open(png) as image:
        assert image.format == 'PNG' and image.size[0] > 400


def test_command_line_refuses_a_bad_parameter(fit_config, capsys):
    _, override, bag = fit_config
    code = main([str(bag), '--params-file', str(DEFAULT_CONFIG), '--params-file', str(override),
                 '-p', 'joint_units.scale:=[1.0, 2.0]'])
    assert code == 1
    assert 'joint_units: scale has 2 entries, expected one per joint (6)' in capsys.readouterr().err


def wrong_type_bag(settings, path, wrong_topic: str, msg) -> None:
    """Write one message on every topic the node reads, ``wrong_topic`` carrying ``msg`` instead."""
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String
    from trajectory_msgs.msg import JointTrajectory

    from vla_policy_node.replay.bag import BagWriter
    from vla_policy_node.ros.compressed import camera_topic, rgb_to_compressed
    from vla_policy_node.ros.conversions import rgb_to_image

    rgb = np.zeros((48, 64, 3), np.uint8)
    messages = {'/' + settings.joint_states_topic.lstrip('/'): JointState(name=list(settings.joint_names),
                                                                          position=[0.0] * len(settings.joint_names)),
                '/' + settings.instruction_topic.lstrip('/'): String(data='pick')}
    for topic, transport in zip(settings.camera_topics, settings.camera_transports):
        messages['/' + camera_topic(topic, transport).lstrip('/')] = (
            rgb_to_compressed(rgb, 'jpeg') if transport == 'compressed' else rgb_to_image(rgb))
    for group in settings.command_groups:
        messages['/' + group.topic.lstrip('/')] = JointTrajectory()
    messages[wrong_topic] = msg
    with BagWriter(path) as writer:
        for i, (topic, message) in enumerate(messages.items()):
            writer.write(topic, message, 10**9 + i)


def rechunked(source: Path, path: Path, chunk_size: int) -> Path:
    """Copy an MCAP file with chunks of about ``chunk_size`` bytes."""
    from mcap.reader import make_reader
    from mcap.writer import Writer
    with open(source, 'rb') as stream, open(path, 'wb') as out:
        reader, writer = make_reader(stream), Writer(out, chunk_size=chunk_size)
        writer.start(profile='ros2', library='test')
        schemas, channels = {}, {}
        for schema, channel, message in reader.iter_messages(log_time_order=False):
            if schema.id not in schemas:
                schemas[schema.id] = writer.register_schema(schema.name, schema.encoding, schema.data)
            if channel.id not in channels:
                channels[channel.id] = writer.register_channel(channel.topic, channel.message_encoding,
                                                               schemas[schema.id], channel.metadata)
            writer.add_message(channels[channel.id], message.log_time, message.data, message.publish_time)
        writer.finish()
    return path


@pytest.mark.parametrize('percent', [50, 95])
def test_a_truncated_bag_is_ended_after_its_last_chunk_and_replays(fit_config, tmp_path, capsys, percent):
    """A file cut short (its recorder killed) keeps its complete chunks: replay ends it and reads them."""
    from vla_policy_node.replay.bag import end_unfinished
    _, override, bag = fit_config
    bag = rechunked(bag, tmp_path / 'small_chunks.mcap', 8192)       # the recorder closes chunks often
    data, broken = bag.read_bytes(), tmp_path / 'killed.mcap'
    broken.write_bytes(data[:len(data) * percent // 100])
    whole = sum(1 for _ in read_messages(bag))
    code = main([str(broken), '--params-file', str(DEFAULT_CONFIG), '--params-file', str(override)])
    captured = capsys.readouterr()
    assert code == 0 and 'was never closed' in captured.err, captured.err
    kept = sum(1 for _ in read_messages(broken))
    assert whole * (percent - 25) / 100 < kept < whole, (kept, whole)
    assert end_unfinished(broken) == []                         # ended once: the next read changes nothing
    assert 'MAE' in captured.out


@pytest.mark.parametrize('case', ['corrupted zstd chunk',
                                  'garbage after the magic', 'empty file', 'a PNG renamed .mcap',
                                  '/joint_states carrying std_msgs/String', 'a camera topic carrying JointState'])
def test_a_broken_bag_ends_in_one_line_and_exit_1(fit_config, tmp_path, capsys, case):
    """Each of these once ended in a Python traceback."""
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String
    settings, override, bag = fit_config
    data, broken = bag.read_bytes(), tmp_path / 'broken.mcap'
    middle = len(data) // 2
    if case == 'corrupted zstd chunk':
        broken.write_bytes(data[:middle] + bytes(b ^ 0x5A for b in data[middle:middle + 256]) + data[middle + 256:])
    elif case == 'garbage after the magic':
        broken.write_bytes(data[:8] + np.random.default_rng(0).bytes(4096))
    elif case == 'empty file':
        broken.write_bytes(b'')
    elif case == 'a PNG renamed .mcap':
        stream = io.BytesIO()
        PILImage.new('RGB', (8, 8)).save(stream, format='PNG')
        broken.write_bytes(stream.getvalue())
    elif case.startswith('/joint_states'):
        wrong_type_bag(settings, broken, '/joint_states', String(data='not a joint state'))
    else:
        camera = '/' + settings.camera_topics[1].lstrip('/')
        wrong_type_bag(settings, broken, camera, JointState(name=['a'], position=[0.0]))
    code = main([str(broken), '--params-file', str(DEFAULT_CONFIG), '--params-file', str(override)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith('vla-policy-replay:')]
    assert code == 1 and len(lines) == 1 and 'Traceback' not in err, err
    if 'carrying' in case:
        assert 'carries' in lines[0], lines[0]


def test_topics_resolve_in_the_namespace_the_bag_was_recorded_in():
    from vla_policy_node.replay.bag_replay import absolute
    assert absolute('camera/x') == '/camera/x' and absolute('~/x') == '/x'
    assert absolute('camera/x', '/arm') == '/arm/camera/x' and absolute('/joint_states', 'arm') == '/joint_states'


GOAL_GROUPS = {'commands': {
    'groups': ['arm', 'gripper'],
    'arm': {'interface': 'follow_joint_trajectory', 'topic': 'arm_controller/follow_joint_trajectory',
            'joints': ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll']},
    'gripper': {'interface': 'gripper_command', 'topic': 'gripper_controller/gripper_cmd', 'joints': ['gripper']}},
    'allow_random_weights': True, 'num_threads': 1}


def goal_bag(path: Path, settings, episodes: list[str], announce: bool = True) -> None:
    """
    Two seconds per episode at 10 Hz: frames, joints, and every command as a CommandGoal SENT then SUCCEEDED.

    ``announce``: the node's Episode events start and end each (else the bag has no instruction at all).
    """
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint
    from vla_policy_interfaces.msg import CommandGoal, Episode

    from vla_policy_node.replay.bag import BagWriter
    from vla_policy_node.ros.conversions import rgb_to_image

    image, t = rgb_to_image(np.zeros((48, 64, 3), np.uint8)), 10**9
    with BagWriter(path) as writer:
        writer.write('/instruction', String(data=''), t)
        for number, instruction in enumerate(episodes, 1):
            if announce:
                writer.write('/vla_policy_node/episode', Episode(event=0, episode=number, instruction=instruction), t)
            for step in range(20):
                t += 10**8
                for topic in settings.camera_topics:
                    writer.write('/' + topic, image, t)
                writer.write('/joint_states', JointState(name=list(settings.joint_names), position=[0.1] * 6), t)
                arm = JointTrajectory(joint_names=list(settings.joint_names[:5]),
                                      points=[JointTrajectoryPoint(positions=[0.2] * 5)])
                gripper = JointTrajectory(points=[JointTrajectoryPoint(positions=[0.3], effort=[5.0])])
                for group, trajectory in (('arm', arm), ('gripper', gripper)):
                    for event in (CommandGoal.SENT, CommandGoal.SUCCEEDED):
                        writer.write('/vla_policy_node/command_goals',
                                     CommandGoal(event=event, group=group, goal=step, trajectory=trajectory), t)
            if announce:
                writer.write('/vla_policy_node/episode', Episode(event=1, episode=number, instruction=instruction), t)


def test_action_groups_replay_from_their_goals_and_episodes_from_the_node(tmp_path):
    settings = settings_from_files([str(DEFAULT_CONFIG)], [f'{k}:={json.dumps(v)}' for k, v in {
        'commands.groups': GOAL_GROUPS['commands']['groups'], 'allow_random_weights': True,
        **{f'commands.{g}.{f}': v for g in ('arm', 'gripper') for f, v in GOAL_GROUPS['commands'][g].items()}}.items()])
    bag = tmp_path / 'goals.mcap'
    goal_bag(bag, settings, ['pick', 'place'])
    tasks = []

    class Recording(RecordedCommandPolicy):
        def predict_action_chunk(self, observation):
            tasks.append(observation['task'])
            return super().predict_action_chunk(observation)

    result = replay(str(bag), settings, Recording(settings.joint_map), period=0.3)
    assert result.goals == {name: {'sent': 40, 'accepted': 0, 'rejected': 0, 'succeeded': 40, 'aborted': 0,
                                   'canceled': 0, 'no_response': 0} for name in ('arm', 'gripper')}
    np.testing.assert_allclose(result.recorded[-1], [0.2] * 5 + [0.3])     # the gripper goal names no joint
    assert set(tasks) == {'pick', 'place'} and result.chunks >= 6


@pytest.mark.parametrize('case', ['an episode without instruction', 'no instruction at all'])
def test_a_bag_without_the_instruction_of_an_episode_is_refused_with_one_line(tmp_path, capsys, case):
    """Once a table of NaN with exit 0."""
    override = tmp_path / 'goals.yaml'
    override.write_text(yaml.safe_dump({'/**': {'ros__parameters': GOAL_GROUPS}}))
    settings = settings_from_files([str(DEFAULT_CONFIG), str(override)])
    bag = tmp_path / 'goals.mcap'
    goal_bag(bag, settings, ['pick', ''], announce=case.startswith('an episode'))
    code = main([str(bag), '--params-file', str(DEFAULT_CONFIG), '--params-file', str(override)])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith('vla-policy-replay:')]
    assert code == 1 and len(lines) == 1 and 'nan' not in captured.out.lower(), captured
    assert ('episode(s) [2]' if case.startswith('an episode') else 'holds no instruction') in lines[0], lines[0]


@hypothesis.settings(max_examples=60, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 255), st.sampled_from(['arm', 'gripper', 'default', '', 'x' * 300]),
                                 st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=7),
                                 st.lists(st.text(max_size=12), max_size=7)), max_size=30))
def test_hostile_command_goals_never_break_the_replay_bookkeeping(events):
    """Unknown events and groups are ignored; a SENT goal moves only its group's joints, whatever its shape."""
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint
    from vla_policy_interfaces.msg import CommandGoal

    from vla_policy_node.replay.bag_replay import RecordedInputs
    settings = settings_from_files([str(DEFAULT_CONFIG)], [f'{k}:={json.dumps(v)}' for k, v in {
        'commands.groups': GOAL_GROUPS['commands']['groups'], 'allow_random_weights': True,
        **{f'commands.{g}.{f}': v for g in ('arm', 'gripper') for f, v in GOAL_GROUPS['commands'][g].items()}}.items()])
    inputs = RecordedInputs(settings)
    for event, group, positions, names in events:
        trajectory = JointTrajectory(joint_names=names, points=[JointTrajectoryPoint(positions=positions)])
        inputs.on_goal(CommandGoal(event=event, group=group, trajectory=trajectory), 0.0)
    counted = sum(sum(counts.values()) for counts in inputs.goals.values())
    assert counted == sum(1 for event, group, *_ in events if event < 7 and group in ('arm', 'gripper'))
    assert all(len(row) == 6 for row in inputs.commands)
