# SPDX-License-Identifier: Apache-2.0
"""
Action outputs (ROS-free): the control loop, a group's GoalAnswers and a model controller and arm.

The controller runs goals as joint_trajectory_controller does (from where the joints are, a new
goal preempting the running one, which ends canceled) or fails as real ones do: it rejects every
goal, accepts and aborts them, answers SUCCEEDED without moving, answers nothing for a while and
then all at once, or its action server is gone; and it comes back. For any sequence of these,
every goal the controller runs starts within ``max_step`` of where the joints are, give or take
what they moved between the goal leaving and being run (a goal answered late, while an older
one still ran: a still arm, as after any fault, gets ``max_step`` exactly), and a controller that
runs nothing is sent a goal every second or more, not every tick.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings, strategies as st
import numpy as np

from loop_harness import ScriptedInference

from vla_policy_node.control.chunking import SchedulerConfig
from vla_policy_node.control.goal_answers import COUNTERS, GoalAnswers, Outcome, QUIET_S, RESPONSE_TIMEOUT_S
from vla_policy_node.control.loop import ControlLoop, LoopSettings
from vla_policy_node.control.safety import MotionLimits

JOINTS = ('a', 'b', 'c')
RATE = 20.0
DT = 1.0 / RATE
FRAME = np.zeros((4, 4, 3), np.uint8)
LIMITS = MotionLimits(np.full(3, -3.0), np.full(3, 3.0), np.full(3, 4.0), 0.1)
FAULTS = ('reject', 'abort', 'lie', 'silent', 'gone')


class ModelController:
    """One action server and the joints it drives; ``mode`` is how it treats the goals it is sent."""

    def __init__(self, answers: GoalAnswers) -> None:
        self.answers = answers
        self.mode = 'follow'
        self.joints = np.zeros(3)
        self.running: tuple[int, float, np.ndarray, np.ndarray] | None = None    # (goal, start, from, points)
        self.queued: list[tuple[int, np.ndarray, np.ndarray]] = []  # requests not answered: (goal, points, joints)
        self.next_id = 0
        self.runs = 0
        self.sent_while_faulty = 0

    def send(self, points: np.ndarray, now: float, wall: float) -> None:
        """Take a goal of points (T, J) from the loop's sink, point i due (i + 1) periods on, as ActionOutput does."""
        if not self.answers.may_send():
            return
        self.next_id += 1
        self.answers.sent(self.next_id, now, wall, DT, len(points) * DT)
        self.sent_while_faulty += self.mode != 'follow'
        if self.mode == 'gone':
            return                                  # lost with the server
        self.queued.append((self.next_id, points, self.joints.copy()))
        if self.mode != 'silent':
            self.answer(now, wall)

    def answer(self, now: float, wall: float) -> None:
        """Answer every queued request, as the mode says; run what it accepts."""
        queued, self.queued = self.queued, []
        for goal, points, joints_then in queued:
            if self.mode == 'reject':
                self.answers.responded(goal, False, wall)
                continue
            given_up = self.answers.responded(goal, True, wall)
            if self.mode == 'abort':
                self.answers.finished(goal, Outcome.ABORTED, now, wall, detail=': scripted')
            elif self.mode == 'lie':
                self.answers.finished(goal, Outcome.SUCCEEDED, now, wall)
            else:
                self.run(goal, points, joints_then, now, wall, given_up)

    def run(self, goal: int, points: np.ndarray, joints_then: np.ndarray, now: float, wall: float,
            given_up: bool) -> None:
        """Run a trajectory from where the joints are (the promise: its first point is one step from them)."""
        jump = np.abs(points[0] - self.joints)
        moved = np.abs(self.joints - joints_then)
        assert np.all(jump <= LIMITS.max_step + moved + 1e-9), \
            f'a goal run starts {jump} from the joints, which moved {moved} since it left'
        if self.running is not None:
            self.answers.finished(self.running[0], Outcome.CANCELED, now, wall)
        self.running = None if given_up else (goal, now, self.joints.copy(), points)   # given up: cancelled at once
        self.runs += 1

    def stop(self) -> None:
        """Cancel the running goal (the node does, once it refuses the group): the joints stay where they are."""
        self.running = None

    def move(self, now: float, wall: float) -> None:
        """Move the joints to ``now`` along the running trajectory; it succeeds once its last point is due."""
        if self.running is None:
            return
        goal, start, origin, points = self.running
        times = np.arange(len(points) + 1) * DT
        path = np.vstack([origin, points])
        self.joints = np.array([np.interp(now - start, times, path[:, j]) for j in range(3)])
        if now - start >= times[-1]:
            self.answers.finished(goal, Outcome.SUCCEEDED, now, wall)
            self.running = None


COVERAGE: Counter = Counter()

mode = st.sampled_from(('follow', 'follow') + FAULTS)
segment = st.tuples(mode, st.integers(1, 80), st.sampled_from([DT, DT, DT, DT / 3, 2.5 * DT]))


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(segment, min_size=2, max_size=8), st.sampled_from([1, 4]), st.integers(0, 2**31 - 1))
def run_sequence(segments, points, seed):
    rng = np.random.default_rng(seed)
    counters = dict.fromkeys(COUNTERS, 0)
    stop: list = []
    answers = GoalAnswers('/arm_controller/follow_joint_trajectory', counters, on_refused=lambda: stop[0]())
    controller = ModelController(answers)
    stop.append(controller.stop)
    clock = [0.0]
    inference = ScriptedInference()
    loop = ControlLoop(LoopSettings(JOINTS, ('front',), RATE, LIMITS, max_observation_age=0.5, plan_points=points),
                       SchedulerConfig(control_rate_hz=RATE, horizon=4), inference,
                       lambda safe, obs, send_to: controller.send(safe, clock[0], clock[0]),
                       wall_clock=lambda: clock[0])
    loop.on_instruction('pick')
    for kind, periods, period in segments:
        controller.mode = kind
        faulty_since, sent_before = clock[0], controller.sent_while_faulty
        for _ in range(periods):
            now = clock[0]
            if kind != 'silent':
                controller.answer(now, now)             # a silent controller answers all at once when back
            controller.move(now, now)
            refused = answers.refusal(now)
            ready = kind != 'gone'
            unheard = (0, 1, 2) if not ready or refused is not None or answers.awaiting else ()
            loop.set_command_link(int(ready), 0, '/arm', unheard, refused)
            loop.on_image('front', FRAME, now, now)
            loop.on_joint_state(JOINTS, controller.joints.tolist(), now, now)
            loop.tick(now)
            if inference.pending is not None:
                chunk = controller.joints + rng.uniform(-1.0, 1.0, (4, 3))
                inference.deliver(chunk, None, now + 0.01)
            clock[0] += period
        if kind in FAULTS:
            seconds = clock[0] - faulty_since
            sent = controller.sent_while_faulty - sent_before
            # A goal per tick until the answers say so (none while one is unanswered), then one (and its hold)
            # per quiet at most.
            assert sent <= 3 + 2 * (seconds / QUIET_S + 1), f'{sent} goals in {seconds:.2f} s of {kind}'
            COVERAGE[kind] += 1
            COVERAGE[f'{kind} refused'] += refused is not None or kind == 'gone'
    COVERAGE['runs'] += controller.runs
    COVERAGE['sequences'] += 1
    for counter in COUNTERS[1:]:
        COVERAGE[counter] += counters[counter]


def test_every_goal_a_controller_runs_starts_one_step_from_its_joints_whatever_it_did_before():
    COVERAGE.clear()
    run_sequence()
    assert COVERAGE['sequences'] == 300
    assert COVERAGE['runs'] >= 3000, COVERAGE
    for kind in FAULTS:
        assert COVERAGE[f'{kind} refused'] >= 10, COVERAGE
    for counter in COUNTERS[1:]:
        assert COVERAGE[counter] >= 10, COVERAGE


def test_a_refusal_lasts_its_quiet_doubling_while_goals_keep_failing_and_ends_on_a_goal_run():
    counters = dict.fromkeys(COUNTERS, 0)
    warnings: list[str] = []
    answers = GoalAnswers('/arm', counters, warnings.append)
    answers.sent(1, 0.0, 0.0, 0.05, 0.2)
    assert answers.awaiting and answers.refusal(0.1) is None
    answers.responded(1, False, 0.1)
    assert not answers.awaiting
    assert answers.refusal(0.2).startswith('/arm rejected a goal: holding; the next goal steps from the measured')
    assert answers.refusal(0.1 + QUIET_S) is None
    answers.sent(2, 1.2, 1.2, 0.05, 0.2)
    answers.responded(2, False, 1.2)
    assert answers.refusal(1.2 + QUIET_S) is not None, 'the second refusal in a row lasts twice as long'
    assert answers.refusal(1.2 + 2 * QUIET_S) is None
    answers.sent(3, 3.3, 3.3, 0.05, 0.2)
    assert answers.responded(3, True, 3.3) is False
    answers.finished(3, Outcome.CANCELED, 3.4, 3.4)         # ran, preempted: the strikes are forgiven
    answers.sent(4, 3.5, 3.5, 0.05, 0.2)
    answers.responded(4, False, 3.5)
    assert answers.refusal(3.5 + QUIET_S) is None
    assert counters['command_goals_rejected'] == 3 and warnings == ['/arm rejected a goal'], 'warned once'


def test_a_goal_unanswered_too_long_is_given_up_and_cancelled_when_accepted_late():
    counters = dict.fromkeys(COUNTERS, 0)
    answers = GoalAnswers('/arm', counters)
    assert answers.may_send()
    answers.sent(1, 0.0, 0.0, 0.05, 0.05)
    assert not answers.may_send(), 'held back while unanswered: a hung controller queues one goal, not one a tick'
    assert answers.refusal(RESPONSE_TIMEOUT_S) is None
    assert 'gave no answer to a goal request within' in answers.refusal(RESPONSE_TIMEOUT_S + 0.01)
    assert counters['command_goals_unanswered'] == 1 and answers.unanswered == [1]
    assert answers.responded(1, True, 1.0) is True, 'given up: the caller cancels it'


def test_a_goal_held_back_makes_the_next_one_step_from_the_measured_joints():
    answers = GoalAnswers('/arm', dict.fromkeys(COUNTERS, 0))
    answers.sent(1, 0.0, 0.0, 0.05, 0.2)
    assert not answers.may_send() and answers.awaiting
    answers.responded(1, True, 0.01)                        # on time, but the loop's last command never left
    assert answers.awaiting, 'the next goal steps from the measured joints'
    assert answers.may_send()
    answers.sent(2, 0.05, 0.05, 0.05, 0.2)
    answers.responded(2, True, 0.06)
    assert not answers.awaiting


def test_an_early_success_is_a_goal_not_run_but_a_gripper_reaches_its_goal_at_once():
    counters = dict.fromkeys(COUNTERS, 0)
    arm, gripper = GoalAnswers('/arm', counters), GoalAnswers('/gripper', counters, checks_timing=False)
    for answers in (arm, gripper):
        answers.sent(1, 10.0, 10.0, 0.05, 0.4)
        answers.responded(1, True, 10.001)
        answers.finished(1, Outcome.SUCCEEDED, 10.002, 10.002)
    assert 'ended a goal SUCCEEDED 0.002 s after it was sent, before its 0.400 s' in arm.refusal(10.01)
    assert gripper.refusal(10.01) is None
    arm.sent(2, 20.0, 20.0, 0.05, 0.4)
    arm.responded(2, True, 20.0)
    arm.finished(2, Outcome.SUCCEEDED, 20.45, 20.45)
    assert arm.refusal(20.5) is None, 'on time: it ran'
    gripper.sent(2, 30.0, 30.0, 0.05, 0.05)
    gripper.responded(2, True, 30.0)
    gripper.finished(2, Outcome.ABORTED, 30.1, 30.1, stalled=True)
    assert gripper.refusal(30.1) is None, 'stalled on what it grasps'
    gripper.sent(3, 31.0, 31.0, 0.05, 0.05)
    gripper.responded(3, True, 31.0)
    gripper.finished(3, Outcome.ABORTED, 31.1, 31.1, detail=': position 0.2, reached_goal False')
    assert gripper.refusal(31.1) == ('/gripper aborted a goal: position 0.2, reached_goal False: holding; the next '
                                     'goal steps from the measured joints')
