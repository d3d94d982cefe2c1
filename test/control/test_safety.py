# SPDX-License-Identifier: Apache-2.0
"""Motion limits, finiteness and staleness: the rules every published command obeys."""

import numpy as np
import pytest

from vla_policy_node.control.safety import check_finite, is_fresh, MotionLimits, SafetyError


def limits(max_step: float = 0.1) -> MotionLimits:
    return MotionLimits(lower=np.array([-1.0, -2.0]), upper=np.array([1.0, 2.0]),
                        max_velocity=np.array([1.0, 4.0]), max_step=max_step)


def clamp(limits: MotionLimits, command, previous, dt: float):
    """Clamp one command through the gate's ``clamp_sequence`` (what ``MotionLimits.clamp`` did)."""
    safe, clamped = limits.clamp_sequence(np.reshape(command, (1, -1)), previous, dt, what='command')
    return safe[0], int(clamped[0])


def test_command_inside_limits_is_unchanged():
    safe, clamped = clamp(limits(), np.array([0.05, 0.1]), np.zeros(2), dt=0.05)
    np.testing.assert_array_equal(safe, [0.05, 0.1])
    assert clamped == 0


def test_position_limits_then_step_limit():
    safe, clamped = clamp(limits(max_step=10.0), np.array([5.0, -0.1]), np.array([0.98, 0.0]), dt=0.05)
    np.testing.assert_allclose(safe, [1.0, -0.1])
    assert clamped == 1


def test_step_is_the_smaller_of_velocity_and_max_step():
    safe, clamped = clamp(limits(max_step=0.1), np.array([0.9, 1.9]), np.zeros(2), dt=0.05)
    np.testing.assert_allclose(safe, [0.05, 0.1])  # 1.0 * 0.05, then max_step 0.1 < 4 * 0.05
    assert clamped == 2


def test_robot_outside_limits_walks_back_at_the_allowed_rate():
    safe, _ = clamp(limits(), np.array([1.5, 0.0]), np.array([1.5, 0.0]), dt=0.05)
    np.testing.assert_allclose(safe, [1.45, 0.0])


@pytest.mark.parametrize('command, previous', [
    ([np.nan, 0.0], [0.0, 0.0]),
    ([0.0, np.inf], [0.0, 0.0]),
    ([0.0, 0.0], [np.nan, 0.0]),
    ([0.0], [0.0, 0.0]),
])
def test_non_finite_or_misshaped_input_fails_closed(command, previous):
    with pytest.raises(SafetyError):
        clamp(limits(), np.array(command), np.array(previous), dt=0.05)


def test_non_positive_dt_fails_closed():
    with pytest.raises(SafetyError, match='dt must be positive'):
        clamp(limits(), np.zeros(2), np.zeros(2), dt=0.0)


@pytest.mark.parametrize('kwargs, message', [
    (dict(lower=[1.0], upper=[0.0], max_velocity=[1.0]), 'below upper at joint indices [0]'),
    (dict(lower=[0.0], upper=[1.0], max_velocity=[0.0]), 'max_velocity must be positive'),
    (dict(lower=[0.0, 0.0], upper=[1.0], max_velocity=[1.0]), 'one entry per joint'),
    (dict(lower=[np.nan], upper=[1.0], max_velocity=[1.0]), 'non-finite'),
])
def test_invalid_limits_are_refused(kwargs, message):
    arrays = {key: np.array(value) for key, value in kwargs.items()}
    with pytest.raises(SafetyError, match=message.replace('[', r'\[').replace(']', r'\]')):
        MotionLimits(max_step=0.1, **arrays)


def test_limits_are_read_only():
    with pytest.raises(ValueError):
        limits().lower[0] = 5.0


def test_check_finite_names_the_bad_indices():
    with pytest.raises(SafetyError, match=r'state has non-finite values at indices \[1\]'):
        check_finite(np.array([0.0, np.nan]), 'state')


@pytest.mark.parametrize('stamp, now, fresh', [
    (10.0, 10.4, True), (10.0, 10.6, False), (None, 10.0, False),
    (float('nan'), 10.0, False), (11.0, 10.0, False),
])
def test_freshness(stamp, now, fresh):
    assert is_fresh(stamp, now, max_age=0.5) is fresh
