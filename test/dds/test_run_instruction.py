# SPDX-License-Identifier: Apache-2.0
"""
The RunInstruction action against the simulated robot: success, time-out, cancel (a hold), preemption.

The installed node runs the shipped policy (planar.yaml); the simulated arm runs ``goal_driven``:
one layout, whose task it prints, and a ``TaskSuccess`` naming the episode it saw start on the
node's ``~/episode`` while the tip touches the named block. An action client of the test sends
the goals. A goal naming another block than the layout's never succeeds, so it runs until it
is cancelled, preempted or timed out; the last test sends the layout's task, which succeeds.
"""

from __future__ import annotations

import re
import subprocess
import time

from action_msgs.msg import GoalStatus
import pytest
import rclpy
from rclpy.action import ActionClient
from rclpy.node import Node
from ros_harness import DEFAULT_CONFIG, installed_executable, next_domain_id, ros_env, wait_until
from trajectory_msgs.msg import JointTrajectory
from vla_policy_interfaces.action import RunInstruction

from vla_policy_node.ros.qos import COMMAND_QOS
from vla_policy_node.sim import PLANAR_CHECKPOINT

pytestmark = pytest.mark.dds
DEMO = DEFAULT_CONFIG.parent / 'planar.yaml'
Result = RunInstruction.Result
COLOURS = ('red', 'green', 'blue')


class Client:
    """An action client and a command listener of the test, spun on demand."""

    def __init__(self, domain_id: int) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = Node('run_instruction_client', context=self.context)
        self.action = ActionClient(self.node, RunInstruction, '/vla_policy_node/run_instruction')
        self.commands: list[float] = []
        self.node.create_subscription(JointTrajectory, '/joint_trajectory_controller/joint_trajectory',
                                      lambda msg: self.commands.append(time.monotonic()), COMMAND_QOS)
        self.executor = rclpy.executors.SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)

    def until(self, future, timeout: float):
        """Spin until ``future`` is done; return its result."""
        self.executor.spin_until_future_complete(future, timeout_sec=timeout)
        assert future.done(), f'not done within {timeout} s'
        return future.result()

    def send(self, instruction: str, time_limit: float = 0.0, feedback: list | None = None):
        """Send a goal; return its accepted handle."""
        goal = RunInstruction.Goal(instruction=instruction, time_limit=time_limit)
        handle = self.until(self.action.send_goal_async(
            goal, feedback_callback=None if feedback is None else lambda msg: feedback.append(msg.feedback)), 10.0)
        assert handle.accepted
        return handle

    def spin_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.05)

    def close(self) -> None:
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.fixture(scope='module')
def system():
    """Start the node and the goal-driven arm; yield (client, the layout's task)."""
    env = ros_env(next_domain_id())
    node = subprocess.Popen([str(installed_executable()), '--ros-args', '--params-file', str(DEFAULT_CONFIG),
                             '--params-file', str(DEMO), '-p', f'checkpoint:={PLANAR_CHECKPOINT}'],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    robot = subprocess.Popen([str(installed_executable('vla_policy_sim_robot')), '--ros-args', '--params-file',
                              str(DEMO), '-p', 'goal_driven:=true', '-p', 'episodes:=0'],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = Client(int(env['ROS_DOMAIN_ID']))
    try:
        line = robot.stdout.readline()
        while line and not line.startswith('task: '):
            line = robot.stdout.readline()
        task = re.match(r"task: '(.*)' \(", line)
        assert task, f'the arm printed no task: {line!r}'
        assert client.action.wait_for_server(timeout_sec=60.0), 'no run_instruction action server'
        yield client, task[1]
    finally:
        client.close()
        for process in (robot, node):
            process.terminate()
            process.wait(30)


def other_task(task: str) -> str:
    """Return a task naming another block than the layout's: it never succeeds."""
    colour = next(c for c in COLOURS if c not in task)
    return re.sub('|'.join(COLOURS), colour, task)


def test_a_goal_that_does_not_succeed_in_time_ends_timed_out_with_feedback(system):
    client, task = system
    feedback = []
    handle = client.send(other_task(task), time_limit=2.0, feedback=feedback)
    result = client.until(handle.get_result_async(), 30.0).result
    assert result.outcome == Result.TIMED_OUT, result
    assert 2.0 <= result.elapsed < 4.0 and result.control_steps > 20 and result.chunks > 0, result
    assert feedback and feedback[-1].control_steps > 0 and feedback[-1].elapsed < result.elapsed


def test_a_cancel_holds_at_once(system):
    client, task = system
    feedback = []
    handle = client.send(other_task(task), feedback=feedback)
    assert wait_until(lambda: client.spin_for(0.1) or len(client.commands) > 0 and len(feedback) > 10, 30.0)
    response = client.until(handle.cancel_goal_async(), 10.0)
    assert len(response.goals_canceling) == 1
    result = client.until(handle.get_result_async(), 10.0).result
    assert result.outcome == Result.CANCELLED and 'holding' in result.reason, result
    client.spin_for(0.3)                        # the hold, sent at once, arrives
    sent = len(client.commands)
    client.spin_for(1.5)
    assert len(client.commands) == sent, 'commands went on after the cancel'


def test_a_second_goal_preempts_the_first(system):
    client, task = system
    first = client.send(other_task(task))
    client.spin_for(1.0)
    second = client.send(other_task(task), time_limit=1.0)
    result = client.until(first.get_result_async(), 10.0).result
    assert result.outcome == Result.PREEMPTED, result
    assert client.until(second.get_result_async(), 30.0).result.outcome == Result.TIMED_OUT


def test_the_layouts_task_succeeds_on_the_arms_success_signal(system):
    client, task = system
    feedback = []
    handle = client.send(task, time_limit=30.0, feedback=feedback)
    response = client.until(handle.get_result_async(), 40.0)
    result = response.result
    assert result.outcome == Result.SUCCEEDED and response.status == GoalStatus.STATUS_SUCCEEDED, result
    assert result.chunks > 0 and result.control_steps > 0 and feedback, result
    assert result.episode == feedback[-1].episode > 0, 'the success named the goal\'s episode'
