# SPDX-License-Identifier: Apache-2.0
r"""
vla-policy-record: record the node's inputs, commands, episodes and diagnostics to a rosbag2 bag (MCAP).

    vla-policy-record [BAG] --params-file config/default.yaml --params-file config/planar.yaml \\
        [--duration SECONDS] [--node vla_policy_node] [--ros-args -r __ns:=/arm]

The parameter files are the node's: they name the topics it reads (its cameras, raw or
compressed, the joint states, the instruction) and the topic command groups it publishes;
beside them the node's ``~/command_goals`` (every goal sent to a ros2_control action and the
controller's answers), its ``~/episode`` (the instruction and goal of every episode, its end)
and ``/diagnostics`` are recorded. Relative names resolve in the recorder's namespace as in
the node's. Without BAG the folder is ``vla_policy[_<namespace>]_<date>_<time>_<microseconds>``
in the working folder (a counter is added if it exists), so recorders never share a bag.

The subscriptions only queue the serialized messages; a writer thread writes them
(``recording``) to a bag that a crash leaves readable (``recording_bag``). Messages are stored
as DDS delivered them, in the order they arrived: the log time is the arrival on this process's
ROS clock, the publish time DDS's source timestamp (``latched``: replay and export take the
instruction and episodes by it, as a late reader receives them late). What could not
be written (the queue full, the disk full) is counted per topic, reported on ``/diagnostics``
every second and in the summary at the end. Ctrl-C, SIGTERM or the end of ``--duration``
closes the bag (exit 0); a full disk or file-size limit ends the recording with one line and
exit 1, the bag ended after its last complete chunk. Bad arguments end in one line before
anything is recorded: exit 2 for usage, 1 otherwise.
"""

from __future__ import annotations

import argparse
import errno
from collections.abc import Sequence
import math
import os
from pathlib import Path
import signal
import sys
import threading
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import remove_ros_args
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray, Header, String
from trajectory_msgs.msg import JointTrajectory
from vla_policy_interfaces.msg import CommandGoal, Episode

from vla_policy_node.replay.bag_replay import settings_from_files
from vla_policy_node.replay.recording import Recording
from vla_policy_node.replay.recording_bag import RecordingBag
from vla_policy_node.ros.command_groups import ACTION_INTERFACES
from vla_policy_node.ros.compressed import camera_topic
from vla_policy_node.ros.params import NodeSettings, ParameterError
from vla_policy_node.ros.qos import (COMMAND_GOALS_QOS, COMMAND_QOS, DIAGNOSTICS_QOS, EPISODE_QOS, INSTRUCTION_QOS,
                                     INSTRUCTION_VOLATILE_QOS, JOINT_STATES_QOS)

NODE_NAME = 'vla_policy_recorder'
PROG = 'vla-policy-record'
MAX_DURATION = 365 * 24 * 3600.0
DIAGNOSTICS_PERIOD = 1.0
PUBLISHERS_PERIOD = 0.1
SPIN_PERIOD = 0.1          # s: how soon a signal or the end of --duration is seen
DRAIN_QUIET, DRAIN_LIMIT = 0.2, 3.0   # s: after the stop, take delivered messages until quiet, at most
# Best effort (the drivers' sensor QoS) with room for a second of frames: the callback only queues,
# so the history never fills unless the process stalls.
RECORD_CAMERA_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=30, reliability=ReliabilityPolicy.BEST_EFFORT,
                               durability=DurabilityPolicy.VOLATILE)


def recorded_topics(settings: NodeSettings, node: str = 'vla_policy_node') -> list[tuple[str, Any, QoSProfile]]:
    """Return (topic, message type, QoS) of every stream recorded for the node ``settings`` configure."""
    topics = [(camera_topic(topic, transport), CompressedImage if transport == 'compressed' else Image,
               RECORD_CAMERA_QOS) for topic, transport in zip(settings.camera_topics, settings.camera_transports)]
    topics += [(settings.joint_states_topic, JointState, JOINT_STATES_QOS)]
    topics += [(settings.instruction_topic, String, qos) for qos in (INSTRUCTION_QOS, INSTRUCTION_VOLATILE_QOS)]
    topics += [(group.topic, JointTrajectory if group.interface == 'joint_trajectory' else Float64MultiArray,
                COMMAND_QOS) for group in settings.command_groups if group.interface not in ACTION_INTERFACES]
    topics += [(f'{node}/episode', Episode, EPISODE_QOS), (f'{node}/command_goals', CommandGoal, COMMAND_GOALS_QOS)]
    return topics + [('/diagnostics', DiagnosticArray, DIAGNOSTICS_QOS)]


def type_name(msg_type: Any) -> str:
    """Return the ROS 2 name of an rclpy message class (``sensor_msgs/msg/Image``)."""
    return f"{msg_type.__module__.split('.')[0]}/msg/{msg_type.__name__}"


def new_bag_folder(bag: Path | None, namespace: str) -> Path:
    """Create the bag's folder (atomically: two recorders never get the same); OSError if it cannot be made."""
    if bag is not None:
        try:
            bag.mkdir()
        except FileExistsError:
            raise FileExistsError(errno.EEXIST, 'it exists: name a new folder') from None
        return bag
    stamp = time.time()
    parts = ['vla_policy', namespace.strip('/').replace('/', '_'),
             time.strftime('%Y%m%d_%H%M%S', time.localtime(stamp)) + f'_{int(stamp % 1 * 1e6):06d}']
    base = Path('_'.join(part for part in parts if part))
    for attempt in range(1, 1000):
        folder = base if attempt == 1 else base.with_name(f'{base.name}_{attempt}')
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f'{base}: no free name')


def remove_empty_bag(folder: Path) -> None:
    """Remove a bag folder that holds nothing recorded (a start that failed)."""
    for leftover in folder.iterdir():
        leftover.unlink()
    folder.rmdir()


class Recorder(Node):
    """Raw subscriptions of the node's streams, queued for the bag's writer thread."""

    def __init__(self, folder: Path | None, settings: NodeSettings, node: str = 'vla_policy_node',
                 **node_options: Any) -> None:
        """``folder``: the bag's, made and empty; None: a new one named after the namespace here."""
        super().__init__(NODE_NAME, **node_options)
        self.stop = threading.Event()       # Ctrl-C, SIGTERM, --duration or a failed write
        streams = [(self.resolve_topic_name(topic), msg_type, qos) for topic, msg_type, qos
                   in recorded_topics(settings, node)]
        names = list(dict.fromkeys(name for name, _, _ in streams))
        types = {name: type_name(msg_type) for name, msg_type, _ in streams}
        self.folder = folder or new_bag_folder(None, self.get_namespace())
        try:
            self.bag = RecordingBag(self.folder, [(name, types[name]) for name in names])
        except BaseException:
            remove_empty_bag(self.folder)
            raise
        self.recording = Recording(self.bag, names, lambda: self.get_clock().now().nanoseconds,
                                   on_failure=lambda error: self.stop.set())
        self._sensors = [names.index(name) for name, _, qos in streams
                         if qos.reliability == ReliabilityPolicy.BEST_EFFORT]
        for name, msg_type, qos in streams:
            index = names.index(name)
            self.create_subscription(msg_type, name, lambda raw, info, i=index: self.recording.put(
                i, raw, info['publication_sequence_number'], info['source_timestamp']), qos, raw=True)
        self._diagnostics = self.create_publisher(DiagnosticArray, '/diagnostics', DIAGNOSTICS_QOS)
        self.create_timer(DIAGNOSTICS_PERIOD, self._publish_diagnostics)
        self.create_timer(PUBLISHERS_PERIOD, self._count_publishers)
        self.get_logger().info(f'recording {names} to {self.folder}')

    def _count_publishers(self) -> None:
        """Sensor streams with one publisher: a gap in its sequence numbers is frames DDS lost."""
        for index in self._sensors:
            self.recording.counts[index].single_publisher = self.count_publishers(self.recording.topics[index]) == 1

    def _publish_diagnostics(self) -> None:
        counts = self.recording.counts
        dropped = sum(c.dropped + c.lost for c in counts)
        status = DiagnosticStatus(
            level=DiagnosticStatus.WARN if dropped or self.recording.error else DiagnosticStatus.OK,
            name=f'{NODE_NAME}: {self.folder}', hardware_id=str(self.folder),
            message=f'{dropped} messages dropped' if dropped else 'recording')
        status.values = [KeyValue(key='queued_bytes', value=str(self.recording.queued_bytes)),
                         KeyValue(key='queue_peak_bytes', value=str(self.recording.peak_bytes))] + [
            KeyValue(key=f'{topic} {field}', value=str(getattr(c, field)))
            for topic, c in zip(self.recording.topics, counts) for field in ('received', 'written', 'dropped', 'lost')]
        self._diagnostics.publish(DiagnosticArray(header=Header(stamp=self.get_clock().now().to_msg()),
                                                  status=[status]))

    def summary(self) -> list[str]:
        """One line for the bag, then one per topic: received, written, dropped."""
        counts = self.recording.counts
        written, dropped = sum(c.written for c in counts), sum(c.dropped + c.lost for c in counts)
        size = sum(path.stat().st_size for path in self.folder.iterdir()) / 1e6
        lines = [f'recorded {written} messages ({size:.1f} MB) in {self.folder}, {dropped} dropped']
        width = max(len(topic) for topic in self.recording.topics)
        return lines + [f'  {topic:<{width}}  {c.received:>7} received {c.written:>7} written {c.dropped:>7} dropped '
                        f'{c.lost:>7} lost before arriving' for topic, c in zip(self.recording.topics, counts)]


def duration(text: str) -> float:
    """Read --duration: finite seconds in [0, a year] (ArgumentTypeError otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not a number of seconds') from None
    if not math.isfinite(value) or not 0.0 <= value <= MAX_DURATION:
        raise argparse.ArgumentTypeError(f'{text} must be finite seconds in [0, {MAX_DURATION:.0f}] (0: until Ctrl-C)')
    return value


def parse(arguments: list[str]) -> argparse.Namespace:
    """Parse and check the command line (SystemExit 2 with one line on a usage error)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.strip().split('\n\n')[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('bag', type=Path, nargs='?', default=None,
                        help='the rosbag2 folder to write (must not exist); none: a new '
                        'vla_policy_[<namespace>_]<time> here')
    parser.add_argument('--params-file', action='append', default=[], required=True,
                        help="the node's parameter file(s), later ones win")
    parser.add_argument('-p', '--param', action='append', default=[], metavar='NAME:=VALUE',
                        help='one parameter of the node, as with ros2 run')
    parser.add_argument('--duration', type=duration, default=0.0, help='seconds to record; 0: until Ctrl-C')
    parser.add_argument('--node', default='vla_policy_node',
                        help="the node's name, for its ~/episode and ~/command_goals")
    try:
        ros_free = remove_ros_args(arguments)
    except Exception as error:  # noqa: B902 - rclpy's RCLInvalidROSArgsError, UnknownROSArgsError
        parser.error(f"bad --ros-args: {str(error).splitlines()[0].split('. Error:')[0][:200]}")
    return parser.parse_args(ros_free[1:])


def main(argv: Sequence[str] | None = None) -> int:
    """Record until Ctrl-C, SIGTERM or ``--duration``; exit 1 with one line on a bad value, bag or full disk."""
    arguments = list(sys.argv if argv is None else [PROG, *argv])
    args = parse(arguments)
    try:
        # Only the topics matter: no policy is loaded, so an empty checkpoint is no reason to refuse.
        settings = settings_from_files(args.params_file, [*args.param, 'allow_random_weights:=true'])
    except (ParameterError, OSError) as error:
        print(f'{PROG}: {error}', file=sys.stderr)
        return 1
    try:
        folder = None if args.bag is None else new_bag_folder(args.bag, '')
    except OSError as error:
        print(f'{PROG}: cannot make the bag {args.bag}: {error.strerror or error}', file=sys.stderr)
        return 1
    # A file-size limit must end the recording like a full disk (EFBIG), not kill it without its end.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    rclpy.init(args=arguments, signal_handler_options=SignalHandlerOptions.NO)   # _run stops on Ctrl-C, SIGTERM
    try:
        recorder = Recorder(folder, settings, args.node)
    except (OSError, ValueError) as error:
        print(f'{PROG}: cannot record to {folder or "a new folder"}: {error}', file=sys.stderr)
        if folder is not None and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        rclpy.try_shutdown()
        return 1
    return _run(recorder, args.duration)


def _run(recorder: Recorder, seconds: float) -> int:
    """Spin until told to stop, then take what DDS already delivered, close the bag and print the summary."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: recorder.stop.set())
    executor = SingleThreadedExecutor(context=recorder.context)
    executor.add_node(recorder)
    end = time.monotonic() + (seconds or math.inf)
    try:
        while not recorder.stop.is_set() and time.monotonic() < end and recorder.context.ok():
            executor.spin_once(timeout_sec=SPIN_PERIOD)
        _drain(executor, recorder.recording)
    finally:
        recorder.recording.close()
        error = recorder.recording.error
        if error is not None:
            print(f'{PROG}: writing {recorder.folder} failed ({os.strerror(error.errno) if error.errno else error}): '
                  'the disk is full or a file-size limit was reached; the bag ends after its last complete chunk',
                  file=sys.stderr, flush=True)
        print('\n'.join(recorder.summary()), flush=True)
        executor.shutdown()
        recorder.destroy_node()
        rclpy.try_shutdown()
    return 1 if recorder.recording.error is not None else 0


def _drain(executor: SingleThreadedExecutor, recording: Recording) -> None:
    """Take the messages DDS delivered before the stop (a backlog of frames) until none came for DRAIN_QUIET s."""
    def received() -> int:
        return sum(c.received for c in recording.counts)

    end, quiet_since, seen = time.monotonic() + DRAIN_LIMIT, time.monotonic(), received()
    while recording.error is None and time.monotonic() < end and time.monotonic() - quiet_since < DRAIN_QUIET:
        executor.spin_once(timeout_sec=DRAIN_QUIET / 4)
        if received() != seen:
            quiet_since, seen = time.monotonic(), received()


if __name__ == '__main__':
    sys.exit(main())
