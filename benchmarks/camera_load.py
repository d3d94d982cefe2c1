# SPDX-License-Identifier: Apache-2.0
"""
A robot's sensor load under /arm: 640x480 rgb8 cameras (two at 30 Hz) and joint states (200 Hz).

Waits until every stream has its subscribers (``--subscribers``), publishes best effort (the drivers' sensor QoS) on
a fixed schedule for ``--seconds`` and prints ``sent <topic> <count>`` per stream at the end.
Used by ``test/dds/test_record.py`` and ``benchmarks.record_load``. Run with the shared-memory
profile (``config/fastdds_shm.xml``): full-size frames do not cross the default transport.

Run: ``python -m benchmarks.camera_load --seconds 3 [--cameras 2 --fps 30 --joint-hz 200]``.
"""

import argparse
import sys
import time

import numpy as np
import rclpy
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from vla_policy_node.ros.qos import INSTRUCTION_QOS

JOINTS = ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll', 'gripper']


def main() -> int:
    """Publish the load; exit 0 after printing what was sent."""
    parser = argparse.ArgumentParser(description=__doc__.strip().split('\n\n')[0])
    parser.add_argument('--seconds', type=float, default=3.0)
    parser.add_argument('--cameras', type=int, default=2, help='camera/front, camera/wrist, camera/c2, ...')
    parser.add_argument('--fps', type=float, default=30.0)
    parser.add_argument('--joint-hz', type=float, default=200.0)
    parser.add_argument('--instruction', default='', help='publish this task first (latched), so a node acts')
    parser.add_argument('--subscribers', type=int, default=1, help='wait for this many readers of every stream')
    args = parser.parse_args()
    rclpy.init()
    node = rclpy.create_node('camera_load', namespace='/arm')
    names = (['front', 'wrist'] + [f'c{i}' for i in range(2, args.cameras)])[:args.cameras]
    cameras = [node.create_publisher(Image, f'camera/{name}/image_raw', qos_profile_sensor_data) for name in names]
    joints = node.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
    streams = [*cameras, joints]
    if args.instruction:
        task = node.create_publisher(String, 'instruction', INSTRUCTION_QOS)
        task.publish(String(data=args.instruction))
    print('waiting for subscribers', flush=True)
    end = time.monotonic() + 30.0
    while min(p.get_subscription_count() for p in streams) < args.subscribers and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(0.5)         # let every reader finish matching
    image = Image(height=480, width=640, encoding='rgb8', step=640 * 3,
                  data=np.random.default_rng(0).integers(0, 255, 480 * 640 * 3, np.uint8).tobytes())
    counts = dict.fromkeys(streams, 0)
    start = time.monotonic()
    schedule = [(k / args.joint_hz, joints) for k in range(int(args.seconds * args.joint_hz))]
    schedule += [(k / args.fps, camera) for k in range(int(args.seconds * args.fps)) for camera in cameras]
    for at, publisher in sorted(schedule, key=lambda item: item[0]):
        time.sleep(max(0.0, start + at - time.monotonic()))
        if publisher is joints:
            joints.publish(JointState(name=JOINTS, position=[0.0] * 6))
        else:
            image.header.stamp = node.get_clock().now().to_msg()
            publisher.publish(image)
        counts[publisher] += 1
    for publisher, count in counts.items():
        print(f'sent {publisher.topic_name} {count}', flush=True)
    time.sleep(1.0)             # best effort: let the last samples leave before the writers go
    node.destroy_node()
    rclpy.shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
