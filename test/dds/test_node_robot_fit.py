# SPDX-License-Identifier: Apache-2.0
"""
The installed node fitted to an SO-101-like setup, over DDS.

Training units (degrees, gripper percent), the arm on a joint_trajectory_controller topic with
velocities and the gripper on a forward_command_controller topic, a jpeg camera as
image_transport publishes it next to a raw one.
"""

from __future__ import annotations

import math
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from ros_harness import DEFAULT_CONFIG, next_domain_id, node_with_probe, wait_until
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory
import yaml

from vla_policy_node.ros.compressed import rgb_to_compressed
from vla_policy_node.ros.conversions import rgb_to_image
from vla_policy_node.ros.diagnostics import diagnostics_to_dict
from vla_policy_node.ros.qos import CAMERA_QOS, COMMAND_QOS, DIAGNOSTICS_QOS, INSTRUCTION_QOS, JOINT_STATES_QOS

pytestmark = pytest.mark.dds

CONFIG = yaml.safe_load(DEFAULT_CONFIG.read_text())['/**']['ros__parameters']
JOINTS = CONFIG['joint_names']
ARM_TOPIC, GRIPPER_TOPIC = '/arm_controller/joint_trajectory', '/gripper_controller/commands'
FIT = {
    'camera_transports': ['compressed', 'raw'],
    'joint_units': {'scale': [180.0 / math.pi] * 5 + [100.0 / 1.91986],
                    'offset': [0.0] * 5 + [-0.17453]},
    'commands': {
        'groups': ['arm', 'gripper'],
        'arm': {'interface': 'joint_trajectory', 'topic': ARM_TOPIC, 'joints': JOINTS[:5]},
        'gripper': {'interface': 'forward_command', 'topic': GRIPPER_TOPIC, 'joints': ['gripper']},
    },
    'trajectory_velocities': True,
}


class FitProbe:
    """A jpeg front camera, a raw wrist camera, joint states; records both controllers' commands."""

    def __init__(self, domain_id: int) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node('fit_probe', context=self.context)
        self.mode = 'good'
        self.arm: list[JointTrajectory] = []
        self.gripper: list[Float64MultiArray] = []
        self.status: dict[str, str] = {}
        self._lock = threading.Lock()
        self._front = self.node.create_publisher(
            CompressedImage, CONFIG['camera_topics'][0] + '/compressed', CAMERA_QOS)
        self._wrist = self.node.create_publisher(Image, CONFIG['camera_topics'][1], CAMERA_QOS)
        self._joints = self.node.create_publisher(JointState, '/joint_states', JOINT_STATES_QOS)
        self._instruction = self.node.create_publisher(String, 'instruction', INSTRUCTION_QOS)
        self.node.create_subscription(JointTrajectory, ARM_TOPIC, self._record(self.arm), COMMAND_QOS)
        self.gripper_subscription = self.node.create_subscription(
            Float64MultiArray, GRIPPER_TOPIC, self._record(self.gripper), COMMAND_QOS)
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics,
                                      DIAGNOSTICS_QOS)
        self._jpeg = rgb_to_compressed(np.full((48, 64, 3), 90, np.uint8), 'jpeg')
        self.node.create_timer(1.0 / 15.0, self._publish_images)
        self.node.create_timer(1.0 / 50.0, self._publish_joints)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        threading.Thread(target=self.executor.spin, daemon=True).start()
        self._instruction.publish(String(data='pick up the red cube'))

    def _record(self, into: list):
        def callback(msg) -> None:
            with self._lock:
                into.append(msg)
        return callback

    def _publish_images(self) -> None:
        front = CompressedImage(format=self._jpeg.format, data=self._jpeg.data)
        if self.mode == 'bad_jpeg':
            front.data = b'\xff\xd8 not a jpeg'
        self._front.publish(front)
        self._wrist.publish(rgb_to_image(np.full((48, 64, 3), 60, np.uint8)))

    def _publish_joints(self) -> None:
        self._joints.publish(JointState(name=JOINTS, position=[0.1, -0.2, 0.3, 0.0, 0.2, 0.5]))

    def _on_diagnostics(self, msg) -> None:
        for name, values in diagnostics_to_dict(msg).items():
            if name.endswith(': policy'):
                with self._lock:
                    self.status = values

    def state(self) -> str:
        with self._lock:
            return self.status.get('state', '')

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return len(self.arm), len(self.gripper)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def test_so101_fit_end_to_end(tmp_path):
    override = tmp_path / 'fit.yaml'
    override.write_text(yaml.safe_dump({'/**': {'ros__parameters': FIT}}))
    with node_with_probe([DEFAULT_CONFIG, override], next_domain_id(), FitProbe) as (node, probe):
        assert wait_until(lambda: min(probe.counts()) >= 10, 30.0), node.output
        assert wait_until(lambda: probe.state() == 'commanding', 5.0), probe.state()
        lower, upper = np.array(CONFIG['limits']['lower']), np.array(CONFIG['limits']['upper'])
        with probe._lock:
            arm, gripper = list(probe.arm), list(probe.gripper)
        for trajectory in arm:
            assert trajectory.joint_names == JOINTS[:5]
            assert (trajectory.header.stamp.sec, trajectory.header.stamp.nanosec) == (0, 0)
            points = np.array([p.positions for p in trajectory.points])
            speeds = np.array([p.velocities for p in trajectory.points])
            assert speeds.shape == points.shape and np.all(speeds[-1] == 0.0)
            assert np.all(np.abs(speeds) <= np.array(CONFIG['limits']['max_velocity'][:5]) + 1e-9)
            assert np.all(points >= lower[:5] - 1e-9) and np.all(points <= upper[:5] + 1e-9)
        assert all(len(msg.data) == 1 for msg in gripper)
        assert all(lower[5] - 1e-9 <= msg.data[0] <= upper[5] + 1e-9 for msg in gripper)

        probe.mode = 'bad_jpeg'       # a broken frame holds the robot, as a bad raw frame does
        assert wait_until(lambda: probe.state().startswith('holding: front'), 5.0), probe.state()
        assert 'compressed image is not a valid jpeg' in node.output
        probe.mode = 'good'
        assert wait_until(lambda: probe.state() == 'commanding', 10.0), probe.state()

        probe.node.destroy_subscription(probe.gripper_subscription)   # the gripper controller goes
        assert wait_until(lambda: probe.state() == f'holding: nobody subscribes to {GRIPPER_TOPIC}',
                          5.0), probe.state()
        count = probe.counts()[0]
        time.sleep(0.5)
        assert probe.counts()[0] <= count + 1, 'the arm kept moving without the gripper controller'
