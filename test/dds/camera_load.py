# SPDX-License-Identifier: Apache-2.0
"""
Two 640x480 rgb8 cameras at 30 Hz and joint states at 200 Hz under /arm, for SECONDS (a test's load).

Waits until every stream has a subscriber, publishes best effort (the drivers' sensor QoS) on
a fixed schedule and prints ``sent <topic> <count>`` per stream at the end.
"""

import sys
import time

import numpy as np
import rclpy
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState

JOINTS = ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll', 'gripper']


def main(seconds: float) -> int:
    rclpy.init()
    node = rclpy.create_node('camera_load', namespace='/arm')
    cameras = [node.create_publisher(Image, f'camera/{name}/image_raw', qos_profile_sensor_data)
               for name in ('front', 'wrist')]
    joints = node.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
    streams = [*cameras, joints]
    end = time.monotonic() + 30.0
    while not all(p.get_subscription_count() for p in streams) and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(0.5)         # let every reader finish matching
    image = Image(height=480, width=640, encoding='rgb8', step=640 * 3,
                  data=np.random.default_rng(0).integers(0, 255, 480 * 640 * 3, np.uint8).tobytes())
    counts = dict.fromkeys(streams, 0)
    start = time.monotonic()
    tick = 0
    while tick * 0.005 < seconds:           # 200 Hz: joints every tick, frames every 33.3 ms
        time.sleep(max(0.0, start + tick * 0.005 - time.monotonic()))
        stamp = node.get_clock().now().to_msg()
        joints.publish(JointState(name=JOINTS, position=[0.0] * 6))
        counts[joints] += 1
        if tick % 20 in (0, 7, 14):         # 3 of every 20 ticks of 5 ms: 30 Hz
            for camera in cameras:
                image.header.stamp = stamp
                camera.publish(image)
                counts[camera] += 1
        tick += 1
    for publisher, count in counts.items():
        print(f'sent {publisher.topic_name} {count}', flush=True)
    time.sleep(1.0)             # best effort: let the last samples leave before the writers go
    node.destroy_node()
    rclpy.shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main(float(sys.argv[1])))
