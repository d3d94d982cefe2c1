# SPDX-License-Identifier: Apache-2.0
"""The lockstep's rules (when the simulator may step, the wall-clock bound) and the episode line's reports."""

import itertools
import math

from hypothesis import given, strategies as st
import pytest

from vla_policy_node.ros.sim.lockstep import Cadence, Lockstep, RealTimeFactor
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


@given(st.floats(0.004, 0.05), st.floats(2.0, 5.0), st.lists(st.floats(0.0, 0.9), min_size=200, max_size=400))
def test_a_cadence_checked_at_a_faster_tick_keeps_its_rate_without_bursts(tick, ratio, lateness):
    """E.g. a 30 Hz camera on 100 Hz physics ticks that come late by up to most of a tick (no stall)."""
    period = tick * ratio
    cadence = Cadence(period, 0.0)
    times = list(itertools.accumulate((k * tick + late * tick for k, late in enumerate(lateness)), max))
    fired = [t for t in times if cadence.due(t)]
    expected = times[-1] / period
    assert expected - 2 <= len(fired) <= expected + 2                                # the rate on average
    assert all(b - a > 0 for a, b in zip(fired, fired[1:]))                           # one per tick at most
    assert all(c - a >= period - 1e-9 for a, c in zip(fired, fired[2:]))              # never three in a period


def test_a_cadence_after_a_stall_starts_afresh_and_restart_counts_from_now():
    cadence = Cadence(0.1, 0.0)
    assert cadence.due(0.0) and not cadence.due(0.05) and cadence.due(0.1)
    assert cadence.due(1.0)                         # stalled 0.8 s: one, not eight in a row
    assert not cadence.due(1.01) and not cadence.due(1.09) and cadence.due(1.1)
    cadence.restart(1.15)
    assert not cadence.due(1.2) and cadence.due(1.25)
    with pytest.raises(ValueError):
        Cadence(0.0, 0.0)
