# SPDX-License-Identifier: Apache-2.0
"""
The age rules: how old the observation behind a command may be, and how far that may loosen.

Every point is computed from observations at most ``max_action_age`` old at the time it is
to execute: point i is reached (i + 1) periods after it left, or at once where every
controller takes the first point only (:func:`fresh_rows`). Holds repeat the point being
executed, or the measured state, and compute nothing, so no age applies to them. At run time
the age limits only tighten, like the motion limits (:func:`ages_loosened`).
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Protocol

import numpy as np

from vla_policy_node.control.chunking import Plan
from vla_policy_node.control.settings import LoopSettings
from vla_policy_node.control.state import Refusal


def fresh_rows(settings: LoopSettings, horizon: int, now: float, plan: Plan) -> np.ndarray | None:
    """
    Return the leading rows of ``plan`` still fresh when they execute, or None when none is.

    Row i is reached (i + 1) periods after it leaves (a trajectory point's
    ``time_from_start``), or at once where every controller takes the first point only.
    """
    limit = settings.action_age_limit(horizon)
    at_once = len(settings.first_point_joints) == len(settings.joint_names)
    due = now + settings.dt * (np.arange(len(plan.actions)) + (0 if at_once else 1))
    age = due - plan.obs_times
    fresh = (age <= limit) & (age >= 0.0)          # an observation from the future: a clock gone back
    count = len(fresh) if fresh.all() else int(np.argmin(fresh))
    return plan.actions[:count] if count else None


def stale(settings: LoopSettings, horizon: int, now: float, plan: Plan) -> Refusal:
    """Say why the first action of ``plan`` is too old (or from the future) to execute at ``now``."""
    limit = settings.action_age_limit(horizon)
    if plan.obs_times[0] > now:
        return Refusal(f'action computed from an observation {plan.obs_times[0] - now:.3f} s in the '
                       'future: the loop clock went back')
    return Refusal(f'action computed from an observation {now - plan.obs_times[0]:.3f} s '
                   f'old, more than max_action_age = {limit:.3f} s')


class AgeSettings(Protocol):
    """The input checks of a settings object (the node's ``NodeSettings``)."""

    max_observation_age: float
    max_action_age: float
    use_header_stamps: bool


@dataclass(frozen=True)
class StartAges:
    """The input checks the node started with: at run time they may only tighten."""

    max_observation_age: float
    max_action_age: float
    use_header_stamps: bool


def ages_loosened(settings: AgeSettings, start: StartAges, horizon_s: float | None) -> str | None:
    """
    Say why ``settings`` would accept older inputs or actions than the node started with, or None.

    Like the limits, the input checks only tighten at run time: a value set to let a slow camera
    through would otherwise let stale observations drive the arm until someone sets it back; so
    would switching header stamps off. The action age compares the limits in force:
    ``max_action_age: 0`` derives ``max_observation_age + horizon_s`` (one horizon of actions
    in seconds). ``horizon_s`` None: not known yet (the whole chunk of a policy not loaded), so
    a derived limit counts as no longer than ``max_observation_age`` before and unbounded after.
    """
    if settings.max_observation_age > start.max_observation_age:
        return (f'max_observation_age {settings.max_observation_age:g} s is looser than the '
                f'{start.max_observation_age:g} s the node started with: loosening it takes a restart')
    if start.use_header_stamps and not settings.use_header_stamps:
        return ('use_header_stamps false would let frames and joint states stamped too long ago through: '
                'switching the stamp check off takes a restart')
    if start.max_action_age == 0 and settings.max_action_age == 0:
        return None                     # both derived, from a max_observation_age no looser
    known = horizon_s is not None
    before = start.max_action_age or start.max_observation_age + (horizon_s if known else 0.0)
    after = settings.max_action_age or settings.max_observation_age + (horizon_s if known else math.inf)
    if after > before + 1e-9:
        derived = ' (0 derives max_observation_age + horizon / control_rate_hz)' if settings.max_action_age == 0 else ''
        return (f'max_action_age {settings.max_action_age:g}{derived} allows actions {after:g} s old, more than '
                f'the {before:g} s the node started with: loosening it takes a restart')
    return None
