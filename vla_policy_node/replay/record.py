# SPDX-License-Identifier: Apache-2.0
r"""
vla-policy-record: record the node's inputs, commands and diagnostics to a rosbag2 bag (MCAP).

    vla-policy-record BAG --params-file config/default.yaml --params-file config/planar.yaml \\
        [--duration SECONDS] [--ros-args -r __ns:=/arm]

The parameter files are the node's: they name the topics it reads (its cameras, raw or
compressed, the joint states, the instruction) and those it commands (the command groups'),
and ``/diagnostics`` is recorded beside them; relative names resolve in the recorder's
namespace as in the node's. The bag is a rosbag2 folder (``metadata.yaml`` and one ``.mcap``
file, written with ``rosbags``) that ``ros2 bag`` and ``vla-policy-replay`` read. Messages are
stored as DDS delivered them, stamped with their arrival on this process's ROS clock. The
instruction is taken from latched and from volatile publishers, as the node takes it, so a
latched publisher's message is stored once per subscription. Ctrl-C, SIGTERM or the end of
``--duration`` closes the bag.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
import sys
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.utilities import remove_ros_args
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import get_typestore, Stores
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_policy_node.replay.cli import settings_from_files
from vla_policy_node.ros.compressed import camera_topic
from vla_policy_node.ros.params import NodeSettings, ParameterError
from vla_policy_node.ros.qos import (CAMERA_QOS, COMMAND_QOS, DIAGNOSTICS_QOS, INSTRUCTION_QOS,
                                     INSTRUCTION_VOLATILE_QOS, JOINT_STATES_QOS)

NODE_NAME = 'vla_policy_recorder'


def recorded_topics(settings: NodeSettings) -> list[tuple[str, Any, QoSProfile]]:
    """Return (topic, message type, QoS) of every stream recorded for the node ``settings`` configure."""
    topics = [(camera_topic(topic, transport), CompressedImage if transport == 'compressed' else Image, CAMERA_QOS)
              for topic, transport in zip(settings.camera_topics, settings.camera_transports)]
    topics += [(settings.joint_states_topic, JointState, JOINT_STATES_QOS)]
    topics += [(settings.instruction_topic, String, qos) for qos in (INSTRUCTION_QOS, INSTRUCTION_VOLATILE_QOS)]
    topics += [(group.topic, JointTrajectory if group.interface == 'joint_trajectory' else Float64MultiArray,
                COMMAND_QOS) for group in settings.command_groups]
    return topics + [('/diagnostics', DiagnosticArray, DIAGNOSTICS_QOS)]


def type_name(msg_type: Any) -> str:
    """Return the ROS 2 name of an rclpy message class (``sensor_msgs/msg/Image``)."""
    return f"{msg_type.__module__.split('.')[0]}/msg/{msg_type.__name__}"


class Recorder(Node):
    """Raw subscriptions of the node's streams, written to a bag as they arrive."""

    def __init__(self, bag: Path, settings: NodeSettings, **node_options: Any) -> None:
        super().__init__(NODE_NAME, **node_options)
        typestore = get_typestore(Stores.ROS2_KILTED)
        self._writer = Writer(bag, version=9, storage_plugin=StoragePlugin.MCAP)
        self._writer.open()
        self.count = 0
        connections = {}
        for topic, msg_type, qos in recorded_topics(settings):
            name = self.resolve_topic_name(topic)
            if name not in connections:
                connections[name] = self._writer.add_connection(name, type_name(msg_type), typestore=typestore)
            self.create_subscription(msg_type, topic, lambda raw, c=connections[name]: self._write(c, raw),
                                     qos, raw=True)
        self.get_logger().info(f'recording {sorted(connections)} to {bag}')

    def _write(self, connection: Any, raw: bytes) -> None:
        self._writer.write(connection, self.get_clock().now().nanoseconds, raw)
        self.count += 1

    def close(self) -> None:
        """Finish the bag (its metadata and the MCAP summary)."""
        self._writer.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Record until Ctrl-C, SIGTERM or ``--duration``; exit 1 with one line on a bad parameter or bag path."""
    arguments = list(sys.argv if argv is None else ['vla-policy-record', *argv])
    parser = argparse.ArgumentParser(prog='vla-policy-record', description=__doc__.strip().split('\n\n')[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('bag', type=Path, help='the rosbag2 folder to write (must not exist)')
    parser.add_argument('--params-file', action='append', default=[], required=True,
                        help="the node's parameter file(s), later ones win")
    parser.add_argument('-p', '--param', action='append', default=[], metavar='NAME:=VALUE',
                        help='one parameter of the node, as with ros2 run')
    parser.add_argument('--duration', type=float, default=0.0, help='seconds to record; 0: until Ctrl-C')
    args = parser.parse_args(remove_ros_args(arguments)[1:])
    try:
        # Only the topics matter: no policy is loaded, so an empty checkpoint is no reason to refuse.
        settings = settings_from_files(args.params_file, [*args.param, 'allow_random_weights:=true'])
    except (ParameterError, OSError) as error:
        print(f'vla-policy-record: {error}', file=sys.stderr)
        return 1
    if args.bag.exists():
        print(f'vla-policy-record: {args.bag} exists: name a new folder', file=sys.stderr)
        return 1
    rclpy.init(args=arguments)
    recorder = Recorder(args.bag, settings)
    try:
        if args.duration > 0:
            recorder.create_timer(args.duration, lambda: rclpy.try_shutdown())
        rclpy.spin(recorder)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        recorder.close()
        print(f'vla-policy-record: {recorder.count} messages in {args.bag}', flush=True)
        recorder.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
