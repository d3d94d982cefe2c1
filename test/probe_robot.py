# SPDX-License-Identifier: Apache-2.0
"""
A robot played over DDS for the launch and lifecycle tests, in a namespace of its choosing.

It publishes the node's inputs (two cameras, joint states) under ``namespace``, sends
instructions from a volatile publisher (as ``ros2 topic pub`` and rqt do) or a latched one,
records the commands, and calls the node's parameter and lifecycle services.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from lifecycle_msgs.srv import ChangeState, GetState
import numpy as np
from rcl_interfaces.srv import GetParameters
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import parameter_value_to_python
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from ros_harness import wait_until
from vla_policy_node.ros.conversions import rgb_to_image
from vla_policy_node.ros.qos import CAMERA_QOS, COMMAND_QOS, INSTRUCTION_QOS, INSTRUCTION_VOLATILE_QOS, JOINT_STATES_QOS


class ProbeRobot:
    """Cameras, joint states and instructions in ``namespace``; records the node's commands."""

    def __init__(self, domain_id: int, namespace: str, config: dict[str, Any],
                 node_name: str = 'vla_policy_node') -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node('probe_robot', namespace=namespace, context=self.context)
        self.joints = list(config['joint_names'])
        self.target = f"{namespace.rstrip('/')}/{node_name}"
        self._lock = threading.Lock()
        self.commands: list[tuple[float, JointTrajectory]] = []
        self._cameras = [self.node.create_publisher(Image, topic, CAMERA_QOS)
                         for topic in config['camera_topics']]
        self._joint_pub = self.node.create_publisher(JointState, 'joint_states', JOINT_STATES_QOS)
        self._volatile = self.node.create_publisher(String, 'instruction', INSTRUCTION_VOLATILE_QOS)
        self._latched = self.node.create_publisher(String, 'instruction', INSTRUCTION_QOS)
        self.node.create_subscription(JointTrajectory, config['command_topic'], self._on_command,
                                      COMMAND_QOS)
        self._parameters = self.node.create_client(GetParameters, f'{self.target}/get_parameters')
        self._change = self.node.create_client(ChangeState, f'{self.target}/change_state')
        self._state = self.node.create_client(GetState, f'{self.target}/get_state')
        self._reset = self.node.create_client(Trigger, f'{self.target}/reset_episode')
        self._restart = self.node.create_client(Trigger, f'{self.target}/restart_from_measured')
        self.node.create_timer(1.0 / 15.0, self._publish_images)
        self.node.create_timer(1.0 / 50.0, self._publish_joints)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._spinner = threading.Thread(target=self.executor.spin, daemon=True)
        self._spinner.start()

    def _publish_images(self) -> None:
        rgb = np.full((48, 64, 3), 90, dtype=np.uint8)
        for publisher in self._cameras:
            publisher.publish(rgb_to_image(rgb))

    def _publish_joints(self) -> None:
        positions = [0.1 * i for i in range(len(self.joints))]
        self._joint_pub.publish(JointState(name=self.joints, position=positions))

    def _on_command(self, msg: JointTrajectory) -> None:
        with self._lock:
            self.commands.append((time.monotonic(), msg))

    def command_count(self, since: float = 0.0) -> int:
        """Commands received after ``since`` (time.monotonic)."""
        with self._lock:
            return sum(1 for arrived, _ in self.commands if arrived > since)

    def instruct(self, text: str, latched: bool = False, timeout: float = 10.0,
                 wait_for_subscriber: bool = True) -> None:
        """Send a task once a node subscribes (volatile: like ``ros2 topic pub``), or at once."""
        publisher = self._latched if latched else self._volatile
        assert not wait_for_subscriber or wait_until(lambda: publisher.get_subscription_count() > 0, timeout), \
            'nobody subscribes to the instruction'
        publisher.publish(String(data=text))

    def _call(self, client, request, timeout: float, retry_after: float | None = None) -> Any:
        """
        Call a service; with ``retry_after``, call again when no answer came in that time.

        A reply sent before the service's reply writer has matched the client is lost (DDS
        discovery is not atomic): idempotent queries retry, transitions just wait longer.
        """
        end = time.monotonic() + timeout
        assert client.wait_for_service(timeout_sec=timeout), f'{client.srv_name} not available'
        while True:
            future = client.call_async(request)
            left = end - time.monotonic()
            if wait_until(future.done, min(left, retry_after or left)):
                return future.result()
            assert time.monotonic() < end, f'{client.srv_name} did not answer'

    def parameters(self, names: list[str], timeout: float = 30.0) -> dict[str, Any]:
        """Return the node's parameter values, read over its get_parameters service."""
        reply = self._call(self._parameters, GetParameters.Request(names=names), timeout, 3.0)
        return {name: parameter_value_to_python(value) for name, value in zip(names, reply.values)}

    def transition(self, name: str, timeout: float = 120.0) -> bool:
        """Ask the lifecycle node for a transition by label (configure, activate, shutdown...)."""
        request = ChangeState.Request()
        request.transition.label = name
        return self._call(self._change, request, timeout).success

    def start_transition(self, name: str) -> Any:
        """Ask for a transition without waiting for it; returns the call's future."""
        request = ChangeState.Request()
        request.transition.label = name
        assert self._change.wait_for_service(timeout_sec=30.0), f'{self._change.srv_name} not available'
        return self._change.call_async(request)

    def lifecycle_state(self, timeout: float = 30.0) -> str:
        """Return the lifecycle node's current state label."""
        return self._call(self._state, GetState.Request(), timeout, 3.0).current_state.label

    def reset_episode(self, timeout: float = 30.0) -> Any:
        """Call the node's ~/reset_episode; return the reply (success, message)."""
        return self._call(self._reset, Trigger.Request(), timeout)

    def restart_from_measured(self, timeout: float = 30.0) -> Any:
        """Call the node's ~/restart_from_measured; return the reply (success, message)."""
        return self._call(self._restart, Trigger.Request(), timeout)

    def close(self) -> None:
        """Stop spinning and shut the probe's context down."""
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
