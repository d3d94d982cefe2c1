# SPDX-License-Identifier: Apache-2.0
"""The lockstep's rules (when the simulator may step, the wall-clock bound) and the episode line's reports."""

import math

from hypothesis import given, strategies as st
import pytest

from vla_policy_node.ros.sim.lockstep import Lockstep, RealTimeFactor
from vla_policy_node.ros.sim.robot import EpisodeReport, format_report


class FakeWall:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_step_waits_for_the_answer_of_its_own_tick():
    wall = FakeWall()
    pace = Lockstep(2.0, wall)
    pace.stepped(1.05)
    assert not pace.answered
    assert not pace.answer(1.0)             # an answer to an earlier tick answers nothing
    assert not pace.answered
    assert pace.answer(1.05) and pace.answered
    pace.stepped(1.10)
    assert not pace.answered and pace.unanswered == 0


def test_a_silent_node_is_waited_for_up_to_the_bound_then_steps_go_on_in_real_time_and_are_counted():
    wall = FakeWall()
    pace = Lockstep(2.0, wall)
    pace.stepped(1.05)
    wall.now += 1.9
    assert not pace.overdue() and not pace.late
    wall.now += 0.2
    assert pace.overdue() and pace.late
    for k in range(3):                  # real time: every step is owed an answer, counted
        pace.stepped(1.10 + 0.05 * k)
        assert pace.overdue()           # late: no new wait of the whole bound
    assert pace.unanswered == 3
    assert pace.answer(1.20) and not pace.late and not pace.overdue()
    pace.stepped(1.25)
    assert pace.unanswered == 3 and not pace.overdue()


def test_a_new_episode_waits_for_the_nodes_reset_and_starts_counting_afresh():
    wall = FakeWall()
    pace = Lockstep(1.0, wall)
    pace.stepped(1.0)
    wall.now += 5.0
    pace.overdue()
    pace.stepped(1.05)
    pace.wait_again()
    assert not pace.answered and pace.unanswered == 0 and not pace.late
    assert pace.answer(math.inf) and pace.answered


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match='lockstep_timeout'):
        Lockstep(0.0)


@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 3.0)), max_size=40))
def test_the_unanswered_count_is_the_steps_taken_without_an_answer(events):
    wall = FakeWall()
    pace = Lockstep(1.0, wall)
    t, missing = 1.0, 0
    pace.stepped(t)
    for answer, wait in events:
        wall.now += wait
        if answer:
            pace.answer(t)
        missing += not pace.answered
        t += 0.05
        pace.stepped(t)
    assert pace.unanswered == missing


def test_the_real_time_factor_is_simulated_over_wall_clock_seconds():
    wall = FakeWall()
    rtf = RealTimeFactor(wall)
    rtf.start(10.0)
    assert math.isnan(rtf.factor(10.0))
    wall.now += 2.0
    assert rtf.factor(11.0) == pytest.approx(0.5)


def test_the_episode_line_gives_the_real_time_factor_and_a_failures_hold_reason():
    failed = EpisodeReport(instruction='touch the red block', sent='touch the red block', success=False,
                           steps=90, first_command_ms=float('nan'), policy_p50_ms=12.0, real_time_factor=0.61,
                           hold='joints do not follow the command: shoulder_lift 0.62', unanswered=0)
    line = format_report(3, 10, failed)
    assert 'real-time factor 0.61' in line and 'node held: joints do not follow the command' in line
    assert 'unanswered' not in line
    late = EpisodeReport(instruction='touch the red block', sent='touch the red block', success=True,
                         steps=40, first_command_ms=33.3, policy_p50_ms=12.0, real_time_factor=1.8,
                         hold='waiting for actions from the policy', unanswered=4)
    line = format_report(4, 10, late)
    assert 'unanswered ticks 4' in line and 'held' not in line       # a success has no hold to explain
