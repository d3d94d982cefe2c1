# SPDX-License-Identifier: Apache-2.0
"""
The control loop, case by case (ROS-free, simulated clock).

The safety promises a hostile integrator broke before the loop owned them (issue 10's
list), each as an example.
"""

from __future__ import annotations

import dataclasses
import math

from loop_harness import ScriptedInference
import numpy as np
import pytest

from vla_policy_node.control.chunking import SchedulerConfig
from vla_policy_node.control.loop import ControlLoop, LoopSettings
from vla_policy_node.control.health import ERROR, OK, WARN
from vla_policy_node.control.safety import MotionLimits

JOINTS = ('shoulder', 'elbow', 'gripper')
RATE = 20.0
DT = 1.0 / RATE
FRAME = np.zeros((4, 4, 3), np.uint8)
LIMITS = MotionLimits(np.full(3, -3.14), np.full(3, 3.14), np.full(3, 2.0), 0.1)


class Rig:
    """A loop with a scripted policy, a clock, and the commands it sent."""

    def __init__(self, limits: MotionLimits = LIMITS, scheduler: dict | None = None, on_chunk_ready=lambda: None,
                 **settings) -> None:
        self.now = 100.0
        self.wall = 0.0
        self.sent: list[tuple[np.ndarray, np.ndarray | None]] = []
        self.sent_to: list[np.ndarray | None] = []      # the joints each message went to (None: all)
        self.inference = ScriptedInference()
        self.loop = ControlLoop(
            LoopSettings(JOINTS, ('front',), RATE, limits, **settings),
            SchedulerConfig(control_rate_hz=RATE, horizon=4, **(scheduler or {})), self.inference,
            self._sink,
            wall_clock=lambda: self.wall, on_chunk_ready=on_chunk_ready)
        self.loop.on_instruction('pick up the cube')

    def _sink(self, points: np.ndarray, times: np.ndarray | None, joints: np.ndarray | None) -> None:
        self.sent.append((points.copy(), times))
        self.sent_to.append(None if joints is None else joints.copy())

    def feed(self, state, stamp: float | None = None) -> None:
        self.loop.on_image('front', FRAME, self.now, None)
        self.loop.on_joint_state(JOINTS, state, self.now, stamp)

    def step(self, state, chunk=None, latency: float = 0.01) -> None:
        """One healthy period: inputs, a tick, the pending request answered with ``chunk``."""
        self.feed(state)
        self.loop.tick(self.now)
        if chunk is not None and self.inference.pending is not None:
            self.inference.deliver(np.asarray(chunk, float), None, self.inference.pending.obs_time + latency)
        self.now += DT
        self.wall += DT

    def commands(self) -> np.ndarray:
        return np.array([points[0] for points, _ in self.sent])

    def state(self) -> str:
        return self.loop.status(self.now, 1.0).state


def ramp(start: float, value: float) -> np.ndarray:
    return np.tile([start, start, value], (4, 1))


def test_after_a_reset_the_step_limit_counts_from_the_last_command_not_the_measured_glitch():
    rig = Rig()
    for _ in range(6):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.3, 0.3))
    last = rig.commands()[-1]
    assert np.allclose(last, 0.3)
    rig.loop.reset_episode('reset_episode service')
    for _ in range(6):          # a 1.5 rad glitch in the measured state at the reset
        rig.step([1.5, 1.5, 1.5], chunk=ramp(1.5, 1.5))
    chain = np.vstack([last, rig.commands()[6:]])
    assert np.all(np.abs(np.diff(chain, axis=0)) <= 0.1 + 1e-12), chain


def test_a_robot_measured_outside_its_limits_is_never_commanded_outside_them():
    rig = Rig()
    for _ in range(5):
        rig.step([0.0, 0.0, 4.0], chunk=ramp(0.0, 4.0))     # gripper reads 4.0, limit 3.14
    assert rig.sent == [], 'nothing can be commanded inside the limits within one step'
    status = rig.loop.status(rig.now, 1.0)
    assert status.level == ERROR and 'beyond their position limits: gripper 4.000' in status.state
    assert rig.loop.stop(rig.now) is False, 'no hold either: it would be outside the limits'
    nearly = Rig()
    for _ in range(3):
        nearly.step([0.0, 0.0, 3.2], chunk=ramp(0.0, 3.2))  # within one step of the limit
    assert len(nearly.sent) > 0 and np.all(nearly.commands() <= 3.14)


def test_a_stop_before_the_first_command_holds_inside_the_limits():
    rig = Rig()
    rig.feed([0.0, 0.0, 3.16])
    assert rig.loop.stop(rig.now)
    np.testing.assert_allclose(rig.commands(), [[0.0, 0.0, 3.14]])


def test_a_chunk_that_arrives_after_max_observation_age_is_refused_and_reported():
    rig = Rig(max_observation_age=0.5)
    for _ in range(10):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.05, 0.05), latency=0.75)
    assert rig.sent == []
    status = rig.loop.status(rig.now, 1.0)
    assert status.counters['policy_stale'] >= 1 and status.level == WARN
    assert 'more than max_observation_age' in status.state


def test_an_action_runs_only_while_its_observation_is_fresh_enough():
    rig = Rig(max_observation_age=0.5, max_action_age=0.2)
    rig.step([0.0, 0.0, 0.0], chunk=ramp(0.05, 0.05), latency=0.01)
    rig.now += 0.3          # the executor stalled: the plan is now 0.3 s old
    rig.step([0.0, 0.0, 0.0])
    status = rig.loop.status(rig.now, 1.0)
    assert status.counters['stale_actions_refused'] == 1
    assert 'more than max_action_age = 0.200 s' in status.state
    for points, times in rig.sent:
        if times is not None:
            assert rig.now - times[0] <= 0.2 + 2 * DT


def test_the_default_action_age_is_derived_from_observation_age_and_horizon():
    settings = LoopSettings(JOINTS, ('front',), RATE, LIMITS, max_observation_age=0.5)
    assert settings.action_age_limit(horizon=16) == pytest.approx(0.5 + 16 / RATE)


@pytest.mark.parametrize('offset, problem', [
    (+10.0, 'ahead of the node clock'), (-2.0, 'old'), (-100.0 - 1.7e9, 'old')])
def test_joint_state_stamps_are_checked_like_camera_stamps(offset, problem):
    rig = Rig()
    rig.feed([0.0, 0.0, 0.0], stamp=rig.now + offset)
    health = {h.name: h for h in rig.loop.status(rig.now, 1.0).inputs}
    assert health['joint_states'].level == ERROR and problem in health['joint_states'].message
    unstamped = Rig(use_header_stamps=False)
    unstamped.feed([0.0, 0.0, 0.0], stamp=unstamped.now + offset)
    assert {h.name: h.level for h in unstamped.loop.status(unstamped.now, 1.0).inputs}['joint_states'] == OK


def test_joint_state_stamps_that_go_backwards_are_refused():
    rig = Rig()
    rig.feed([0.0, 0.0, 0.0], stamp=rig.now - 0.01)
    rig.feed([0.0, 0.0, 0.0], stamp=rig.now - 0.02)
    health = {h.name: h for h in rig.loop.status(rig.now, 1.0).inputs}
    assert 'backwards' in health['joint_states'].message


def test_a_joint_fault_clears_only_when_every_joint_is_given_again():
    rig = Rig()
    rig.feed([0.0, math.nan, 0.0])
    level = lambda: {h.name: h.level for h in rig.loop.status(rig.now, 1.0).inputs}['joint_states']  # noqa: E731
    assert level() == ERROR
    rig.loop.on_joint_state((), (), rig.now, None)                   # empty
    assert level() == ERROR
    rig.loop.on_joint_state(('shoulder', 'elbow'), (0.0, 0.0), rig.now, None)    # partial
    assert level() == ERROR
    rig.loop.on_joint_state(('gripper',), (0.0,), rig.now, None)     # the rest, from another publisher
    assert level() == OK


def test_velocity_only_joint_states_are_ignored_and_counted():
    rig = Rig()
    for _ in range(3):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.02, 0.02))
        rig.loop.on_joint_state(JOINTS, (), rig.now, None)
    status = rig.loop.status(rig.now, 1.0)
    assert status.counters['joint_states_without_positions'] == 3
    assert status.state == 'commanding'


def test_the_watchdog_holds_when_ticks_stop_and_commanding_resumes_with_them():
    rig = Rig()
    for _ in range(4):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.02, 0.02))
    sent = len(rig.sent)
    rig.loop.watchdog(rig.now)
    assert len(rig.sent) == sent, 'ticks are running: no watchdog hold'
    rig.wall += 1.0                                   # sim clock stopped, wall clock runs
    rig.loop.watchdog(rig.now)
    assert len(rig.sent) == sent + 1 and rig.sent[-1][1] is None, 'one hold'
    assert 'no control tick for' in rig.state()
    assert rig.loop.status(rig.now, 1.0).counters['watchdog_holds'] == 1
    for _ in range(3):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.02, 0.02))
    assert rig.state() == 'commanding'


def test_another_publisher_on_the_command_topic_stops_all_commands():
    rig = Rig()
    for _ in range(3):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.02, 0.02))
    sent = len(rig.sent)
    rig.loop.set_command_link(subscribers=1, other_publishers=1)
    for _ in range(5):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.02, 0.02))
    assert len(rig.sent) == sent, 'not even a hold: it would interleave with the other sender'
    status = rig.loop.status(rig.now, 1.0)
    assert status.level == ERROR and 'other publisher' in status.state


def test_after_the_subscriber_returns_the_loop_re_enters_from_the_measured_state():
    rig = Rig()
    for _ in range(5):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.3, 0.3))
    rig.loop.set_command_link(subscribers=0, other_publishers=0)
    for _ in range(3):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.3, 0.3))
    sent = len(rig.sent)
    assert 'nobody subscribes' in rig.state()
    rig.loop.set_command_link(subscribers=1, other_publishers=0)
    for _ in range(5):                  # meanwhile the arm was moved by hand to 0.7
        rig.step([0.7, 0.7, 0.7], chunk=ramp(0.0, 0.0))
    chain = np.vstack([[0.7, 0.7, 0.7], rig.commands()[sent:]])
    assert len(chain) > 1 and np.all(np.abs(np.diff(chain, axis=0)) <= 0.1 + 1e-12), chain


def test_limits_only_tighten_at_run_time_and_never_exclude_the_last_command():
    rig = Rig()
    for _ in range(5):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.3, 0.3))
    base = rig.loop.settings

    def with_limits(lower, upper, velocity=2.0, step=0.1):
        return LoopSettings(JOINTS, ('front',), RATE, MotionLimits(
            np.full(3, lower), np.full(3, upper), np.full(3, velocity), step))
    assert 'may only be tightened' in rig.loop.check_update(with_limits(-1e6, 1e6))
    assert 'may only be tightened' in rig.loop.check_update(with_limits(-1.0, 1.0, step=10.0))
    assert 'may only be tightened' in rig.loop.check_update(with_limits(-1.0, 1.0, velocity=3.0))
    assert 'last command lies outside' in rig.loop.check_update(with_limits(-0.1, 0.1))
    with pytest.raises(ValueError):
        rig.loop.update(with_limits(-0.1, 0.1))
    assert rig.loop.settings is base
    rig.loop.update(with_limits(-1.0, 1.0, step=0.05))
    for _ in range(5):
        rig.step([0.3, 0.3, 0.3], chunk=ramp(0.9, 0.9))
    assert np.all(np.abs(np.diff(rig.commands()[-5:], axis=0)) <= 0.05 + 1e-12)


def test_a_command_topic_without_subscriber_restarts_only_its_own_joints_from_the_measured_state():
    rig = Rig()
    for _ in range(12):                 # the gripper lags: commanded 0.9, measured 0.5
        rig.step([0.9, 0.9, 0.5], chunk=ramp(0.9, 0.9))
    last = rig.commands()[-1]
    assert np.allclose(last, 0.9)
    rig.loop.set_command_link(subscribers=0, other_publishers=0, topic='gripper', unheard_joints=[2])
    rig.step([0.9, 0.9, 0.5], chunk=ramp(0.9, 0.9))
    rig.loop.set_command_link(subscribers=1, other_publishers=0)
    sent = len(rig.sent)
    for _ in range(3):
        rig.step([0.9, 0.9, 0.5], chunk=ramp(0.9, 0.9))
    first = rig.commands()[sent]
    assert np.all(np.abs(first[:2] - last[:2]) <= 0.1 + 1e-12), 'the arm steps from what its controller got'
    assert abs(first[2] - 0.5) <= 0.1 + 1e-12, 'the gripper re-enters from where it is measured'


def test_a_loop_clock_that_goes_back_holds_until_every_input_is_sent_again():
    rig = Rig()
    for _ in range(5):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.02, 0.02))
    assert rig.state() == 'commanding'
    sent = len(rig.sent)
    rig.now -= 0.2                      # a simulator reset, smaller than max_observation_age
    rig.loop.tick(rig.now)
    assert 'the loop clock went back by' in rig.state()
    assert len(rig.sent) == sent + 1 and rig.sent[-1][1] is None, 'one hold, no action'
    rig.loop.on_image('front', FRAME, rig.now, None)
    rig.loop.tick(rig.now)
    assert 'the loop clock went back by' in rig.state(), 'joint states are still from before'
    for _ in range(3):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.02, 0.02))
    assert rig.state() == 'commanding'
    assert all(times is None or np.all(times <= rig.now) for _, times in rig.sent[sent:])


def test_a_fault_of_an_ended_episode_is_counted_but_does_not_stop_the_new_one():
    rig = Rig()
    rig.step([0.0, 0.0, 0.0])           # a request in flight, not answered
    old, rig.inference.pending = rig.inference.pending, None
    assert old is not None
    rig.loop.reset_episode('test')
    for _ in range(3):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.02, 0.02))
    assert rig.state() == 'commanding'
    rig.inference.pending = old
    rig.inference.deliver(None, 'raised', rig.now)
    rig.step([0.0, 0.0, 0.0], chunk=ramp(0.02, 0.02))
    status = rig.loop.status(rig.now, 1.0)
    assert status.state == 'commanding' and status.counters['policy_raised'] == 1


def test_a_reset_forgets_the_last_episodes_policy_fault():
    rig = Rig()
    rig.step([0.0, 0.0, 0.0])
    rig.inference.deliver(None, 'raised', rig.now)
    rig.step([0.0, 0.0, 0.0])
    assert 'policy raised' in rig.state()
    rig.loop.reset_episode('test')
    rig.step([0.0, 0.0, 0.0])
    assert rig.state() == 'holding: waiting for actions from the policy'


@pytest.mark.parametrize('fault', ['out_of_memory', ''])
def test_an_unknown_fault_kind_holds_as_raised(fault):
    rig = Rig()
    rig.step([0.0, 0.0, 0.0])
    rig.inference.deliver(None, fault, rig.now)
    status = rig.loop.status(rig.now, 1.0)
    assert f'unknown fault kind {fault!r}' in status.state and status.counters['policy_raised'] == 1


@pytest.mark.parametrize('width', [1, 2, 7])
def test_a_chunk_of_another_width_than_the_joints_is_refused_with_its_reason(width):
    rig = Rig()
    rig.step([0.0, 0.0, 0.0], chunk=np.full((4, width), 0.05))
    rig.step([0.0, 0.0, 0.0])
    status = rig.loop.status(rig.now, 1.0)
    assert not any(times is not None for _, times in rig.sent), 'nothing commanded from it'
    assert status.counters['rejected_chunks'] >= 1
    assert 'policy output rejected' in status.state and f'(4, {width})' in status.state


def test_actions_age_from_the_oldest_input_of_their_observation_not_from_the_request():
    """A frame 0.4 s old when the request starts: its actions expire 0.1 s later, not 0.5 s."""
    rig = Rig(max_observation_age=0.5, max_action_age=0.5)
    rig.loop.on_image('front', FRAME, 100.0, None)
    rig.now = 100.4
    rig.loop.on_joint_state(JOINTS, [0.0, 0.0, 0.0], rig.now, None)
    rig.loop.tick(rig.now)
    request = rig.inference.pending
    assert request is not None and request.observed_at == 100.0
    rig.inference.deliver(np.full((4, 3), 0.01), None, rig.now + 0.01)
    published, states = [], []
    for _ in range(4):                  # fresh inputs keep coming; no other chunk is answered
        rig.now += DT
        rig.feed([0.0, 0.0, 0.0])
        rig.loop.tick(rig.now)
        if rig.sent and rig.sent[-1][1] is not None:
            published.append(rig.now)
        states.append(rig.state())
        rig.inference.pending = None
    assert published and all(at + DT - 100.0 <= 0.5 + 1e-9 for at in published), published    # reached at + DT
    assert any('more than max_action_age' in state for state in states), states


def hold_on_a_policy_fault(rig: Rig, state) -> None:
    """Make the loop hold (a raised policy fault), with fresh inputs at ``state``."""
    rig.feed(state)
    rig.loop.tick(rig.now)
    rig.inference.deliver(None, 'raised', rig.now)
    assert 'policy raised' in rig.state()


def test_a_robot_moved_by_hand_during_a_hold_is_not_commanded_until_it_is_back():
    rig = Rig()
    for _ in range(6):
        rig.step([0.3, 0.3, 0.3], chunk=ramp(0.3, 0.3))
    hold_on_a_policy_fault(rig, [0.3, 0.3, 0.3])
    assert rig.sent[-1][1] is None, 'the hold'
    sent = len(rig.sent)
    for k in range(6):                  # hand-guided to 1.0 while holding; the policy answers now and then
        rig.step([1.0, 0.3, 0.3], chunk=ramp(1.0, 0.3) if k % 3 == 0 else None)
        assert k == 0 or rig.loop.status(rig.now, 1.0).level == ERROR, 'the ERROR stays while the robot is away'
    assert len(rig.sent) == sent, 'nothing after the hold'
    status = rig.loop.status(rig.now, 1.0)
    assert status.level == ERROR and 'someone moved the robot' in status.state and 'shoulder +0.700' in status.state
    assert status.counters['moved_robot_refusals'] >= 1
    for _ in range(4):                  # put back where the hold found it
        rig.step([0.32, 0.3, 0.3], chunk=ramp(0.3, 0.3))
    assert rig.state() == 'commanding'
    chain = np.vstack([rig.sent[sent - 1][0][0], rig.commands()[sent:]])
    assert len(chain) > 1 and np.all(np.abs(np.diff(chain, axis=0)) <= 0.1 + 1e-12), chain


def test_an_arm_driven_away_by_another_publisher_is_not_yanked_back_when_it_leaves():
    rig = Rig()
    for _ in range(6):
        rig.step([0.1, 0.1, 0.0], chunk=ramp(0.1, 0.0))
    sent = len(rig.sent)
    rig.loop.set_command_link(subscribers=1, other_publishers=1, topic='/arm/joint_trajectory')
    for position in (0.1, 0.4, 0.7, 1.0):   # a teleop node drives the arm to 1.0
        rig.step([position, position, 0.0], chunk=ramp(0.1, 0.0))
    rig.loop.set_command_link(subscribers=1, other_publishers=0)
    for _ in range(4):
        rig.step([1.0, 1.0, 0.0], chunk=ramp(0.1, 0.0))
    assert len(rig.sent) == sent, 'nothing: neither a jump back to 0.1 nor a hold fighting the other node'
    assert 'someone moved the robot' in rig.state()


def test_a_gripper_stopped_by_what_it_holds_resumes_after_a_hold():
    rig = Rig()
    for _ in range(6):                  # told to close to 0.0, stopped at 0.5 by the object
        rig.step([0.2, 0.2, 0.5], chunk=ramp(0.2, 0.0))
    hold_on_a_policy_fault(rig, [0.2, 0.2, 0.5])
    sent = len(rig.sent)
    for _ in range(4):
        rig.step([0.2, 0.2, 0.5], chunk=ramp(0.2, 0.0))
    assert rig.state() == 'commanding'
    assert np.all(np.abs(rig.commands()[sent:, 2]) <= 1e-12), 'still told to close: it keeps its grip'


def test_after_a_stall_the_next_command_steps_from_the_point_the_controllers_reached():
    rig = Rig(plan_points=0)            # every planned point per message, as a trajectory
    chunk = np.column_stack([0.1 * np.arange(1, 5)] * 3)
    rig.step([0.0, 0.0, 0.0], chunk=chunk)
    rig.step([0.0, 0.0, 0.0])
    points, _ = rig.sent[-1]
    assert len(points) > 1
    rig.now += 3 * DT                   # the executor stalled: the controllers ran on through the message
    rig.feed([0.0, 0.0, 0.0])
    rig.loop.tick(rig.now)
    reached = points[min(3, len(points) - 1)]       # point i is due (i + 1) periods after it left
    assert np.all(np.abs(rig.sent[-1][0][0] - reached) <= 0.1 + 1e-12), (rig.sent[-1][0][0], reached)


def test_a_topic_without_subscriber_does_not_stop_the_hold_of_the_others():
    rig = Rig(plan_points=0)
    for _ in range(3):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.05, 0.05))
    rig.loop.set_command_link(subscribers=0, other_publishers=0, topic='/gripper', unheard_joints=[2])
    rig.step([0.0, 0.0, 0.0], chunk=ramp(0.05, 0.05))
    points, times = rig.sent[-1]
    assert times is None and len(points) == 1, 'one hold point: the arm stops instead of running on'
    assert 'nobody subscribes to /gripper' in rig.state()


def test_with_stale_joint_states_a_hold_still_reaches_the_topics_that_listen():
    """
    The gripper's topic loses its subscriber as the joint states go stale: the arm's topic gets the hold.

    The gripper's next command must step from a measurement (none is fresh), so nothing goes
    to its topic; the arm's controller holds the point it executes instead of running on.
    """
    rig = Rig()
    for _ in range(4):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.05, 0.05))
    message, sent = rig.sent[-1][0], len(rig.sent)
    rig.loop.set_command_link(subscribers=0, other_publishers=0, topic='/gripper', unheard_joints=[2])
    rig.now += rig.loop.settings.max_observation_age + DT      # no joint state since
    rig.loop.on_image('front', FRAME, rig.now, None)
    rig.loop.tick(rig.now)
    assert len(rig.sent) == sent + 1, 'no hold sent'
    (points, times), joints = rig.sent[-1], rig.sent_to[-1]
    assert times is None and joints.tolist() == [True, True, False]
    np.testing.assert_array_equal(points[0, :2], message[-1, :2])    # the arm ran through the message
    rig.loop.set_command_link(subscribers=1, other_publishers=0)
    rig.loop.reset_episode('test')
    for _ in range(3):
        rig.step([0.0, 0.0, 0.4], chunk=ramp(0.05, 0.05))
    assert rig.sent_to[-1] is None, 'every topic listens again'
    first = rig.sent[sent + 1][0][0]
    assert abs(first[2] - 0.4) <= 0.1 + 1e-12, 'the gripper re-enters from where it is measured'


def test_a_final_hold_after_the_robot_was_moved_is_not_sent():
    """Deactivating (or Ctrl-C) after a 'moved' refusal must not command the old point back."""
    rig = Rig()
    for _ in range(6):
        rig.step([0.1, 0.1, 0.0], chunk=ramp(0.1, 0.0))
    hold_on_a_policy_fault(rig, [0.1, 0.1, 0.0])
    sent = len(rig.sent)
    for _ in range(3):
        rig.step([1.0, 1.0, 0.0], chunk=ramp(0.1, 0.0))
    assert 'someone moved the robot' in rig.state()
    assert rig.loop.stop(rig.now) is False
    assert len(rig.sent) == sent, 'the hold would pull the arm 0.9 back'
    assert rig.loop.status(rig.now, 1.0).counters['moved_robot_refusals'] == 1, 'counted once per refusal'


def test_a_gripper_that_stops_short_on_its_way_resumes_with_its_grip():
    rig = Rig()
    for k in range(16):                       # told to close at full rate, closing slower
        rig.step([0.0, 0.0, 1.0 - 0.03 * k], chunk=ramp(0.0, 0.0))
    assert abs(rig.commands()[-1][2]) <= 1e-12
    hold_on_a_policy_fault(rig, [0.0, 0.0, 0.5])
    sent = len(rig.sent)
    for _ in range(4):                        # stopped by the object at 0.35
        rig.step([0.0, 0.0, 0.35], chunk=ramp(0.0, 0.0))
    assert rig.state() == 'commanding'
    reference = rig.sent[sent - 1][0][0]
    assert np.all(np.abs(rig.commands()[sent] - reference) <= 0.1 + 1e-12)


def test_joints_of_a_forward_command_controller_step_from_the_only_point_it_got():
    rig = Rig(plan_points=0, first_point_joints=(2,))
    chunk = np.column_stack([0.1 * np.arange(1, 5)] * 3)
    rig.step([0.0, 0.0, 0.0], chunk=chunk)
    rig.step([0.0, 0.0, 0.0])
    gripper_setpoint = rig.sent[-1][0][0][2]
    rig.now += 3 * DT                         # a stall: the arm's trajectory ran on, the gripper did not
    rig.feed([0.0, 0.0, 0.0])
    rig.loop.tick(rig.now)
    assert abs(rig.sent[-1][0][0][2] - gripper_setpoint) <= 0.1 + 1e-12


def test_after_a_stall_the_actions_whose_time_passed_are_not_run_again():
    rig = Rig(plan_points=0)
    rig.loop.reset_episode('start')
    chunk = np.column_stack([0.05 * np.arange(1, 5)] * 3)
    rig.feed([0.0, 0.0, 0.0])
    rig.loop.tick(rig.now)
    rig.inference.deliver(chunk, None, rig.now + 0.001)
    rig.now += DT
    rig.feed([0.0, 0.0, 0.0])
    rig.loop.tick(rig.now)
    first = rig.sent[-1][0][:, 0]
    rig.now += 3 * DT                         # two ticks did not happen
    rig.feed([0.0, 0.0, 0.0])
    rig.loop.tick(rig.now)
    after = rig.sent[-1][0][:, 0]
    assert after[0] == pytest.approx(first[3]), (first, after)    # rows 1 and 2 became due meanwhile
    assert rig.loop.status(rig.now, 1.0).counters['actions_overdue'] == 2


def test_late_ticks_without_a_missed_one_skip_nothing():
    """Timers keep their phase: a late tick is followed by an early one, and every action runs in turn."""
    rig = Rig(plan_points=0)
    chunk = np.column_stack([0.01 * np.arange(1, 5)] * 3)
    start = rig.now
    executed = []
    for k in range(40):
        rig.now = start + k * DT + (0.7 * DT if k % 2 else 0.0)     # every other tick 0.7 period late
        rig.feed([0.0, 0.0, 0.0])
        rig.loop.tick(rig.now)
        if rig.sent and rig.sent[-1][1] is not None:
            executed.append(rig.sent[-1][0][0, 0])
        if rig.inference.pending is not None:
            rig.inference.deliver(chunk + executed[-1] if executed else chunk, None, rig.now + 0.001)
    assert rig.loop.status(rig.now, 1.0).counters['actions_overdue'] == 0
    assert np.all(np.diff(executed) >= -1e-12), executed


def test_a_controller_given_one_point_at_a_time_skips_nothing_after_a_stall():
    """It held its one point through the stall: the plan goes on from the next action, at its pace."""
    rig = Rig(plan_points=1)
    chunk = np.column_stack([0.02 * np.arange(1, 5)] * 3)
    rig.step([0.0, 0.0, 0.0], chunk=chunk)
    rig.step([0.0, 0.0, 0.0])
    before = rig.sent[-1][0][0, 0]
    rig.now += 9 * DT
    rig.feed([0.0, 0.0, 0.0])
    rig.loop.tick(rig.now)
    assert rig.sent[-1][0][0, 0] == pytest.approx(before + 0.02)
    assert rig.loop.status(rig.now, 1.0).counters['actions_overdue'] == 0


def tracking(*per_joint: float) -> MotionLimits:
    return MotionLimits(LIMITS.lower, LIMITS.upper, LIMITS.max_velocity, LIMITS.max_step,
                        np.array(per_joint))


@pytest.mark.parametrize('plan_points', [0, 1])
def test_a_controller_switched_off_while_commanding_holds_instead_of_piling_up_the_distance(plan_points):
    rig = Rig(limits=tracking(0.25, 0.25, np.inf), plan_points=plan_points)
    for k in range(3):                         # the arm follows the ramp to 0.6
        rig.step([0.1 * k, 0.1 * k, 0.3], chunk=ramp(0.6, 0.0))
    sent = len(rig.sent)
    for _ in range(8):                         # its controller is switched off: it stays at 0.2
        rig.step([0.2, 0.2, 0.3], chunk=ramp(0.6, 0.0))
    first_hold = next(i for i, (points, times) in enumerate(rig.sent) if times is None)
    assert all(times is None and len(points) == 1 for points, times in rig.sent[first_hold:]), \
        'holds of one point each, so a forward command controller walks too'
    assert np.all(np.abs(rig.commands()[sent:, 0] - 0.2) <= 0.25 + 0.1 + 1e-12), \
        'never more than max_tracking_error (and the step that found it) ahead of the arm'
    walk = rig.commands()[first_hold - 1:]
    assert len(walk) > 2 and np.all(np.abs(np.diff(walk, axis=0)) <= 0.1 + 1e-12), walk
    np.testing.assert_allclose(walk[-1, :2], [0.2, 0.2], err_msg='the setpoint walks back to where the arm is')
    assert np.all(walk[1:, 2] == walk[0, 2]), 'the unchecked gripper keeps its point'
    status = rig.loop.status(rig.now, 1.0)
    assert status.level == ERROR and 'do not follow the command' in status.state
    assert 'shoulder -0.' in status.state and 'gripper' not in status.state
    assert status.counters['tracking_error_holds'] == 1
    count = len(rig.sent)
    for _ in range(len(walk) + 3):             # back on: the arm follows the hold to where it is
        rig.step([0.2, 0.2, 0.3], chunk=ramp(0.6, 0.0))
        status = rig.loop.status(rig.now, 1.0)
        assert status.level == ERROR and 'do not follow' in status.state, 'latched, as a protective stop'
    assert len(rig.sent) == count and rig.inference.pending is None, 'nothing sent, nothing asked of the policy'
    assert rig.loop.restart_from_measured(rig.now) is None
    for _ in range(3):
        rig.step([0.2, 0.2, 0.3], chunk=ramp(0.6, 0.0))
    assert rig.state() == 'commanding'
    assert np.all(np.abs(rig.commands()[count] - [0.2, 0.2, walk[-1, 2]]) <= 0.1 + 1e-12)


def test_a_resume_refused_for_a_joint_left_behind_yields_to_it_too():
    """Holding for another reason, then the arm is found behind: the hold already sent must be walked back."""
    rig = Rig(limits=tracking(0.25, 0.25, np.inf))
    for k in range(4):
        rig.step([0.1 * k, 0.1 * k, 0.0], chunk=ramp(0.6, 0.0))
    hold_on_a_policy_fault(rig, [0.2, 0.2, 0.0])       # the arm lags at 0.2, its point 0.4
    rig.now += DT
    rig.wall += DT
    sent = len(rig.sent)
    for _ in range(6):                                  # pushed back to 0.1 (on its way: no 'moved')
        rig.step([0.1, 0.1, 0.0], chunk=ramp(0.6, 0.0))
    assert 'do not follow the command' in rig.state()
    assert all(times is None for _, times in rig.sent[sent:])
    np.testing.assert_allclose(rig.commands()[-1, :2], [0.1, 0.1])


def test_a_joint_not_tracked_may_stay_behind_its_command():
    rig = Rig(limits=tracking(0.25, 0.25, np.inf))
    for _ in range(12):                        # told to close to 0.0, stopped at 0.5 by the object
        rig.step([0.2, 0.2, 0.5], chunk=ramp(0.2, 0.0))
    assert rig.state() == 'commanding' and abs(rig.commands()[-1][2]) <= 1e-12


def test_the_tracking_error_may_only_tighten_at_run_time():
    rig = Rig(limits=tracking(0.25, 0.25, np.inf))
    looser = LoopSettings(JOINTS, ('front',), RATE, tracking(0.5, 0.25, np.inf))
    assert 'max_tracking_error at joint indices [0] is looser' in rig.loop.check_update(looser)
    unchecked = LoopSettings(JOINTS, ('front',), RATE, LIMITS)
    assert 'max_tracking_error at joint indices [0, 1] is looser' in rig.loop.check_update(unchecked)
    assert rig.loop.check_update(LoopSettings(JOINTS, ('front',), RATE, tracking(0.1, 0.2, 1.0))) is None
    with pytest.raises(ValueError, match='one positive entry per joint'):
        tracking(0.1, 0.0, 1.0)


def test_a_tracking_tolerance_below_one_full_speed_step_is_warned_of_at_start_and_on_update():
    """Allowed (an arm may track within one period), but full-speed motion would likely trip it."""
    logs = []
    settings = LoopSettings(JOINTS, ('front',), RATE, tracking(0.05, 0.25, np.inf))   # one step: 0.1
    loop = ControlLoop(settings, SchedulerConfig(control_rate_hz=RATE, horizon=4), ScriptedInference(),
                       lambda points, times, joints: None, lambda severity, text: logs.append((severity, text)),
                       envelope=tracking(0.5, 0.5, np.inf))
    assert logs == [('warning', "limits.max_tracking_error is below one period's motion at full speed for "
                                'shoulder (0.05 < 0.1): unless these joints are measured within one period '
                                'of their command, full-speed motion will trigger a protective stop')]
    loop.update(LoopSettings(JOINTS, ('front',), RATE, tracking(0.05, 0.05, np.inf)))
    assert 'shoulder (0.05 < 0.1), elbow (0.05 < 0.1)' in logs[-1][1]
    logs.clear()
    loop.update(LoopSettings(JOINTS, ('front',), RATE, tracking(0.05, 0.05, np.inf)))   # unchanged: said once
    assert logs == []
    loop.update(LoopSettings(JOINTS, ('front',), RATE, tracking(0.1, 0.2, np.inf)))
    assert [text for _, text in logs if 'below one period' in text] == [], 'no longer below: nothing to warn of'
    assert tracking(0.05, 0.2, 0.01).tracking_below_one_step(DT) == [0, 2]
    assert tracking(0.05, 0.2, 0.01).tracking_below_one_step(DT / 100) == []     # one step: 0.0002


def test_a_new_loop_keeps_the_envelope_given_at_start_not_the_limits_tightened_since():
    """A lifecycle node re-activated after a run-time tightening may loosen back to its start limits."""
    start = tracking(0.5, 0.5, np.inf)
    tightened = LoopSettings(JOINTS, ('front',), RATE, tracking(0.02, 0.02, np.inf))
    loop = ControlLoop(tightened, SchedulerConfig(control_rate_hz=RATE, horizon=4), ScriptedInference(),
                       lambda points, times, joints: None, envelope=start)
    assert loop.check_update(LoopSettings(JOINTS, ('front',), RATE, start)) is None
    assert 'looser' in loop.check_update(LoopSettings(JOINTS, ('front',), RATE, LIMITS))
    with pytest.raises(ValueError, match='looser than the limits given at start'):
        ControlLoop(LoopSettings(JOINTS, ('front',), RATE, LIMITS), SchedulerConfig(control_rate_hz=RATE, horizon=4),
                    ScriptedInference(), lambda points, times, joints: None, envelope=start)


def test_an_operator_restarts_a_loop_that_refuses_to_resume_from_where_the_robot_is():
    rig = Rig()
    for _ in range(6):
        rig.step([0.1, 0.1, 0.0], chunk=ramp(0.1, 0.0))
    assert rig.loop.restart_from_measured(rig.now) == 'commanding: there is no hold to restart from'
    hold_on_a_policy_fault(rig, [0.1, 0.1, 0.0])
    sent = len(rig.sent)
    for _ in range(3):                         # hand-guided to 1.0 during the hold
        rig.step([1.0, 1.0, 0.0], chunk=ramp(1.0, 0.0))
    assert 'someone moved the robot' in rig.state() and len(rig.sent) == sent
    rig.now += 1.0                             # the joint states stop
    assert rig.loop.restart_from_measured(rig.now) == 'no fresh joint state to start from'
    rig.feed([1.0, 1.0, 0.0])
    assert rig.loop.restart_from_measured(rig.now) is None
    for _ in range(14):
        rig.step([1.0, 1.0, 0.0], chunk=ramp(1.2, 0.0))
    assert rig.state() == 'commanding'
    walk = rig.commands()[sent - 1:]
    assert np.all(np.abs(np.diff(walk, axis=0)) <= 0.1 + 1e-12), 'walked there at the step limit, no jump'
    assert np.allclose(walk[9], [1.0, 1.0, 0.0]), 'the setpoint reached where the robot is'
    assert np.all(np.abs(rig.commands()[-1] - [1.0, 1.0, 0.0]) <= 0.1 * 4 + 1e-12), 'then commanded from there'
    assert rig.loop.stop(rig.now)
    assert rig.loop.restart_from_measured(rig.now) == 'the control loop is stopped'


def latched_rig() -> Rig:
    """Latch a loop in a protective stop: the arm stays at 0.2 while its points run on."""
    rig = Rig(limits=tracking(0.25, 0.25, np.inf))
    for k in range(3):
        rig.step([0.1 * k, 0.1 * k, 0.0], chunk=ramp(0.6, 0.0))
    while 'do not follow' not in rig.state():
        rig.step([0.2, 0.2, 0.0], chunk=ramp(0.6, 0.0))
    return rig


def test_a_stop_during_the_walk_back_sends_the_rest_of_the_walk():
    rig = latched_rig()
    assert rig.loop.stop(rig.now)
    points, times = rig.sent[-1]
    assert times is None and len(points) > 1, 'the trajectory controller finishes the walk on its own'
    chain = np.vstack([rig.sent[-2][0][0], points])
    assert np.all(np.abs(np.diff(chain, axis=0)) <= 0.1 + 1e-12), chain
    np.testing.assert_allclose(points[-1, :2], [0.2, 0.2])


def test_a_protective_stop_stays_the_reason_whatever_else_holds():
    rig = latched_rig()
    rig.wall += 1.0                             # the loop clock stops
    rig.loop.watchdog(rig.now)
    status = rig.loop.status(rig.now, 1.0)
    assert status.level == ERROR and 'do not follow the command' in status.state and 'no control tick' in status.state


def test_after_the_clock_goes_back_the_hold_repeats_the_point_the_controllers_run():
    rig = Rig(plan_points=0)
    chunk = np.column_stack([0.1 * np.arange(1, 5)] * 3)
    rig.step([0.0, 0.0, 0.0], chunk=chunk)
    rig.step([0.0, 0.0, 0.0])
    points, times = rig.sent[-1]
    assert times is not None and len(points) >= 3
    rig.loop.set_command_link(subscribers=1, other_publishers=1)     # nothing sent for three more periods
    for _ in range(3):
        rig.now += DT
        rig.loop.tick(rig.now)
    rig.now -= 5.0                              # a simulator reset: the loop clock goes back
    rig.loop.tick(rig.now)
    rig.feed([0.0, 0.0, 0.0])
    rig.loop.set_command_link(subscribers=1, other_publishers=0)
    assert rig.loop.stop(rig.now)
    hold, times = rig.sent[-1]
    assert times is None
    due = points[min(3, len(points) - 1)]       # point i is due (i + 1) periods after it left: four ticks
    np.testing.assert_allclose(hold[0], due, err_msg='the hold repeats the point executed, not the first')


def test_points_per_message_changed_at_run_time_still_step_a_forward_joint_from_its_first_point():
    """A gripper on a forward command controller took only the first point of a 4-point message."""
    rig = Rig(plan_points=0, first_point_joints=(2,))
    rig.step([0.0, 0.0, 0.0], chunk=np.column_stack([0.1 * np.arange(1, 5)] * 3))
    rig.step([0.0, 0.0, 0.0])
    points, _ = rig.sent[-1]
    assert len(points) >= 3
    held = points[0, 2]
    rig.loop.update(dataclasses.replace(rig.loop.settings, plan_points=1))     # trajectory_points: 1
    assert 'first_point_joints' in rig.loop.check_update(dataclasses.replace(rig.loop.settings,
                                                                             first_point_joints=()))
    rig.now += 3 * DT                   # a late tick: the arm's controller ran on through its points
    rig.wall += 3 * DT
    rig.feed([0.0, 0.0, 0.0])
    rig.loop.tick(rig.now)
    assert abs(rig.sent[-1][0][0, 2] - held) <= 0.1 + 1e-12


def test_every_row_sent_is_fresh_when_its_trajectory_point_is_reached():
    """Point i of a message is reached (i + 1) periods after it left: its observation is aged then."""
    rig = Rig(plan_points=0, max_observation_age=0.5, max_action_age=0.2)
    published = []
    sink = rig.loop._sink
    rig.loop._sink = lambda p, t, j: (published.append((rig.now, p.copy(), t)), sink(p, t, j))
    rig.step([0.0, 0.0, 0.0], chunk=np.full((4, 3), 0.01))
    for _ in range(6):
        rig.step([0.0, 0.0, 0.0])
    actions = [(at, times) for at, _, times in published if times is not None]
    assert actions
    for at, times in actions:
        reached = at + DT * np.arange(1, len(times) + 1)
        assert np.all(reached - times <= 0.2 + 1e-9), reached - times


def test_a_protective_stop_walks_no_further_while_the_loop_clock_stands_still():
    """A paused simulator: the wall-clock watchdog fires, the walk waits for the loop clock."""
    rig = latched_rig()                 # its last step sent a period before rig.now
    before, count = rig.commands()[-1].copy(), len(rig.sent)
    rig.wall += 1.0
    for _ in range(5):
        rig.loop.watchdog(rig.now)
        rig.wall += 0.1
    assert 'no control tick' in rig.state()
    assert len(rig.sent) == count + 1, 'the period that passed: one step; the clock stands still: no more'
    assert np.abs(rig.commands()[-1] - before).max() <= 0.1 + 1e-12
    rig.now += DT / 2                   # the clock runs again; a tick half a period later steps no further
    rig.wall += DT / 2
    rig.feed([0.2, 0.2, 0.0])
    rig.loop.tick(rig.now)
    assert len(rig.sent) == count + 1
    rig.now += DT / 2
    rig.wall += DT / 2
    rig.feed([0.2, 0.2, 0.0])
    rig.loop.tick(rig.now)
    assert len(rig.sent) == count + 2


def test_an_unheard_joint_measured_beyond_its_limits_does_not_keep_the_hold_from_the_others():
    """The gripper's controller died and the limp gripper reads beyond its limit: the arm still stops."""
    rig = Rig(plan_points=0)
    chunk = np.column_stack([0.05 * np.arange(1, 5)] * 2 + [np.full(4, 3.0)])
    for _ in range(3):
        rig.step([0.0, 0.0, 3.0], chunk=chunk + (rig.commands()[-1] * [1, 1, 0] if rig.sent else 0))
    points, times = rig.sent[-1]
    assert times is not None and len(points) > 1
    count = len(rig.sent)
    rig.loop.set_command_link(subscribers=0, other_publishers=0, topic='/gripper', unheard_joints=[2])
    rig.feed([points[0, 0], points[0, 1], 3.5])         # upper limit 3.14, one step 0.1
    rig.loop.tick(rig.now)
    assert len(rig.sent) == count + 1, 'no hold sent to the arm'
    hold, obs_times = rig.sent[-1]
    assert obs_times is None and rig.sent_to[-1].tolist() == [True, True, False]
    np.testing.assert_allclose(hold[0, :2], points[0, :2])
    rig.now += DT                       # Ctrl-C while holding: the last hold, to the arm, is not
    rig.wall += DT                      # refused for the gripper being off the way it was told
    rig.feed([points[0, 0], points[0, 1], 3.5])
    assert rig.loop.stop(rig.now)
    assert len(rig.sent) == count + 2 and rig.sent_to[-1].tolist() == [True, True, False]


def jtc_velocities(messages: list[tuple[float, np.ndarray]], start: np.ndarray, dt: float) -> np.ndarray:
    """
    Replay messages (time, points (T, J)) through a joint_trajectory_controller model; the speeds it asks.

    On each message the controller interpolates from its setpoint at that moment to point 0 one
    period later, point i at (i + 1) periods; returns every segment's speed (N, J).
    """
    speeds = []
    setpoint, path, path_start = start, np.asarray(start)[None, :], None
    for t, points in messages:
        if path_start is not None:
            periods = min((t - path_start) / dt, len(path) - 1)
            k = min(int(periods), len(path) - 2)
            setpoint = path[k] + (periods - k) * (path[k + 1] - path[k])
        path, path_start = np.vstack([setpoint, points]), t
        speeds.extend(np.abs(np.diff(path, axis=0)) / dt)
    return np.array(speeds)


def test_ticks_milliseconds_apart_after_a_stall_never_outrun_the_velocity_limit():
    """
    An executor stall (a large frame decoding) runs two or three ticks a few ms apart: a few ms of motion each.

    The gripper is on a forward command controller, which jumps to each message's first point.
    """
    rig = Rig(first_point_joints=(2,))
    far = np.column_stack([np.full(4, 3.0)] * 3)           # the policy asks for full speed all the time
    rig.step([0.0, 0.0, 0.0], chunk=far)
    times, before = [], len(rig.sent)
    for _ in range(6):
        times.append(rig.now)
        rig.step(list(rig.commands()[-1]) if rig.sent else [0.0, 0.0, 0.0], chunk=far)
    for gap in (0.0014, 0.003, 0.0234):                   # after a stall of 1.7 periods
        rig.now += 1.7 * DT if gap == 0.0014 else gap
        times.append(rig.now)
        rig.feed(list(rig.commands()[-1]))
        rig.loop.tick(rig.now)
    sent = rig.sent[before:]
    assert len(sent) == len(times) and all(obs is not None for _, obs in sent[-3:]), 'the burst commands actions'
    first = np.array([points[0] for points, _ in sent])
    for i in range(1, len(first)):
        elapsed = times[i] - times[i - 1]
        assert np.all(np.abs(first[i] - first[i - 1]) <= LIMITS.max_velocity * elapsed + 1e-9), (i, elapsed)
    speeds = jtc_velocities(list(zip(times, (points[:, :2] for points, _ in sent))), np.zeros(2), DT)
    assert speeds.max() <= LIMITS.max_velocity.max() + 1e-9, speeds.max()


def test_a_restart_far_from_the_measured_state_walks_there_instead_of_jumping():
    """Restarted in a camera-stale hold with a joint 1.5 rad off its command: one step per period to it."""
    rig = Rig()
    for _ in range(4):
        rig.step([0.1, 0.1, 0.0], chunk=ramp(0.1, 0.0))
    command = rig.commands()[-1].copy()
    rig.now += 0.6                                         # the camera stops; the joint states go on
    rig.loop.on_joint_state(JOINTS, [command[0] + 1.5, command[1], command[2]], rig.now, None)
    rig.loop.tick(rig.now)
    assert 'front' in rig.state()
    held = len(rig.sent)
    assert rig.loop.restart_from_measured(rig.now) is None
    for _ in range(20):
        rig.now += DT
        rig.loop.on_joint_state(JOINTS, [command[0] + 1.5, command[1], command[2]], rig.now, None)
        rig.loop.tick(rig.now)
    walk = rig.commands()[held - 1:]
    assert len(walk) > 15 and np.all(np.abs(np.diff(walk, axis=0)) <= 0.1 + 1e-12), 'no jump: one step per period'
    assert np.isclose(walk[-1][0], command[0] + 1.5) and np.allclose(walk[-1][1:], command[1:])
    assert 'front' in rig.state(), 'still holding on the stale camera, the setpoint where the arm is'
    steps = len(rig.sent)
    rig.step([command[0] + 1.5, command[1], command[2]], chunk=ramp(1.6, 0.0))
    rig.step([command[0] + 1.5, command[1], command[2]], chunk=ramp(1.6, 0.0))
    assert rig.state() == 'commanding' and len(rig.sent) > steps
    assert np.all(np.abs(rig.commands()[steps - 1:][1:] - rig.commands()[steps - 1:][:-1]) <= 0.1 + 1e-12)


def test_a_joint_measured_beyond_its_limits_while_commanding_holds_until_it_is_back():
    """A gripper's sensor reading 4.0 (limit 3.14) gets no command, tracked or not, until it reads inside again."""
    rig = Rig()
    for _ in range(4):
        rig.step([0.1, 0.1, 0.0], chunk=ramp(0.1, 0.0))
    assert rig.state() == 'commanding'
    sent = len(rig.sent)
    for _ in range(10):
        rig.step([0.1, 0.1, 4.0], chunk=ramp(0.1, 0.0))
    status = rig.loop.status(rig.now, 1.0)
    assert status.level == ERROR and 'gripper 4.000' in status.state
    assert len(rig.sent) == sent + 1 and rig.sent[-1][1] is None, 'one hold, then nothing'
    assert status.counters['joints_outside_limits'] == 1
    for _ in range(3):
        rig.step([0.1, 0.1, 0.0], chunk=ramp(0.1, 0.0))
    assert rig.state() == 'commanding'


def test_limits_loosened_back_within_the_envelope_are_a_logged_safety_event():
    lines = []
    rig = Rig()
    rig.loop._log = lambda severity, text: lines.append((severity, text))
    for _ in range(3):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.0, 0.0))
    tight = dataclasses.replace(rig.loop.settings, limits=MotionLimits(
        np.full(3, -1.0), np.full(3, 1.0), np.full(3, 1.0), 0.05), max_observation_age=0.3)
    rig.loop.update(tight)
    assert not any('safety event' in text for _, text in lines), 'tightening is no event'
    back = dataclasses.replace(tight, limits=LIMITS, max_observation_age=0.5)
    assert rig.loop.check_update(back) is None, 'back to the values given at start: a parameter set may'
    rig.loop.update(back)
    (event,) = [(severity, text) for severity, text in lines if 'safety event' in text]
    assert event[0] == 'warning'
    for part in ('lower (shoulder -1 -> -3.14', 'max_velocity', 'max_step (0.05 -> 0.1)',
                 'max_observation_age (0.3 -> 0.5)'):
        assert part in event[1], event[1]
    assert rig.loop.status(rig.now, 1.0).counters['limits_loosened'] == 1


def test_end_task_holds_at_once_and_until_a_new_instruction():
    """A cancelled goal: one hold through the gate at once, no command until the next task, which starts fresh."""
    rig = Rig()
    for _ in range(6):
        rig.step([0.0, 0.0, 0.0], chunk=ramp(0.3, 0.3))
    commanded, resets = len(rig.sent), rig.loop.status(rig.now, 1.0).counters['episode_resets']
    rig.loop.end_task(rig.now, 'cancelled')
    assert len(rig.sent) == commanded + 1 and rig.sent[-1][1] is None, 'one hold, sent at once'
    np.testing.assert_allclose(rig.sent[-1][0][0], rig.sent[-2][0][0])
    assert rig.loop.hold_reason == 'task ended: cancelled'
    assert rig.loop.status(rig.now, 1.0).counters['episode_resets'] == resets + 1
    for _ in range(4):
        rig.step([0.3, 0.3, 0.3], chunk=ramp(0.6, 0.6))
    assert len(rig.sent) == commanded + 1, 'commanded without a task'
    assert rig.loop.hold_reason.startswith('instruction: no task (cancelled): waiting for an instruction')
    rig.loop.on_instruction('pick up the cube')          # the same text is a new task now
    for _ in range(4):
        rig.step([0.3, 0.3, 0.3], chunk=ramp(0.4, 0.4))
    assert rig.loop.hold_reason is None and len(rig.sent) > commanded + 1


def test_a_chunk_accepted_while_commanding_lets_the_next_request_start_at_once_not_a_tick_later():
    """At 30 Hz a tick is up to 33 ms away: waiting for it adds that much to every chunk's latency."""
    ready = []
    rig = Rig(scheduler={'refill_threshold': 1.0}, on_chunk_ready=lambda: ready.append(rig.loop.hold_reason))
    rig.step([0.0, 0.0, 0.0], chunk=ramp(0.0, 0.0))           # ends the wait for the first chunk
    for _ in range(2):
        rig.step([0.0, 0.0, 0.0])
        assert rig.inference.pending is not None
        request = rig.inference.pending
        ready.clear()
        rig.inference.deliver(ramp(0.0, 0.0), None, rig.now - DT / 2)
        assert ready == [None], 'every accepted chunk is announced, and the loop commands'
        assert rig.inference.pending is None
        rig.loop.refill(rig.now - DT / 2)
        assert rig.inference.pending is not None and rig.inference.pending is not request
        assert rig.inference.pending.obs_time == rig.now - DT / 2
    rig.inference.deliver(ramp(0.0, 0.0), None, rig.now)
    rig.loop.on_joint_state(JOINTS, [0.0, math.nan, 0.0], rig.now, None)      # a fault: nothing is asked
    rig.loop.refill(rig.now)
    assert rig.inference.pending is None
