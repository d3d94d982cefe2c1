# SPDX-License-Identifier: Apache-2.0
"""
Command groups served by ros2_control's actions: FollowJointTrajectory (arm) and GripperCommand.

The node runs as a process with the arm on ``arm_controller/follow_joint_trajectory`` and the
gripper on ``gripper_controller/gripper_cmd``; the test plays the robot (cameras, joint
states, instruction) and the two controllers' action servers, which record every goal. Every
goal must be within the limits and the step limit; a controller that is not there is a
command link the node holds on; rejected and aborted goals are counted and reported.
"""

from __future__ import annotations

import threading

from control_msgs.action import FollowJointTrajectory, GripperCommand
from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import pytest
import rclpy
from rclpy.action import ActionServer, GoalResponse
from rclpy.executors import MultiThreadedExecutor
from ros_harness import DEFAULT_CONFIG, next_domain_id, NodeProcess, wait_until
import yaml

from probe_robot import ProbeRobot
from vla_policy_node.ros.diagnostics import diagnostics_to_dict
from vla_policy_node.ros.qos import DIAGNOSTICS_QOS

pytestmark = pytest.mark.dds

CONFIG = yaml.safe_load(DEFAULT_CONFIG.read_text())['/**']['ros__parameters']
ARM = ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll']
GROUP_ARGS = ('-p', 'commands.groups:=[arm, gripper]', '-p', f'commands.arm.joints:={ARM}'.replace("'", ''),
              '-p', 'commands.arm.interface:=follow_joint_trajectory',
              '-p', 'commands.arm.topic:=arm_controller/follow_joint_trajectory',
              '-p', 'commands.gripper.joints:=[gripper]', '-p', 'commands.gripper.interface:=gripper_command',
              '-p', 'commands.gripper.topic:=gripper_controller/gripper_cmd', '-p', 'gripper_max_effort:=5.0')


class Controllers:
    """The arm's and the gripper's action servers; they accept, succeed or abort as told, and record goals."""

    def __init__(self, domain_id: int) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node('controllers', context=self.context)
        self.accept, self.abort = True, False
        self.arm: list = []
        self.gripper: list = []
        self.diagnostics: dict = {}
        self._lock = threading.Lock()
        ActionServer(self.node, FollowJointTrajectory, '/arm_controller/follow_joint_trajectory',
                     lambda handle: self._execute(handle, self.arm, FollowJointTrajectory), goal_callback=self._goal)
        ActionServer(self.node, GripperCommand, '/gripper_controller/gripper_cmd',
                     lambda handle: self._execute(handle, self.gripper, GripperCommand), goal_callback=self._goal)
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics, DIAGNOSTICS_QOS)
        self.executor = MultiThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        threading.Thread(target=self.executor.spin, daemon=True).start()

    def _goal(self, goal) -> GoalResponse:
        return GoalResponse.ACCEPT if self.accept else GoalResponse.REJECT

    def _execute(self, handle, goals: list, action):
        with self._lock:
            goals.append(handle.request)
        result = action.Result()
        if self.abort and action is FollowJointTrajectory:
            result.error_code = FollowJointTrajectory.Result.PATH_TOLERANCE_VIOLATED
            result.error_string = 'scripted path tolerance violation'
            handle.abort()
        else:
            handle.succeed()
        return result

    def _on_diagnostics(self, msg) -> None:
        for name, values in diagnostics_to_dict(msg).items():
            if name.endswith(': policy'):
                with self._lock:
                    self.diagnostics = values

    def counter(self, key: str) -> int:
        with self._lock:
            return int(self.diagnostics.get(key, 0))

    def count(self) -> tuple[int, int]:
        with self._lock:
            return len(self.arm), len(self.gripper)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def test_the_arm_and_gripper_controllers_actions_receive_every_command_within_limits():
    domain = next_domain_id()
    node = NodeProcess([DEFAULT_CONFIG], domain, GROUP_ARGS)
    robot = controllers = None
    try:
        assert node.wait_for_output('ready:', 90.0), node.output
        robot = ProbeRobot(domain, '/', CONFIG)
        robot.instruct('pick up the cube', latched=True)
        assert wait_until(lambda: 'arm_controller/follow_joint_trajectory' in node.output, 10.0), node.output
        controllers = Controllers(domain)       # no controller until now: nothing was commanded
        assert wait_until(lambda: min(controllers.count()) >= 20, 60.0), (controllers.count(), node.output)
        lower, upper = np.array(CONFIG['limits']['lower']), np.array(CONFIG['limits']['upper'])
        step = CONFIG['limits']['max_step']
        previous = None
        for goal in list(controllers.arm):
            trajectory = goal.trajectory
            assert list(trajectory.joint_names) == ARM
            assert trajectory.header.stamp.sec == 0 and trajectory.header.stamp.nanosec == 0, 'start now'
            points = np.array([p.positions for p in trajectory.points])
            times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in trajectory.points]
            assert np.all(np.diff(times) > 0) and np.all(np.isfinite(points))
            assert np.all(points >= lower[:5] - 1e-9) and np.all(points <= upper[:5] + 1e-9)
            if previous is not None:
                assert np.max(np.abs(points[0] - previous)) <= step + 1e-9, 'the step limit holds across goals'
            previous = points[0]
        for goal in list(controllers.gripper):
            assert lower[5] - 1e-9 <= goal.command.position <= upper[5] + 1e-9
            assert goal.command.max_effort == 5.0

        controllers.abort = True            # the arm's controller aborts: counted, logged
        assert wait_until(lambda: controllers.counter('command_goals_failed') > 0, 15.0), controllers.diagnostics
        assert 'error_code -4' in node.output and 'scripted path tolerance violation' in node.output
        controllers.abort, controllers.accept = False, False
        assert wait_until(lambda: controllers.counter('command_goals_rejected') > 0, 15.0), controllers.diagnostics
        assert 'rejected a goal' in node.output
    finally:
        for part in (robot, controllers):
            if part is not None:
                part.close()
        node.kill()
