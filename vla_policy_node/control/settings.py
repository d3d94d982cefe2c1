# SPDX-License-Identifier: Apache-2.0
"""What the control loop obeys (:class:`LoopSettings`) and what it reports (:class:`LoopStatus`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
import math

import numpy as np

from vla_policy_node.control.health import FaultReport, InputHealth
from vla_policy_node.control.safety import MotionLimits


@dataclass(frozen=True)
class LoopSettings:
    """
    What the loop obeys; the run-time tunables can change through :meth:`ControlLoop.update`.

    max_action_age: seconds an action's observation may be old when it executes; 0 derives
    it as ``max_observation_age + horizon / control_rate_hz`` (fresh when the chunk starts,
    then executed for one horizon). plan_points: points per command (this tick's first; 0:
    every planned action, 1: this tick only); first_point_joints: the joints whose controller
    takes only the first (a forward command controller beside a trajectory controller). The
    watchdog holds after ``max_observation_age`` of wall-clock time without a tick (a stopped
    /clock under sim time).
    """

    joint_names: tuple[str, ...]
    camera_names: tuple[str, ...]
    control_rate_hz: float
    limits: MotionLimits
    max_observation_age: float = 0.5
    max_action_age: float = 0.0
    use_header_stamps: bool = True
    reset_on_instruction_change: bool = True
    plan_points: int = 0
    first_point_joints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.limits.num_joints != len(self.joint_names):
            raise ValueError(f'limits describe {self.limits.num_joints} joints, '
                             f'joint_names has {len(self.joint_names)}')
        for name in ('control_rate_hz', 'max_observation_age'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f'{name} must be finite and > 0, got {value}')
        if not (math.isfinite(self.max_action_age) and self.max_action_age >= 0):
            raise ValueError(f'max_action_age must be finite and >= 0, got {self.max_action_age}')
        if self.plan_points < 0:
            raise ValueError(f'plan_points must be >= 0, got {self.plan_points}')
        if any(not 0 <= i < len(self.joint_names) for i in self.first_point_joints):
            raise ValueError(f'first_point_joints {self.first_point_joints} must index joint_names')

    @property
    def dt(self) -> float:
        """Return the nominal control period in seconds."""
        return 1.0 / self.control_rate_hz

    def action_age_limit(self, horizon: int) -> float:
        """``max_action_age``, or its derived default for chunks of ``horizon`` actions."""
        if self.max_action_age > 0:
            return self.max_action_age
        return self.max_observation_age + horizon * self.dt


@dataclass(frozen=True)
class LoopStatus:
    """A consistent snapshot for /diagnostics (levels: control.health)."""

    state: str
    level: int
    counters: dict[str, int]
    inputs: Sequence[InputHealth] = field(default_factory=tuple)
    policy_faults: FaultReport = FaultReport({})
    max_action_age: float = 0.0
    last_chunk_latency: float | None = None
    refill_at: int | None = None        # actions left at which the next chunk is asked for now (ChunkScheduler)


def tight_tracking(settings: LoopSettings) -> str | None:
    """Return the warning for a tracking tolerance full-speed motion is likely to trip, or None (it is allowed)."""
    limits = settings.limits
    tight = limits.tracking_below_one_step(settings.dt)
    if not tight:
        return None
    step = limits.max_delta(settings.dt)
    below = ', '.join(f'{settings.joint_names[i]} ({limits.max_tracking_error[i]:g} < {step[i]:g})'
                      for i in tight[:8])
    return (f"limits.max_tracking_error is below one period's motion at full speed for {below}"
            f"{', ...' if len(tight) > 8 else ''}: unless these joints are measured within one period of "
            'their command, full-speed motion will trigger a protective stop')


def loosenings(new: LoopSettings, old: LoopSettings, horizon: int) -> list[str]:
    """
    Say how ``new`` is looser than ``old`` (each limit that lets more through), or [] if none is.

    Inside the envelope given at start a parameter set may loosen limits tightened since; the
    loop logs every such change as a safety event (ROS parameters have no per-client rights).
    """
    a, b = new.limits, old.limits
    checks = (('lower', b.lower - a.lower), ('upper', a.upper - b.upper),
              ('max_velocity', a.max_velocity - b.max_velocity),
              ('max_tracking_error', a.max_tracking_error - b.max_tracking_error))
    found = []
    for name, gain in checks:
        looser = [f'{new.joint_names[i]} {getattr(b, name)[i]:g} -> {getattr(a, name)[i]:g}'
                  for i in range(len(gain)) if gain[i] > 0]     # inf - inf is NaN: not looser
        if looser:
            found.append(f"{name} ({', '.join(looser[:8])})")
    for name, before, after in (('max_step', b.max_step, a.max_step),
                                ('max_observation_age', old.max_observation_age, new.max_observation_age),
                                ('max_action_age', old.action_age_limit(horizon), new.action_age_limit(horizon))):
        if after > before:
            found.append(f'{name} ({before:g} -> {after:g})')
    if old.use_header_stamps and not new.use_header_stamps:
        found.append('use_header_stamps (true -> false)')
    return found


def update_refusal(new: LoopSettings, old: LoopSettings, envelope: MotionLimits,
                   sent: np.ndarray | None) -> str | None:
    """Say why ``new`` may not replace ``old`` at run time, or None when it may (``sent``: the last message)."""
    fixed = ('joint_names', 'camera_names', 'control_rate_hz', 'first_point_joints')
    changed = [name for name in fixed if getattr(new, name) != getattr(old, name)]
    if changed:
        return f'{changed} cannot change while the loop runs'
    looser = new.limits.loosened_from(envelope)
    if looser is not None:
        return f'limits: {looser}'
    if sent is not None and not new.limits.contains(sent):
        outside = sorted({i for point in sent for i in new.limits.outside(point)})
        return (f'limits: the last command lies outside the new limits for {[old.joint_names[i] for i in outside]}; '
                'move the robot inside them first')
    return None
