# SPDX-License-Identifier: Apache-2.0
"""
vla-policy-record over DDS: every command path in the bag, crashes, full disks, names, load.

A fake node in its own ``rclpy.Context`` publishes what vla_policy_node publishes for recording
(``~/episode``: STARTED and ENDED events of task-action and topic episodes; ``~/command_goals``:
the goals of an action command group and the controller's answers), a topic command group,
and a robot's cameras and joint states. The recorder runs as a process, is stopped by SIGINT,
killed by SIGKILL or starved by a file-size limit; the bag is then read back (and replayed).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
import resource
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from ros_harness import DEFAULT_CONFIG, next_domain_id, OutputProcess, ros_env, wait_until
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint
from unique_identifier_msgs.msg import UUID
from vla_policy_interfaces.msg import CommandGoal, Episode
import yaml

from vla_policy_node.replay.bag import read_messages
from vla_policy_node.replay.bag_replay import replay, settings_from_files
from vla_policy_node.ros.qos import COMMAND_GOALS_QOS, EPISODE_QOS

pytestmark = pytest.mark.dds

JOINTS = ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll', 'gripper']
NAMESPACE = '/arm'
GROUPS = {'commands': {
    'groups': ['arm', 'gripper'],
    'arm': {'interface': 'follow_joint_trajectory', 'topic': 'arm_controller/follow_joint_trajectory',
            'joints': JOINTS[:5]},
    'gripper': {'interface': 'forward_command', 'topic': 'gripper_controller/commands', 'joints': ['gripper']}}}
RECORD = (sys.executable, '-m', 'vla_policy_node.replay.record')
SENSOR_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                        durability=DurabilityPolicy.VOLATILE)
EPISODE = f'{NAMESPACE}/vla_policy_node/episode'
SHM_PROFILE = Path(__file__).resolve().parents[2] / 'config' / 'fastdds_shm.xml'


@pytest.fixture(scope='module')
def params(tmp_path_factory) -> Path:
    """Write the node's parameter file: an arm on follow_joint_trajectory, a gripper on a topic."""
    path = tmp_path_factory.mktemp('record') / 'groups.yaml'
    path.write_text(yaml.safe_dump({'/**': {'ros__parameters': {
        **GROUPS, 'allow_random_weights': True, 'num_threads': 1}}}))
    return path


class FakeNode:
    """Publishes, under /arm, what vla_policy_node and its robot publish while it runs."""

    def __init__(self, domain_id: int, image_shape: tuple[int, int] = (48, 64)) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node('vla_policy_node', namespace=NAMESPACE, context=self.context)
        self.episodes = self.node.create_publisher(Episode, '~/episode', EPISODE_QOS)
        self.goals = self.node.create_publisher(CommandGoal, '~/command_goals', COMMAND_GOALS_QOS)
        self.gripper = self.node.create_publisher(Float64MultiArray, 'gripper_controller/commands', SENSOR_QOS)
        self.cameras = [self.node.create_publisher(Image, f'camera/{name}/image_raw', SENSOR_QOS)
                        for name in ('front', 'wrist')]
        self.joints = self.node.create_publisher(JointState, 'joint_states', SENSOR_QOS)
        height, width = image_shape
        self.image = Image(height=height, width=width, encoding='rgb8', step=3 * width,
                           data=np.random.default_rng(0).integers(0, 255, height * width * 3, np.uint8).tobytes())
        self.goal_number = 0
        self.diagnostics = []
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self.diagnostics.append, 10)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.spinner = threading.Thread(target=self.executor.spin, daemon=True)
        self.spinner.start()

    def wait_for_recorder(self, timeout: float = 20.0) -> None:
        """Wait until the recorder subscribes to every stream."""
        streams = [self.episodes, self.goals, self.gripper, self.joints, *self.cameras]
        assert wait_until(lambda: all(p.get_subscription_count() for p in streams), timeout), 'no recorder'
        time.sleep(0.5)     # the recorder's readers match these writers a moment after (best effort drops before)

    def stamp(self):
        return self.node.get_clock().now().to_msg()

    def episode(self, event: int, number: int, instruction: str = '', goal: bytes = bytes(16),
                outcome: int = 0) -> None:
        self.episodes.publish(Episode(event=event, stamp=self.stamp(), episode=number, instruction=instruction,
                                      goal_id=UUID(uuid=list(goal)), outcome=outcome, reason='test'))

    def goal(self, positions: list[float], answers: tuple[int, ...]) -> None:
        """Publish a SENT goal on the arm's action with its trajectory, then the controller's answers."""
        self.goal_number += 1
        trajectory = JointTrajectory(joint_names=JOINTS[:5], points=[JointTrajectoryPoint(positions=positions)])
        common = dict(group='arm', action=f'{NAMESPACE}/arm_controller/follow_joint_trajectory', goal=self.goal_number)
        self.goals.publish(CommandGoal(event=CommandGoal.SENT, stamp=self.stamp(), trajectory=trajectory, **common))
        for answer in answers:
            self.goals.publish(CommandGoal(event=answer, stamp=self.stamp(), error_code=-1 if answer == 4 else 0,
                                           error_string='tolerance' if answer == 4 else '', **common))

    def sense(self, t: float) -> None:
        """One frame per camera and one joint state."""
        for camera in self.cameras:
            self.image.header.stamp = self.stamp()
            camera.publish(self.image)
        self.joints.publish(JointState(header=self.image.header, name=JOINTS, position=[0.1 * np.sin(t)] * 6))

    def recorder_status(self) -> dict[str, str]:
        """Return the recorder's newest status on /diagnostics, as key -> value."""
        statuses = [status for array in list(self.diagnostics) for status in array.status
                    if status.name.startswith('vla_policy_recorder')]
        return {value.key: value.value for value in statuses[-1].values} if statuses else {}

    def recorders_that_wrote(self, topic: str) -> int:
        """Count the recorders (their bag folders) whose newest /diagnostics says they wrote ``topic``."""
        newest = {status.name: {value.key: value.value for value in status.values}
                  for array in list(self.diagnostics) for status in array.status
                  if status.name.startswith('vla_policy_recorder')}
        return sum(values.get(f'{topic} written', '0') != '0' for values in newest.values())

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


class RecorderProcess(OutputProcess):
    """vla-policy-record in the namespace /arm, run from ``cwd`` (where an unnamed bag goes)."""

    def __init__(self, domain_id: int, params: Path, bag: Path | None, cwd: Path, *extra: str,
                 env: dict[str, str] | None = None, preexec=None) -> None:
        args = [*RECORD, *([str(bag)] if bag else []), '--params-file', str(DEFAULT_CONFIG), '--params-file',
                str(params), *extra, '--ros-args', '-r', f'__ns:={NAMESPACE}']
        self.process = subprocess.Popen(args, env={**ros_env(domain_id), **(env or {})}, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, cwd=cwd, preexec_fn=preexec)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


def session(fake: FakeNode) -> dict[str, int]:
    """Two episodes: a RunInstruction goal's, then one from the instruction topic; goals answered every way."""
    sent = {'sense': 0, 'goals': 0, 'gripper': 0}
    plan = [(1, 'pick up the cube', uuid.uuid4().bytes, [(1, 3), (1, 5), (2,)]),
            (2, 'put it in the box', bytes(16), [(1, 4), (6,), (1, 3)])]
    for number, instruction, goal, answers in plan:
        fake.episode(Episode.STARTED, number, instruction, goal)
        for step in range(12):
            t = number * 10 + step * 0.05
            fake.sense(t)
            sent['sense'] += 1
            if step % 4 == 3:
                fake.goal([0.1 * step] * 5, answers[step // 4])
                sent['goals'] += 1
            fake.gripper.publish(Float64MultiArray(data=[0.01 * step]))
            sent['gripper'] += 1
            time.sleep(0.05)
        fake.episode(Episode.ENDED, number, instruction, goal, outcome=1)
    return sent


@contextmanager
def recording(params: Path, folder: Path) -> Iterator[tuple[FakeNode, RecorderProcess]]:
    """Start a fake node and a recorder writing ``folder / 'bag'``, once it records; stop both after."""
    domain = next_domain_id()
    fake = FakeNode(domain)
    recorder = RecorderProcess(domain, params, folder / 'bag', folder)
    try:
        assert recorder.wait_for_output('recording [', 30.0), recorder.output
        fake.wait_for_recorder()
        yield fake, recorder
    finally:
        recorder.kill()
        fake.close()


def test_a_session_with_action_groups_and_task_episodes_is_recorded_and_replayed(params, tmp_path):
    with recording(params, tmp_path) as (fake, recorder):
        sent = session(fake)
        # Every second the recorder reports each topic's counts on /diagnostics.
        assert wait_until(lambda: fake.recorder_status().get('/arm/joint_states written') == str(sent['sense']), 5.0)
        assert fake.recorder_status()['/arm/joint_states dropped'] == '0', fake.recorder_status()
        recorder.process.send_signal(signal.SIGINT)
        assert recorder.wait(20.0) == 0, recorder.output
    messages = list(read_messages(tmp_path / 'bag'))
    by_topic = {}
    for topic, _, msg, _ in messages:
        by_topic.setdefault(topic, []).append(msg)
    goals = by_topic['/arm/vla_policy_node/command_goals']
    assert [m.event for m in goals if m.event == CommandGoal.SENT] == [0] * sent['goals']
    assert sorted(m.event for m in goals if m.event) == sorted([1, 3, 1, 5, 2, 1, 4, 6, 1, 3])
    episodes = by_topic['/arm/vla_policy_node/episode']
    assert [(m.event, m.episode, m.instruction) for m in episodes] == [
        (0, 1, 'pick up the cube'), (1, 1, 'pick up the cube'), (0, 2, 'put it in the box'),
        (1, 2, 'put it in the box')]
    assert len(by_topic['/arm/gripper_controller/commands']) == sent['gripper']
    assert len(by_topic['/arm/joint_states']) == sent['sense']
    assert '0 dropped' in recorder.output, recorder.output
    settings = settings_from_files([str(DEFAULT_CONFIG), str(params)])
    result = replay(str(tmp_path / 'bag'), settings, ConstantPolicy(), namespace=NAMESPACE)
    assert result.goals['arm'] == {'sent': 6, 'accepted': 4, 'rejected': 1, 'succeeded': 2, 'aborted': 1,
                                   'canceled': 1, 'no_response': 1}
    assert result.chunks > 0 and len(result.recorded) == sent['goals'] + sent['gripper']
    assert set(ConstantPolicy.tasks) == {'pick up the cube', 'put it in the box'}
    summary = result.summary()['joints']      # the arm's commands came only as goals: each joint is compared
    assert all(row['points'] > 0 and np.isfinite(row['mae']) for row in summary.values()), summary


class ConstantPolicy:
    """Answers zeros and notes the task of every observation."""

    chunk_size = 4
    tasks: list[str] = []

    def predict_action_chunk(self, observation):
        ConstantPolicy.tasks.append(observation['task'])
        return np.zeros((1, self.chunk_size, len(JOINTS)), np.float32)


def recorded_before_crash(recorder: OutputProcess, fake: FakeNode, seconds: float) -> int:
    """Publish joint states until the recorder has run ``seconds``; return how many were sent."""
    sent, end = 0, time.monotonic() + seconds
    while time.monotonic() < end and recorder.process.poll() is None:
        fake.sense(sent * 0.01)
        sent += 1
        time.sleep(0.01)
    return sent


def test_sigkill_leaves_a_bag_that_holds_what_was_written_before(params, tmp_path):
    with recording(params, tmp_path) as (fake, recorder):
        fake.episode(Episode.STARTED, 1, 'pick up the cube')
        sent = recorded_before_crash(recorder, fake, 2.5)
        recorder.process.kill()
        recorder.wait(10.0)
    # The file ends as a closed one between chunk writes (each a few kB here, written in microseconds):
    # rosbag2 readers open the folder as the kill left it.
    from rosbags.highlevel import AnyReader
    with AnyReader([tmp_path / 'bag']) as reader:
        as_left = sum(1 for connection, _, _ in reader.messages() if connection.topic == '/arm/joint_states')
    # Chunks close every 0.2 s: at most the last 0.2 s (20 states) plus what was in flight are lost.
    assert sent - 40 <= as_left <= sent, (as_left, sent)
    from vla_policy_node.replay.bag import end_unfinished
    for ended in end_unfinished(tmp_path / 'bag'):          # metadata.yaml brought to the file's counts
        assert ended.cut_bytes == 0 and ended.counts['/arm/joint_states'] == as_left
    joints = [m for topic, _, m, _ in read_messages(tmp_path / 'bag') if topic == '/arm/joint_states']
    metadata = yaml.safe_load((tmp_path / 'bag' / 'metadata.yaml').read_text())['rosbag2_bagfile_information']
    assert len(joints) == as_left and metadata['message_count'] == sum(1 for _ in read_messages(tmp_path / 'bag'))
    # Each message's DDS source timestamp is its publish time (the episode was published before it arrived); the
    # unindexed file, in arrival order, reads with the episode at its publication (or the bag's first message).
    from mcap.reader import make_reader
    with open(tmp_path / 'bag' / 'bag_0.mcap', 'rb') as stream:
        episode = [m for _, channel, m in make_reader(stream).iter_messages(log_time_order=False)
                   if channel.topic == EPISODE]
    assert len(episode) == 1 and 0 < episode[0].log_time - episode[0].publish_time < 5 * 10**9, episode
    taken = [t for topic, _, m, t in read_messages(tmp_path / 'bag', latched={EPISODE}) if topic == EPISODE]
    assert len(taken) == 1 and episode[0].publish_time <= taken[0] <= episode[0].log_time, (taken, episode)


def test_a_file_size_limit_ends_the_recording_with_one_line_and_a_readable_bag(params, tmp_path):
    domain = next_domain_id()
    fake = FakeNode(domain, image_shape=(240, 320))
    limit = 3 << 20

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    recorder = RecorderProcess(domain, params, tmp_path / 'bag', tmp_path, preexec=limit_file_size)
    try:
        assert recorder.wait_for_output('recording [', 30.0), recorder.output
        fake.wait_for_recorder()
        recorded_before_crash(recorder, fake, 10.0)
        assert recorder.wait(10.0) == 1, recorder.output
    finally:
        recorder.kill()
        fake.close()
    lines = [line for line in recorder.lines if line.startswith('vla-policy-record:')]
    assert len(lines) == 1 and 'File too large' in lines[0] and 'Traceback' not in recorder.output, recorder.output
    frames = [m for topic, _, m, _ in read_messages(tmp_path / 'bag') if topic == '/arm/camera/front/image_raw']
    assert len(frames) > 3 and (tmp_path / 'bag' / 'bag_0.mcap').stat().st_size <= limit
    assert ' dropped' in recorder.output


def test_two_recorders_started_in_the_same_second_in_one_folder_both_record(params, tmp_path):
    """Unnamed bags in one folder; one ends with --duration by itself, the other by SIGTERM: both exit 0."""
    domain = next_domain_id()
    fake = FakeNode(domain)
    recorders = [RecorderProcess(domain, params, None, tmp_path, '--duration', '6'),
                 RecorderProcess(domain, params, None, tmp_path)]
    try:
        for recorder in recorders:
            assert recorder.wait_for_output('recording [', 30.0), recorder.output
        fake.wait_for_recorder()
        fake.episode(Episode.STARTED, 1, 'pick up the cube')
        assert wait_until(lambda: fake.recorders_that_wrote('/arm/vla_policy_node/episode') == 2, 5.0)
        recorders[1].process.send_signal(signal.SIGTERM)
        assert [recorder.wait(20.0) for recorder in recorders] == [0, 0], recorders[0].output + recorders[1].output
    finally:
        for recorder in recorders:
            recorder.kill()
        fake.close()
    bags = sorted(tmp_path.glob('vla_policy_arm_*'))
    assert len(bags) == 2, bags
    for bag in bags:
        assert [m.instruction for topic, _, m, _ in read_messages(bag) if topic.endswith('/episode')] == [
            'pick up the cube']


def test_two_cameras_640x480_at_30_hz_and_joints_at_200_hz_lose_no_frame_unreported(params, tmp_path):
    """Every frame sent is in the bag, or counted as dropped or lost in the recorder's summary."""
    domain = next_domain_id()
    env = {'FASTDDS_DEFAULT_PROFILES_FILE': str(SHM_PROFILE)}
    recorder = RecorderProcess(domain, params, tmp_path / 'bag', tmp_path, env=env)
    publisher = OutputProcess([sys.executable, '-m', 'benchmarks.camera_load', '--seconds', '3'],
                              {**ros_env(domain), **env})
    try:
        assert recorder.wait_for_output('recording [', 30.0), recorder.output
        assert publisher.wait(60.0) == 0, publisher.output
        sent = {line.split()[1]: int(line.split()[2]) for line in publisher.lines if line.startswith('sent ')}
        time.sleep(0.5)
        recorder.process.send_signal(signal.SIGINT)
        assert recorder.wait(30.0) == 0, recorder.output
    finally:
        recorder.kill()
        publisher.kill()
    counts = {}
    for topic, *_ in read_messages(tmp_path / 'bag'):
        counts[topic] = counts.get(topic, 0) + 1
    summary = {line.split()[0]: [int(word) for word in line.split() if word.isdigit()]
               for line in recorder.lines if line.startswith('  /')}
    for topic in ('/arm/camera/front/image_raw', '/arm/camera/wrist/image_raw', '/arm/joint_states'):
        received, written, dropped, lost = summary[topic]
        assert sent[topic] >= 60 and written == counts.get(topic, 0), (topic, summary[topic], counts)
        assert written + dropped + lost == sent[topic], (topic, sent[topic], summary[topic], recorder.output)
