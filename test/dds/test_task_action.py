# SPDX-License-Identifier: Apache-2.0
"""
TaskAction (ros/task_action.py) in process: which goals it takes, and how each ending reaches the loop.

A scripted loop stands in for the control loop (it records end_task, the hold that ends a
goal, and instructions); the goal handles are scripted too. The node-level behaviour (cancel,
time-out, success and preemption against the simulated arm) is test_run_instruction.py's.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import rclpy
from rclpy.action import CancelResponse, GoalResponse
from ros_harness import next_domain_id
from vla_policy_interfaces.action import RunInstruction

from vla_policy_node.control.state import Mode
from vla_policy_node.ros.task_action import TaskAction

pytestmark = pytest.mark.dds
Result = RunInstruction.Result


class ScriptedLoop:
    """What TaskAction asks of the control loop, recorded."""

    def __init__(self) -> None:
        self.ended, self.instructions, self.resets = [], [], []
        self.mode, self.hold_reason, self.ticks = Mode.COMMANDING, None, 0

    def status(self, now, period):
        return SimpleNamespace(counters={'control_ticks': self.ticks, 'chunks_received': self.ticks // 10})

    def on_instruction(self, text: str) -> bool:
        self.instructions.append(text)
        return len(self.instructions) == 1          # the first is new; a repeat resets nothing itself

    def reset_episode(self, why: str) -> None:
        self.resets.append(why)

    def end_task(self, now: float, why: str) -> None:
        self.ended.append(why)


class Handle:
    """A goal handle: its request, and the feedback it was given."""

    def __init__(self, instruction: str, time_limit: float = 0.0) -> None:
        self.request = RunInstruction.Goal(instruction=instruction, time_limit=time_limit)
        self.feedback = []

    def execute(self) -> None:
        pass

    def publish_feedback(self, feedback) -> None:
        self.feedback.append(feedback)


@pytest.fixture
def task():
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    node = rclpy.create_node('task_action_test', context=context)
    clock = SimpleNamespace(t=0.0, refusal=None)
    loop = ScriptedLoop()
    action = TaskAction(node, 'task_success', 40, lambda: loop, lambda: clock.refusal, lambda: clock.t)
    yield action, loop, clock
    action.destroy()
    node.destroy_node()
    rclpy.try_shutdown(context=context)


def test_goals_are_refused_with_a_reason_when_the_node_cannot_take_them(task):
    action, _, clock = task
    assert action._on_goal(RunInstruction.Goal(instruction='wave', time_limit=5.0)) == GoalResponse.ACCEPT
    for goal in (RunInstruction.Goal(instruction='x' * 41), RunInstruction.Goal(instruction='wave', time_limit=-1.0),
                 RunInstruction.Goal(instruction='wave', time_limit=float('nan'))):
        assert action._on_goal(goal) == GoalResponse.REJECT
    clock.refusal = 'inactive: activate the node first'
    assert action._on_goal(RunInstruction.Goal(instruction='wave')) == GoalResponse.REJECT


def test_a_goal_starts_an_episode_gives_feedback_and_times_out_through_the_loop(task):
    action, loop, clock = task
    first = Handle('touch the red block', time_limit=2.0)
    action._on_accepted(first)
    assert loop.instructions == ['touch the red block'] and loop.resets == []
    loop.ticks, clock.t = 20, 1.0
    action.on_tick()
    assert (first.feedback[-1].control_steps, first.feedback[-1].chunks, first.feedback[-1].elapsed) == (20, 2, 1.0)
    second = Handle('touch the red block', time_limit=2.0)       # the same text again: reset by the goal
    action._on_accepted(second)
    done = action._goal.done
    assert loop.resets == ['run_instruction goal'], 'a new goal always starts a fresh episode'
    clock.t = 3.5
    action.on_tick()
    assert loop.ended == ['run_instruction goal timed out'] and done.result().outcome == Result.TIMED_OUT


def test_cancel_success_and_a_protective_stop_each_end_the_goal(task):
    action, loop, clock = task
    handle = Handle('wave')
    action._on_accepted(handle)
    assert action._on_cancel(Handle('someone else')) == CancelResponse.REJECT
    done = action._goal.done
    assert action._on_cancel(handle) == CancelResponse.ACCEPT
    assert loop.ended == ['run_instruction goal cancelled'] and done.result().outcome == Result.CANCELLED

    action._on_accepted(Handle('wave'))
    done = action._goal.done
    action._on_success(None)
    action.on_tick()
    assert loop.ended[-1] == 'run_instruction goal succeeded' and done.result().outcome == Result.SUCCEEDED

    action._on_accepted(Handle('wave'))
    done = action._goal.done
    loop.mode, loop.hold_reason = Mode.LATCHED, 'tracking error on elbow_flex'
    action.on_tick()
    result = done.result()
    assert result.outcome == Result.FAULTED and 'tracking error on elbow_flex' in result.reason
    assert len(loop.ended) == 2, 'a protective stop holds by itself: no second hold'
