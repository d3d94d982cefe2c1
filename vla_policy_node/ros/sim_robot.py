"""
A small simulated robot for the demo: cameras, joint states, an instruction, a command sink.

It stands in for a robot driver plus ros2_control: it publishes synthetic camera frames that
change with the arm's pose, joint states at a fixed rate and one latched instruction, and it
moves each joint toward the latest commanded position at a bounded speed. It also listens to
/diagnostics so that, when ``duration`` has passed, it can print what the policy node did.
"""

from __future__ import annotations

import time

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_policy_node.ros.conversions import rgb_to_image
from vla_policy_node.ros.diagnostics import diagnostics_to_dict
from vla_policy_node.ros.qos import (
    CAMERA_QOS,
    COMMAND_QOS,
    DIAGNOSTICS_QOS,
    INSTRUCTION_QOS,
    JOINT_STATES_QOS,
)


class SimRobot(Node):
    """First-order joint dynamics driven by the policy node's commands."""

    def __init__(self) -> None:
        super().__init__('vla_policy_sim_robot')
        self._joints = list(self.declare_parameter(
            'joint_names', ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex',
                            'wrist_roll', 'gripper']).value)
        cameras = list(self.declare_parameter(
            'camera_topics', ['camera/front/image_raw', 'camera/wrist/image_raw']).value)
        self._size = (self.declare_parameter('image_height', 120).value,
                      self.declare_parameter('image_width', 160).value)
        camera_rate = self.declare_parameter('camera_rate_hz', 15.0).value
        joint_rate = self.declare_parameter('joint_state_rate_hz', 50.0).value
        instruction = self.declare_parameter(
            'instruction', 'pick up the red cube and place it in the bowl').value
        interface = self.declare_parameter('command_interface', 'joint_trajectory').value
        command_topic = self.declare_parameter(
            'command_topic', 'joint_trajectory_controller/joint_trajectory').value
        self._max_velocity = self.declare_parameter('max_velocity', 1.5).value
        self.duration = self.declare_parameter('duration', 0.0).value
        self._positions = np.zeros(len(self._joints))
        self._target = self._positions.copy()
        self._commands = 0
        self._diagnostics: dict[str, dict[str, str]] = {}
        self._last_step = time.monotonic()
        self._joint_pub = self.create_publisher(JointState, '/joint_states', JOINT_STATES_QOS)
        self._camera_pubs = [self.create_publisher(Image, topic, CAMERA_QOS) for topic in cameras]
        instruction_pub = self.create_publisher(String, 'instruction', INSTRUCTION_QOS)
        instruction_pub.publish(String(data=instruction))
        if interface == 'joint_trajectory':
            self.create_subscription(JointTrajectory, command_topic, self._on_trajectory,
                                     COMMAND_QOS)
        else:
            self.create_subscription(Float64MultiArray, command_topic, self._on_forward,
                                     COMMAND_QOS)
        self.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics,
                                 DIAGNOSTICS_QOS)
        self.create_timer(1.0 / joint_rate, self._on_joint_tick)
        self.create_timer(1.0 / camera_rate, self._on_camera_tick)

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        if msg.points:
            order = [msg.joint_names.index(name) for name in self._joints]
            self._set_target(np.asarray(msg.points[0].positions)[order])

    def _on_forward(self, msg: Float64MultiArray) -> None:
        self._set_target(np.asarray(msg.data))

    def _set_target(self, target: np.ndarray) -> None:
        self._target = target
        self._commands += 1

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        self._diagnostics.update(diagnostics_to_dict(msg))

    def _on_joint_tick(self) -> None:
        now = time.monotonic()
        step = self._max_velocity * (now - self._last_step)
        self._last_step = now
        self._positions += np.clip(self._target - self._positions, -step, step)
        msg = JointState(name=self._joints, position=self._positions.tolist())
        msg.header.stamp = self.get_clock().now().to_msg()
        self._joint_pub.publish(msg)

    def _on_camera_tick(self) -> None:
        height, width = self._size
        rows = np.linspace(0, 255, height, dtype=np.float64)[:, None]
        cols = np.linspace(0, 255, width, dtype=np.float64)[None, :]
        for index, publisher in enumerate(self._camera_pubs):
            shift = 40.0 * float(np.sum(self._positions)) + 60.0 * index
            red = np.broadcast_to((rows + shift) % 256, (height, width))
            green = np.broadcast_to((cols + shift) % 256, (height, width))
            blue = np.full((height, width), 128.0)
            rgb = np.stack([red, green, blue], axis=-1).astype(np.uint8)
            msg = rgb_to_image(rgb, frame_id=f'camera_{index}')
            msg.header.stamp = self.get_clock().now().to_msg()
            publisher.publish(msg)

    def summary(self, seconds: float) -> str:
        """Describe the run for a person, from the policy node's last diagnostics."""
        policy = next((v for k, v in self._diagnostics.items() if k.endswith(': policy')), None)
        if policy is None:
            return ('no diagnostics received from vla_policy_node: is it running with the '
                    'same ROS_DOMAIN_ID?')
        lines = [
            f'vla_policy_node demo summary ({seconds:.0f} s)',
            f"  model:               {policy.get('model', '?')}",
            '  NOTE: the weights are random, so the motions are meaningless; this demo shows '
            'the plumbing, the safety limits and the timings.',
            f"  device:              {policy.get('device', '?')}",
            '  (node figures as of its last /diagnostics message)',
            f"  node state:          {policy.get('state', '?')}",
            f"  control steps:       {policy.get('control_steps', '?')}",
            f"  prefix passes:       {policy.get('prefix_passes', '?')}",
            f"  denoise steps:       {policy.get('denoise_steps', '?')}",
            f"  commands published:  {policy.get('commands_published', '?')} "
            f"(holds: {policy.get('holds_published', '?')}, "
            f"clamped joints: {policy.get('clamped_joints', '?')})",
            f'  commands received:   {self._commands} (by this simulated robot)',
        ]
        for stage in ('prefix', 'denoise', 'total'):
            lines.append(
                f'  {stage + " latency:":<21}p50 {policy.get(stage + "_latency_p50_ms", "?")} ms'
                f', p95 {policy.get(stage + "_latency_p95_ms", "?")} ms')
        return '\n'.join(lines)


def main(args: list[str] | None = None) -> int:
    """Run the simulated robot for ``duration`` seconds (0 = until Ctrl-C), then summarise."""
    rclpy.init(args=args)
    robot = SimRobot()
    started = time.monotonic()
    try:
        while rclpy.ok() and (robot.duration <= 0.0
                              or time.monotonic() - started < robot.duration):
            rclpy.spin_once(robot, timeout_sec=0.05)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    print(robot.summary(time.monotonic() - started), flush=True)
    robot.destroy_node()
    rclpy.try_shutdown()
    return 0
