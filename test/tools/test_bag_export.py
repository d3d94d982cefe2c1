# SPDX-License-Identifier: Apache-2.0
"""
vla-policy-replay BAG --export-dataset OUT: recorded bags as LeRobotDatasets, reopened by the project's reader.

The bags are benchmarks/synthetic_bag.py's (joints 0.3 sin(0.8 t + 0.7 j) at 50 Hz, commands leading them by
0.1 s at 20 Hz, cameras at 15 Hz, the node's topics and units of test_node_robot_fit's FIT settings), so the
expected states and actions are those sines mapped by FIT's joint_units. LeRobot's own reading of an export is
checked outside make test (tools/lerobot/check_export.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from ros_harness import DEFAULT_CONFIG
from sensor_msgs.msg import JointState
from test_node_robot_fit import FIT
import yaml

from benchmarks.synthetic_bag import write_synthetic_episode
from vla_policy_node.dataset.reader import Dataset
from vla_policy_node.replay.bag import BagWriter, read_messages
from vla_policy_node.replay.bag_export import export_bag, ExportError
from vla_policy_node.replay.bag_replay import replay, settings_from_files
from vla_policy_node.replay.cli import main

FPS = 10


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp('export')
    override = folder / 'fit.yaml'
    override.write_text(yaml.safe_dump({'/**': {'ros__parameters': {**FIT, 'num_threads': 1}}}))
    params = [str(DEFAULT_CONFIG), str(override)]
    settings = settings_from_files(params, ['allow_random_weights:=true'])
    bag = folder / 'two_tasks.mcap'
    write_synthetic_episode(bag, settings, seconds=3.0, image_size=(24, 32), later_tasks=('put it in the box',))
    return settings, params, bag


def position(t):
    return 0.3 * np.sin(0.8 * t + np.arange(6) * 0.7)


def assert_newest(rows, times, rate, value):
    for row, t in zip(rows, times):
        newest = np.floor(t * rate + 1e-6) / rate
        assert min(np.abs(row - value(c)).max() for c in (newest, newest - 1 / rate)) < 1e-3, (row, t)


def test_an_export_reopens_with_the_recorded_states_actions_tasks_and_frames(setup, tmp_path):
    settings, _, bag = setup
    out = tmp_path / 'ds'
    episodes = export_bag(str(bag), settings, out, fps=FPS, robot_type='so101_follower')
    assert [task for task, _ in episodes] == ['pick up the red cube', 'put it in the box']
    dataset = Dataset(out)
    assert dataset.fps == FPS and dataset.robot_type == 'so101_follower' and dataset.cameras == ['front', 'wrist']
    assert dataset.names('action') == [f'{j}.pos' for j in settings.joint_names]
    assert list(dataset.tasks.values()) == ['pick up the red cube', 'put it in the box']
    frames = 0
    for episode in dataset.episodes:
        data = dataset.episode(episode.index)
        times = (frames + np.arange(episode.length)) / FPS      # ticks from the bag's start
        frames += episode.length
        # the newest 50 Hz joint state and 20 Hz command at each tick (one sent at the tick's time may come
        # just before or just after it: both are accepted)
        assert_newest(data.states, times, 50, lambda t: settings.joint_map.state_to_policy(position(t)))
        assert_newest(data.actions, times, 20, lambda t: settings.joint_map.action_to_policy(position(t + 0.1)))
        assert data.frames['wrist'].shape == (episode.length, 24, 32, 3)
    assert frames == 30 and [e.length for e in dataset.episodes] == [15, 15]


def test_the_frames_are_the_recorded_images_within_the_codecs_tolerance(setup, tmp_path):
    settings, _, bag = setup
    export_bag(str(bag), settings, tmp_path / 'ds', fps=FPS, codec='h264')
    data = Dataset(tmp_path / 'ds').episode(0)
    raw = [(t, m) for topic, _, m, t in read_messages(bag, {'/camera/wrist/image_raw'})]
    start = next(t for *_, t in read_messages(bag))
    images = [np.frombuffer(bytes(m.data), np.uint8).reshape(m.height, m.width, 3).astype(int) for _, m in raw]
    for k in (0, 7, 14):
        newest = max(i for i, (t, _) in enumerate(raw) if (t - start) * 1e-9 <= k / FPS + 1e-9)
        errors = [np.abs(data.frames['wrist'][k] - image).mean() for image in images]
        # lossy at 24x32 (yuv420, crf 30), but nearest to the image in force at the tick
        assert errors[newest] < 16 and errors[newest] == min(errors)


def test_a_teleoperated_demonstration_takes_the_leaders_joint_states(setup, tmp_path):
    settings, _, _ = setup
    bag = tmp_path / 'teleop.mcap'
    write_synthetic_episode(bag, settings, seconds=1.0, image_size=(24, 32))
    leader = tmp_path / 'with_leader.mcap'

    def with_leader(topic, msg, t):
        if topic.endswith(('joint_trajectory', 'commands')):
            return []
        if topic != '/joint_states':
            return [(topic, msg)]
        return [(topic, msg), ('/leader/joint_states',
                               JointState(name=list(msg.name), position=[p + 0.05 for p in msg.position]))]
    copy_bag(bag, leader, with_leader)
    export_bag(str(leader), settings, tmp_path / 'ds', fps=FPS, leader='/leader/joint_states')
    data = Dataset(tmp_path / 'ds').episode(0)
    np.testing.assert_allclose(data.actions, settings.joint_map.action_to_policy(
        settings.joint_map.action_to_ros(data.states) + 0.05), atol=1e-3)


def copy_bag(source, target, keep=lambda topic, msg, t: [(topic, msg)]):
    """Copy a bag message by message (rclpy messages) through ``keep``, which returns what to write instead."""
    from importlib import import_module

    from mcap.reader import make_reader
    from rclpy.serialization import deserialize_message
    with open(source, 'rb') as stream, BagWriter(target) as writer:
        for schema, channel, message in make_reader(stream).iter_messages(log_time_order=True):
            package, _, name = schema.name.split('/')
            msg = deserialize_message(message.data, getattr(import_module(f'{package}.msg'), name))
            for topic, out in keep(channel.topic, msg, message.log_time):
                writer.write(topic, out, message.log_time)


def no_leftovers(folder):
    return sorted(p.name for p in folder.iterdir())


def test_refusals_name_the_reason_and_leave_nothing(setup, tmp_path):
    settings, _, bag = setup
    cases = {
        'no commands': dict(path=None, drop=('joint_trajectory', 'commands')),
        'no instruction': dict(path=None, drop=('/instruction',)),
    }
    for name, case in cases.items():
        filtered = tmp_path / f'{name.replace(" ", "_")}.mcap'
        copy_bag(bag, filtered, lambda topic, msg, t: [] if topic.endswith(case['drop']) else [(topic, msg)])
        with pytest.raises(ExportError) as caught:
            export_bag(str(filtered), settings, tmp_path / 'out', fps=FPS)
        assert name.split()[1] in str(caught.value) and '\n' not in str(caught.value)
    assert 'out' not in no_leftovers(tmp_path)
    with pytest.raises(ExportError, match="camera 'front'.*cannot be aligned"):
        export_bag(str(bag), settings, tmp_path / 'out', fps=30)
    with pytest.raises(ExportError, match='whole number of frames'):
        export_bag(str(bag), settings, tmp_path / 'out', fps=7.5)
    with pytest.raises(ExportError, match='no topics'):
        export_bag(str(bag), settings, tmp_path / 'out', fps=FPS, leader='/leader/joint_states')
    assert not [p for p in no_leftovers(tmp_path) if p == 'out' or p.startswith('.out')]
    (tmp_path / 'taken').mkdir()
    with pytest.raises(ExportError, match='exists'):
        export_bag(str(bag), settings, tmp_path / 'taken', fps=FPS)


def test_an_episode_message_splits_and_an_instruction_less_episode_is_refused(setup, tmp_path):
    settings, _, _ = setup
    bag = tmp_path / 'one.mcap'
    write_synthetic_episode(bag, settings, seconds=2.0, image_size=(24, 32))
    gap = tmp_path / 'gap.mcap'

    def stop_joints(topic, msg, t):                # the joints stop for 0.6 s in the middle: two episodes
        seconds = (t - 1_700_000_000 * 10**9) * 1e-9
        return [] if topic == '/joint_states' and 0.8 < seconds < 1.4 else [(topic, msg)]
    copy_bag(bag, gap, stop_joints)
    episodes = export_bag(str(gap), settings, tmp_path / 'ds', fps=FPS, gap=0.5)
    assert len(episodes) == 2 and all(task == 'pick up the red cube' for task, _ in episodes)


def test_the_command_line_exports_and_refuses_in_one_line(setup, tmp_path, capsys):
    _, params, bag = setup
    args = [str(bag), *[f'--params-file={p}' for p in params], '--fps', str(FPS)]
    assert main([*args, '--export-dataset', str(tmp_path / 'ds')]) == 0
    out = capsys.readouterr().out
    assert '2 episodes, 30 frames' in out and "'put it in the box'" in out
    info = json.loads((tmp_path / 'ds/meta/info.json').read_text())
    assert info['codebase_version'] == 'v3.0' and info['features']['observation.images.front']['info'][
        'video.codec'] == 'av1'
    assert main([*args, '--export-dataset', str(tmp_path / 'ds')]) == 1
    assert capsys.readouterr().err.strip().endswith('exists: give a new folder')


class TaskPolicy:
    """Answers zeros and notes the task of every observation."""

    chunk_size = 4

    def __init__(self) -> None:
        self.tasks = []

    def predict_action_chunk(self, observation):
        self.tasks.append(observation['task'])
        return np.zeros((1, self.chunk_size, 6), np.float32)


def test_an_old_latched_instruction_received_after_the_goals_episode_never_labels_its_frames(setup, tmp_path):
    """
    A recorder started mid-goal receives the instruction latched before the goal after the goal's episode.

    The episode, published 1 s before the recording, arrives at 0.3 s, the instruction latched a minute before it
    at 0.6 s. Both apply from the start, in the order published: every frame is the goal's.
    """
    from mcap.reader import make_reader
    from rclpy.serialization import deserialize_message
    from std_msgs.msg import String
    from vla_policy_interfaces.msg import Episode
    settings, _, _ = setup
    source, late = tmp_path / 'one.mcap', tmp_path / 'late.mcap'
    write_synthetic_episode(source, settings, seconds=2.0, image_size=(24, 32), task='put it in the box')
    start = 1_700_000_000 * 10**9
    inserts = [(start + 3 * 10**8, '/vla_policy_node/episode',
                Episode(event=Episode.STARTED, episode=2, instruction='put it in the box'), start - 10**9),
               (start + 6 * 10**8, '/instruction', String(data='pick up the red cube'), start - 60 * 10**9)]
    with open(source, 'rb') as stream, BagWriter(late) as writer:
        for schema, channel, message in make_reader(stream).iter_messages(log_time_order=True):
            while inserts and inserts[0][0] <= message.log_time:
                log_time, topic, msg, published = inserts.pop(0)
                writer.write(topic, msg, log_time, published)
            if channel.topic != '/instruction':
                writer.write(channel.topic, deserialize_message(message.data, import_type(schema.name)),
                             message.log_time)
    episodes = export_bag(str(late), settings, tmp_path / 'ds', fps=FPS)
    assert episodes == export_bag(str(source), settings, tmp_path / 'as_if_latched_in_time', fps=FPS)
    assert episodes == [('put it in the box', 20)]
    policy = TaskPolicy()
    replay(str(late), settings, policy)
    assert set(policy.tasks) == {'put it in the box'} and len(policy.tasks) > 1


def import_type(name):
    from importlib import import_module
    package, _, leaf = name.split('/')
    return getattr(import_module(f'{package}.msg'), leaf)
