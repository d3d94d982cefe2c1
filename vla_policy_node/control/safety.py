# SPDX-License-Identifier: Apache-2.0
"""
Motion limits, finiteness and staleness checks for joint commands; pure numpy, fail closed.

The control loop (``loop.py``, its gate ``gate.Gate.emit``) applies these to every command before it leaves. They
never import rclpy, so the same rules are unit-tested without ROS.

Clamping order matters. The target is first clipped into the position limits, then the step
from the previous command is limited to ``min(max_step, max_velocity * dt)`` per joint. A
start outside the limits therefore walks back at the allowed rate instead of jumping; the
control loop publishes such a point only once it lies inside the limits (``contains``).
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np


class SafetyError(ValueError):
    """A command, a state or a limit failed a safety check; the caller must hold instead."""


def check_finite(values: np.ndarray, what: str) -> np.ndarray:
    """
    Return ``values`` as float64, or raise :class:`SafetyError` naming the bad indices.

    Non-finite numbers reach here from NaN joint states or a diverging policy; neither may
    become a command.
    """
    array = np.asarray(values, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise SafetyError(f'{what} has non-finite values at indices {bad.tolist()}')
    return array


def observation_age(stamp: float, now: float) -> float:
    """Seconds between an observation's time and ``now`` (negative if it is from the future)."""
    return now - stamp


def is_fresh(stamp: float | None, now: float, max_age: float) -> bool:
    """
    Whether an observation taken at ``stamp`` may still drive a command at ``now``.

    A missing stamp is never fresh, and neither is one from the future by more than
    ``max_age`` (a clock jump): fail closed rather than trust either.
    """
    if stamp is None or not math.isfinite(stamp):
        return False
    return abs(observation_age(stamp, now)) <= max_age


def stamp_problem(stamp: float, previous: float | None, now: float,
                  max_age: float) -> str | None:
    """
    Say why a message stamped ``stamp`` (its header time, on the node's clock) is unusable.

    ``previous`` is the stamp of the last accepted message of the same stream. A stamp that
    goes backwards means frames arrive out of order; one older than ``max_age`` means the
    data was late even if the message itself arrived just now (a stalled driver flushing its
    queue); one further ahead than ``max_age`` means the sender's clock is not this clock.
    Returns None when the stamp is fine.
    """
    if not math.isfinite(stamp):
        return f'header stamp is not finite ({stamp})'
    age = observation_age(stamp, now)
    if age > max_age:
        return (f'header stamp is {age:.3f} s old, more than max_observation_age '
                f'= {max_age:g} s (late)')
    if age < -max_age:
        return (f'header stamp is {-age:.3f} s ahead of the node clock: synchronise the '
                'clocks or set use_header_stamps to false')
    if previous is not None and stamp < previous:
        return f'header stamp went backwards by {previous - stamp:.3f} s (out of order)'
    return None


@dataclass(frozen=True)
class MotionLimits:
    """
    Per-joint position limits and rate limits that every published command obeys.

    lower, upper, max_velocity: shape (J,), one entry per configured joint (rad or m, and per s).
    max_step: the largest change of any joint between two consecutive commands, whatever dt is;
    it bounds the jump after a stall, when ``max_velocity * dt`` would be large.
    max_tracking_error: shape (J,), how far each joint may be measured from the point its
    controller executes while the loop commands (inf, or None for all: not checked). A joint
    further off does not follow (its controller switched off, the joint blocked or pushed),
    so what its controller executes once it follows again could be that far from it: the
    loop holds instead.
    """

    lower: np.ndarray
    upper: np.ndarray
    max_velocity: np.ndarray
    max_step: float
    max_tracking_error: np.ndarray | None = None

    def __post_init__(self) -> None:
        lower = check_finite(self.lower, 'lower position limits').reshape(-1)
        upper = check_finite(self.upper, 'upper position limits').reshape(-1)
        velocity = check_finite(self.max_velocity, 'max_velocity').reshape(-1)
        if not (lower.size == upper.size == velocity.size) or lower.size == 0:
            raise SafetyError(
                'lower, upper and max_velocity need one entry per joint, got '
                f'{lower.size}, {upper.size} and {velocity.size}')
        if np.any(lower >= upper):
            bad = np.flatnonzero(lower >= upper).tolist()
            raise SafetyError(f'lower position limit must be below upper at joint indices {bad}')
        if np.any(velocity <= 0.0):
            bad = np.flatnonzero(velocity <= 0.0).tolist()
            raise SafetyError(f'max_velocity must be positive at joint indices {bad}')
        if not (math.isfinite(self.max_step) and self.max_step > 0.0):
            raise SafetyError(f'max_step must be positive and finite, got {self.max_step}')
        tracking = (np.full(lower.size, math.inf) if self.max_tracking_error is None
                    else np.asarray(self.max_tracking_error, dtype=np.float64).reshape(-1))
        if tracking.size != lower.size or not np.all(tracking > 0.0):   # NaN fails too
            raise SafetyError(f'max_tracking_error needs one positive entry per joint (inf: not checked), '
                              f'got {tracking.tolist()}')
        for name, value in (('lower', lower), ('upper', upper), ('max_velocity', velocity),
                            ('max_tracking_error', tracking)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @property
    def num_joints(self) -> int:
        """Return the number of joints these limits describe."""
        return int(self.lower.size)

    def max_delta(self, dt: float) -> np.ndarray:
        """Return the largest change (J,) of each joint between two commands ``dt`` apart."""
        return np.minimum(self.max_velocity * dt, self.max_step)

    def tracking_below_one_step(self, dt: float) -> list[int]:
        """
        Return the joints whose ``max_tracking_error`` is below their largest change in one period.

        Such a joint must be measured within one period of its command at full speed, or
        normal motion trips the tracking check (measured lag is one period or more on most arms).
        """
        return np.flatnonzero(self.max_tracking_error < self.max_delta(dt)).tolist()

    def contains(self, points: np.ndarray) -> bool:
        """Tell whether every point (..., J) lies inside the position limits."""
        return bool(np.all((points >= self.lower) & (points <= self.upper)))

    def outside(self, point: np.ndarray) -> list[int]:
        """Return the indices of the joints of ``point`` (J,) outside the position limits."""
        return np.flatnonzero((point < self.lower) | (point > self.upper)).tolist()

    def loosened_from(self, envelope: MotionLimits) -> str | None:
        """Say how these limits reach beyond ``envelope`` (they may only tighten it), or None."""
        if self.num_joints != envelope.num_joints:
            return f'{self.num_joints} joints, the envelope has {envelope.num_joints}'
        checks = (('lower', self.lower < envelope.lower), ('upper', self.upper > envelope.upper),
                  ('max_velocity', self.max_velocity > envelope.max_velocity),
                  ('max_tracking_error', self.max_tracking_error > envelope.max_tracking_error))
        for name, looser in checks:
            if looser.any():
                return (f'{name} at joint indices {np.flatnonzero(looser).tolist()} is looser than '
                        'the limits given at start, which may only be tightened at run time')
        if self.max_step > envelope.max_step:
            return (f'max_step {self.max_step:g} is larger than {envelope.max_step:g} given at '
                    'start, which may only be tightened at run time')
        return None

    def clamp_sequence(self, commands: np.ndarray, previous: np.ndarray, dt: float, what: str = 'commands',
                       first_band: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """
        Clamp commands (T, J) meant for consecutive periods of ``dt``, in order.

        The first is limited against ``previous`` and each next one against the safe version
        of the one before, so the whole sequence, not only its first point, stays inside the
        position limits and within one step of its neighbours. ``first_band`` (low, high) bounds
        the first point further (the step promise in loop-clock time); the step from
        ``previous`` wins where the two do not meet. Returns the safe commands (T, J) and the
        number of clamped joints per command (T,). Inputs are checked once and the position
        limits applied to all rows at once; only the step limit, which chains each row to the
        one before, runs row by row (it runs every control tick).
        """
        targets = check_finite(commands, what)
        start = check_finite(previous, 'previous command').reshape(-1)
        if targets.ndim != 2 or targets.shape[1] != self.num_joints or start.size != self.num_joints:
            raise SafetyError(
                f'expected {self.num_joints} joint values, got {what} of shape {targets.shape} '
                f'and previous {start.size}')
        if not (math.isfinite(dt) and dt > 0.0):
            raise SafetyError(f'dt must be positive and finite, got {dt}')
        clipped = np.clip(targets, self.lower, self.upper)
        max_delta = self.max_delta(dt)
        safe = np.empty_like(clipped)
        step_limited = np.empty(clipped.shape, dtype=bool)
        for i in range(len(clipped)):
            wanted = clipped[i] if i or first_band is None else np.clip(clipped[i], *first_band)
            delta = wanted - start
            step_limited[i] = (np.abs(delta) > max_delta) | (wanted != clipped[i])
            safe[i] = start = np.where(np.abs(delta) > max_delta, start + np.clip(delta, -max_delta, max_delta),
                                       wanted)
        clamped = np.count_nonzero(step_limited | (clipped != targets), axis=1)
        return safe, clamped
