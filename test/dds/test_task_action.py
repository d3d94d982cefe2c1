# SPDX-License-Identifier: Apache-2.0
"""
TaskAction (ros/task_action.py) in process: which goals it takes, and how each ending reaches the loop.

A scripted loop stands in for the control loop (it records end_task, the hold that ends a
goal, and instructions); the goal handles are scripted too, and the node's ``~/episode``
events are read from the Episodes publisher. The node-level behaviour (cancel, time-out,
success and preemption against the simulated arm) is test_run_instruction.py's; bursts, races
and hostile successes through a node process are test_task_action_dds.py's.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
import uuid

from hypothesis import given, settings, strategies as st

import pytest
import rclpy
from rclpy.action import CancelResponse, GoalResponse
from ros_harness import next_domain_id
from unique_identifier_msgs.msg import UUID
from vla_policy_interfaces.action import RunInstruction
from vla_policy_interfaces.msg import Episode, TaskSuccess

from vla_policy_node.control.state import Mode
from vla_policy_node.ros.episodes import Episodes
from vla_policy_node.ros.task_action import GOALS_AT_ONCE, MAX_GOALS_KEPT, TaskAction

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

    def reset_episode(self, why: str) -> int:
        self.resets.append(why)
        return len(self.resets)

    def end_task(self, now: float, why: str) -> None:
        self.ended.append(why)


class Handle:
    """A goal handle: its request and id, and the feedback it was given."""

    def __init__(self, instruction: str, time_limit: float = 0.0, mode: int = RunInstruction.Goal.CONFIRM) -> None:
        self.request = RunInstruction.Goal(instruction=instruction, time_limit=time_limit, time_limit_mode=mode)
        self.goal_id = UUID(uuid=list(uuid.uuid4().bytes))
        self.feedback = []

    def execute(self) -> None:
        pass

    def publish_feedback(self, feedback) -> None:
        self.feedback.append(feedback)


class Events(Episodes):
    """The Episodes publisher, its events kept."""

    def __init__(self, node) -> None:
        super().__init__(node)
        self.events: list[Episode] = []

    def _publish(self, event, instruction, outcome, reason, goal_id) -> None:
        super()._publish(event, instruction, outcome, reason, goal_id)
        self.events.append(Episode(event=event, episode=self.current, instruction=instruction, outcome=outcome,
                                   reason=reason, goal_id=goal_id or UUID()))


def success(episode: int, seconds: float) -> TaskSuccess:
    msg = TaskSuccess(episode=episode)
    msg.stamp.sec, msg.stamp.nanosec = int(seconds), int(round(seconds % 1 * 1e9))
    return msg


@contextmanager
def task_action(context):
    """Yield (TaskAction on a node of its own, its scripted loop, its clock and refusal)."""
    node = rclpy.create_node('task_action_test', context=context)
    clock = SimpleNamespace(t=100.0, refusal=None)
    loop = ScriptedLoop()
    action = TaskAction(node, 'task_success', 40, lambda: loop, lambda: clock.refusal, lambda: clock.t,
                        Events(node))
    try:
        yield action, loop, clock
    finally:
        action.destroy()
        node.destroy_node()


@pytest.fixture(scope='module')
def rcl_context():
    """Initialise a context of this module's own for its nodes."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    yield context
    rclpy.try_shutdown(context=context)


@pytest.fixture
def task(rcl_context):
    with task_action(rcl_context) as made:
        yield made


def ended(done) -> tuple[int, str]:
    """Return the outcome and reason of a goal that ended."""
    assert done.done(), 'the goal has not ended'
    return done.result().outcome, done.result().reason


def accept(action, handle):
    """Accept ``handle`` as the action server would; return its ending (a future)."""
    action._on_accepted(handle)
    return action._endings[bytes(handle.goal_id.uuid)]


def test_goals_are_refused_with_a_reason_when_the_node_cannot_take_them(task):
    action, _, clock = task
    Goal = RunInstruction.Goal
    assert action._on_goal(Goal(instruction='wave', time_limit=5.0)) == GoalResponse.ACCEPT
    assert action._on_goal(Goal(instruction='wave', time_limit=5.0, time_limit_mode=Goal.DURATION)) == \
        GoalResponse.ACCEPT
    for goal in (Goal(instruction='x' * 41), Goal(instruction='wave', time_limit=-1.0),
                 Goal(instruction='wave', time_limit=float('nan')), Goal(instruction='wave', time_limit_mode=2),
                 Goal(instruction='wave', time_limit_mode=Goal.DURATION)):
        assert action._on_goal(goal) == GoalResponse.REJECT
    clock.refusal = 'inactive: activate the node first'
    assert action._on_goal(Goal(instruction='wave')) == GoalResponse.REJECT


def test_a_goal_starts_an_episode_gives_feedback_and_times_out_through_the_loop(task):
    action, loop, clock = task
    first = Handle('touch the red block', time_limit=2.0)
    accept(action, first)
    assert loop.instructions == ['touch the red block'] and loop.resets == []
    loop.ticks, clock.t = 20, 101.0
    action.on_tick()
    feedback = first.feedback[-1]
    assert (feedback.episode, feedback.control_steps, feedback.chunks, feedback.elapsed) == (1, 20, 2, 1.0)
    second = Handle('touch the red block', time_limit=2.0)       # the same text again: reset by the goal
    done = accept(action, second)
    assert loop.resets == ['run_instruction goal'], 'a new goal always starts a fresh episode'
    clock.t = 103.5
    action.on_tick()
    assert loop.ended == ['run_instruction goal timed out'] and ended(done)[0] == Result.TIMED_OUT
    assert done.result().episode == 2
    events = [(e.event, e.episode, e.outcome) for e in action._episodes.events]
    assert events == [(Episode.STARTED, 1, 0), (Episode.ENDED, 1, Result.PREEMPTED), (Episode.STARTED, 2, 0),
                      (Episode.ENDED, 2, Result.TIMED_OUT)]
    assert action._episodes.events[2].goal_id == second.goal_id


def test_duration_mode_ends_completed_at_its_time_limit(task):
    action, loop, clock = task
    done = accept(action, Handle('wave', time_limit=2.0, mode=RunInstruction.Goal.DURATION))
    clock.t = 102.0
    action.on_tick()
    outcome, reason = ended(done)
    assert outcome == Result.COMPLETED and 'DURATION' in reason
    assert loop.ended == ['run_instruction goal completed its time']


def test_cancel_success_and_a_protective_stop_each_end_the_goal(task):
    action, loop, clock = task
    handle = Handle('wave')
    done = accept(action, handle)
    assert action._on_cancel(Handle('someone else')) == CancelResponse.REJECT
    assert action._on_cancel(handle) == CancelResponse.ACCEPT
    assert loop.ended == ['run_instruction goal cancelled'] and ended(done)[0] == Result.CANCELLED
    assert action._on_cancel(handle) == CancelResponse.REJECT, 'an ended goal is not cancelled again'

    done = accept(action, Handle('wave'))
    action._on_success(success(action._episodes.current, clock.t))
    action.on_tick()
    assert loop.ended[-1] == 'run_instruction goal succeeded' and ended(done)[0] == Result.SUCCEEDED

    done = accept(action, Handle('wave'))
    loop.mode, loop.hold_reason = Mode.LATCHED, 'tracking error on elbow_flex'
    action.on_tick()
    outcome, reason = ended(done)
    assert outcome == Result.FAULTED and 'tracking error on elbow_flex' in reason
    assert len(loop.ended) == 2, 'a protective stop holds by itself: no second hold'


def test_a_success_counts_only_for_the_goals_episode_and_after_its_acceptance(task):
    action, loop, clock = task
    accept(action, Handle('wave'))
    clock.t = 105.0
    done = accept(action, Handle('wave'))
    episode = action._episodes.current
    for stale_or_foreign in (success(episode, 104.9), success(episode - 1, 105.5), success(episode + 1, 105.5),
                             TaskSuccess(episode=episode)):
        action._on_success(stale_or_foreign)
        action.on_tick()
        assert not done.done(), stale_or_foreign
    action._on_success(success(episode, 105.0))
    action.on_tick()
    assert ended(done)[0] == Result.SUCCEEDED


def test_goals_past_the_burst_bound_end_refused_and_the_running_goal_goes_on(task):
    action, loop, clock = task
    endings = [accept(action, Handle(f'wave {i}')) for i in range(GOALS_AT_ONCE + 5)]
    running = endings[GOALS_AT_ONCE - 1]
    assert all(ended(done)[0] == Result.PREEMPTED for done in endings[:GOALS_AT_ONCE - 1])
    assert not running.done()
    for done in endings[GOALS_AT_ONCE:]:
        outcome, reason = ended(done)
        assert outcome == Result.REFUSED and 'too many goals at once' in reason and done.result().episode == 0
    assert loop.instructions[-1] == f'wave {GOALS_AT_ONCE - 1}', 'a refused goal reached the loop'


def test_past_the_goals_a_server_keeps_a_goal_is_rejected(task):
    action, _, _ = task
    answers = [action._on_goal(RunInstruction.Goal(instruction='wave')) for _ in range(MAX_GOALS_KEPT + 1)]
    assert answers[:-1] == [GoalResponse.ACCEPT] * MAX_GOALS_KEPT and answers[-1] == GoalResponse.REJECT


def test_stopping_the_node_ends_the_goal_faulted_or_the_topics_episode(task):
    action, loop, clock = task
    action._episodes.on_instruction('wave', False)
    action.abort('the node stopped: holding')
    done = accept(action, Handle('wave'))
    action.abort('the lifecycle node left active: holding')
    assert ended(done) == (Result.FAULTED, 'the lifecycle node left active: holding')
    events = [(e.event, e.episode, e.instruction, e.reason) for e in action._episodes.events]
    assert events == [(Episode.STARTED, 1, 'wave', 'instruction topic'),
                      (Episode.ENDED, 1, 'wave', 'the node stopped: holding'),
                      (Episode.STARTED, 2, 'wave', 'run_instruction goal'),
                      (Episode.ENDED, 2, 'wave', 'the lifecycle node left active: holding')]


GOALS = st.tuples(st.just('goal'), st.sampled_from([RunInstruction.Goal.CONFIRM, RunInstruction.Goal.DURATION]),
                  st.sampled_from([0.5, 2.0]))
SUCCESSES = st.tuples(st.just('success'), st.sampled_from([-2, -1, 0, 0, 1]), st.sampled_from([-0.5, -1e-3, 0.0, 0.3]))
STEPS = st.one_of(
    GOALS, GOALS, SUCCESSES, SUCCESSES,
    st.tuples(st.just('cancel'), st.integers(0, 20)),
    st.tuples(st.just('reset')),
    st.tuples(st.just('tick'), st.sampled_from([0.05, 0.05, 0.4, 1.0])),
    st.tuples(st.just('latch')),
    st.tuples(st.just('abort')))


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(STEPS, min_size=20, max_size=80))
def test_every_goal_ends_once_with_an_outcome_and_succeeds_only_on_its_own_success(rcl_context, steps):
    """Whatever the order of goals, cancels, successes, resets, ticks, stops and faults."""
    with task_action(rcl_context) as (action, loop, clock):
        handles, endings, valid = [], [], set()     # valid: indices of goals a valid success reached
        for step in steps:
            running = next((i for i, done in enumerate(endings) if not done.done()), None)
            if step[0] == 'goal':
                handles.append(Handle('wave', time_limit=step[2], mode=step[1]))
                endings.append(accept(action, handles[-1]))
            elif step[0] == 'cancel' and handles:
                action._on_cancel(handles[step[1] % len(handles)])
            elif step[0] == 'success':
                episode, stamp = action._episodes.current + step[1], clock.t + step[2]
                if running is not None and step[1] == 0 and stamp >= action._goal.started:
                    valid.add(running)
                action._on_success(success(episode, stamp))
            elif step[0] == 'reset':
                action._episodes.start(None, 'reset_episode service')
            elif step[0] == 'tick':
                clock.t += step[1]
                action.on_tick()
            elif step[0] == 'latch':
                loop.mode = Mode.LATCHED
                action.on_tick()
                loop.mode = Mode.COMMANDING
            else:
                action.abort('the node stopped: holding')
            assert sum(not done.done() for done in endings) <= 1, 'two goals run'
        for i, done in enumerate(endings):
            if done.done():
                outcome, reason = ended(done)
                assert Result.SUCCEEDED <= outcome <= Result.REFUSED and reason, done.result()
                assert outcome != Result.SUCCEEDED or i in valid, 'a success that was not the goal\'s ended it'
                assert (outcome == Result.REFUSED) == (done.result().episode == 0)
        ends = [e for e in action._episodes.events if e.event == Episode.ENDED]
        assert all(e.outcome != Result.REFUSED for e in ends), 'a refused goal had an episode'
