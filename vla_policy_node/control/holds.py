# SPDX-License-Identifier: Apache-2.0
"""
Where the robot's controllers are, and the rules of a hold: what the gate steps from and refuses.

What the controllers execute now (:meth:`Holds.executing`) is the setpoint along the previously
published message at this time, as joint_trajectory_controller interpolates it: from where it
left (the setpoint then) to point 0 one period later, point i (i + 1) periods after it left;
after a stall the controllers have run on through it; a controller that takes only the first
point jumped to it. Every command steps from there (:meth:`Holds.reference`), within
``min(max_step, max_velocity / rate)``, and its first point stays between there and the last
message's first point, give or take ``max_velocity`` times the time since that message
(:meth:`Holds.first_point_band`): so the step promise holds in loop-clock time, and a tick a
few ms after the last message (an executor stall) steps a few ms' worth, not a period's.

Only the first command of a *segment* steps from the measured joint state instead, which
must then be fresh: the first ever, and, for the joints of a command topic that had no
subscriber (*unheard*: nothing sent to them meanwhile was received), the first after it. The
joints of the other topics keep stepping from what their controllers last received, so a
hold still reaches them when the joint states are stale, or an unheard joint is measured
beyond its limits: it goes to their topics only (:meth:`Holds.hold_reference`).

Two refusals keep a hold from being left unsafely:

* a robot moved during a hold (:meth:`Holds.moved_during_hold`): nothing is sent until it is
  back, or an operator restarts from the measured state;
* a joint that does not follow its command (:meth:`Holds.not_following`, when
  ``max_tracking_error`` is set): a protective stop that walks the setpoint back to where the
  joints were found (:meth:`Holds.hold_targets`, one step per period; a last hold sends the
  rest at once) and stays latched until an operator's restart.
"""

from __future__ import annotations

import math

import numpy as np

from vla_policy_node.control.health import ERROR
from vla_policy_node.control.observations import ObservationBuffer
from vla_policy_node.control.settings import LoopSettings
from vla_policy_node.control.state import LoopState, Refusal

MAX_HOLD_POINTS = 1000      # a last hold walking back to where the robot was found: at most this many


class Holds:
    """The hold rules over the loop's state; the loop calls them with its lock held."""

    def __init__(self, state: LoopState, settings: LoopSettings, inputs: ObservationBuffer,
                 counters: dict[str, int]) -> None:
        """Share the loop's state, inputs and counters; ``settings`` follows the loop's updates."""
        self._state = state
        self.settings = settings
        self._inputs = inputs
        self._counters = counters

    def reference(self, now: float) -> np.ndarray | None:
        """Return what the next command steps from (J,): the point executed now, measured where unheard."""
        if self._state.sent is None:
            return self._inputs.fresh_positions(now, self.settings.max_observation_age)
        executing = self.executing(now)
        if not self._state.unheard.any():
            return executing
        measured = self._inputs.fresh_positions(now, self.settings.max_observation_age)
        return None if measured is None else np.where(self._state.unheard, measured, executing)

    def hold_reference(self, now: float) -> tuple[np.ndarray | None, np.ndarray | None]:
        """
        Return what a hold steps from (J,) and the joints (J,) it goes to (None: all), or (None, None).

        An unheard joint's next message must start from a measurement. With stale joint states
        there is none, and one beyond the joint's limits by more than a step (a limp gripper
        whose controller died) leaves nothing safe to send it; the other joints still have a
        start: what their controllers execute. So the hold goes to them, and their controllers
        stop instead of running on through a plan the loop has dropped. The unheard joints are
        left out together: they are whole command topics, and a message needs all of a topic's.
        """
        reference = self.reference(now)
        if self._state.sent is None or not self._state.unheard.any() or self._state.unheard.all():
            return reference, None
        if reference is not None:
            limits = self.settings.limits
            step = limits.max_delta(self.settings.dt)
            unheard = self._state.unheard
            if np.all((reference[unheard] >= limits.lower[unheard] - step[unheard])
                      & (reference[unheard] <= limits.upper[unheard] + step[unheard])):
                return reference, None
        return self.executing(now), ~self._state.unheard

    def executing(self, now: float) -> np.ndarray:
        """Return the setpoint (J,) the controllers are at now along the last message (one was sent)."""
        state = self._state
        path = np.vstack([state.sent_from, state.sent])      # row k due k periods after it left
        periods = min(self.periods_since_sent(now), float(len(state.sent)))
        k = min(int(periods), len(state.sent) - 1)
        executing = path[k] + (periods - k) * (path[k + 1] - path[k])
        first_only = list(self.settings.first_point_joints)
        executing[first_only] = state.sent[0, first_only]
        return executing

    def periods_since_sent(self, now: float) -> float:
        """Return the periods of the loop clock since the last message left (>= 0; whole within 1e-6)."""
        if self._state.clock_now is not None and now < self._state.clock_now:     # went back since the last tick
            now = self._state.clock_now
        periods = max((now - self._state.sent_at) / self.settings.dt, 0.0)
        whole = round(periods)
        return float(whole) if abs(periods - whole) < 1e-6 else periods

    def first_point_band(self, now: float) -> tuple[np.ndarray, np.ndarray] | None:
        """
        Return where (low, high), each (J,), a message's first point may go now, or None (no message yet).

        Between the setpoint now and the last message's first point, widened by ``max_velocity``
        times the time since that message: two messages a few ms apart (the executor stalled,
        then ran two ticks) differ by a few ms' worth of motion, while a hold may still stop the
        setpoint where it is. A controller that jumped to the first point is there already, so
        its joints get exactly ``max_velocity`` times that time. Unheard joints got no message:
        theirs is unbounded (they step from measured).
        """
        state = self._state
        if state.sent is None:
            return None
        periods = self.periods_since_sent(now)
        reach = np.where(state.unheard, np.inf, self.settings.limits.max_velocity * periods * self.settings.dt)
        executing = self.executing(now)
        low, high = np.minimum(executing, state.sent[0]) - reach, np.maximum(executing, state.sent[0]) + reach
        # And, as ticks on time always gave, one step from it per period passed (rounded): a tick a
        # little late does not step further from the last command than a step.
        cap = np.where(state.unheard, np.inf, self.settings.limits.max_delta(self.settings.dt) * max(1, round(periods)))
        return np.maximum(low, state.sent[0] - cap), np.minimum(high, state.sent[0] + cap)

    def due_point(self, now: float, reference: np.ndarray) -> np.ndarray:
        """
        Return where a hold stops the setpoint (J,): the point of the last message due now.

        Point i is due (i + 1) periods after the message left, rounded: a hold lets the
        controllers finish the period they are in, and the setpoint stops there. Unheard joints
        (and all before any message) stop at ``reference``, their measured state.
        """
        state = self._state
        if state.sent is None:
            return reference
        due = min(max(round(self.periods_since_sent(now)) - 1, 0), len(state.sent) - 1)
        point = state.sent[due].copy()
        first_only = list(self.settings.first_point_joints)
        point[first_only] = state.sent[0, first_only]
        return np.where(state.unheard, reference, point)

    def beyond_limits(self, now: float) -> Refusal | None:
        """
        Hold while a joint is measured beyond its position limits by more than one step.

        No safe command reaches it, and one that steps on from its setpoint would be obeyed by a
        joint that is not where its sensor says (a broken sensor, the wrong units, a joint out of
        its range): the loop holds with an ERROR until it is measured back.
        """
        measured = self._inputs.fresh_positions(now, self.settings.max_observation_age)
        if measured is None:
            return None
        limits = self.settings.limits
        step = limits.max_delta(self.settings.dt)
        beyond = np.flatnonzero((measured < limits.lower - step) | (measured > limits.upper + step))
        if beyond.size == 0:
            return None
        joints = ', '.join(f'{self.settings.joint_names[i]} {measured[i]:.3f} '
                           f'(limits {limits.lower[i]:g}..{limits.upper[i]:g})' for i in beyond[:8])
        return Refusal(f'joints measured beyond their position limits: {joints}; a broken sensor, the wrong '
                       'units or a joint out of its range? holding until they are measured back inside',
                       ERROR, counter='joints_outside_limits')

    def not_following(self, now: float, reference: np.ndarray) -> Refusal | None:
        """
        Refuse to command once a joint was measured beyond ``max_tracking_error`` from its point.

        Such a joint does not follow what its controller is told: the controller is off (switched
        by a controller manager), the joint is blocked, or someone pushes it. Stepping on from
        its point would pile up that distance for the moment it follows again. The loop holds,
        walking the tracked joints' setpoint back to where they were found (a blocked joint stops
        pushing; the others keep their point, a gripper its grip), and stays latched, as a
        protective stop, until an operator restarts it.
        """
        if self._state.latch is not None:
            return self._state.latch
        limit = self.settings.limits.max_tracking_error
        if np.isinf(limit).all():
            return None
        measured = self._inputs.fresh_positions(now, self.settings.max_observation_age)
        if measured is None:
            return Refusal('no fresh joint position to compare the command with')
        off = np.flatnonzero(np.abs(measured - reference) > limit)
        if off.size == 0:
            return None
        far = ', '.join(f'{self.settings.joint_names[i]} {measured[i] - reference[i]:+.3f} '
                        f'(max {limit[i]:g})' for i in off[:8])
        self._state.latch = Refusal(
            f'joints do not follow the command, measured beyond max_tracking_error from the point their '
            f'controller executes ({far}): is a controller switched off, a joint blocked, or someone moving '
            'the robot? Protective stop: the setpoint walks back to where they were found; nothing is '
            'commanded until ~/restart_from_measured is called (lifecycle node: or re-activated)', ERROR)
        self._state.yield_target = np.where(np.isinf(limit), reference, measured)
        self._counters['tracking_error_holds'] += 1
        return self._state.latch

    def moved_during_hold(self, now: float, reference: np.ndarray,
                          joints: np.ndarray | None = None) -> Refusal | None:
        """
        Refuse to send after a hold while a joint is off the way it was going, or None.

        Each joint must be measured within ``max_step`` of the stretch from where it was
        when the last action left to the point it executes: on it, it is there, on its way,
        or stopped short (a gripper closing on an object), and stepping from its point moves
        it no further than the hold already told it to go. Off it, someone moved it. Only
        ``joints`` (all by default) are checked: a hold to some topics says nothing to the others.
        """
        measured = self._inputs.fresh_positions(now, self.settings.max_observation_age)
        if measured is None:
            return Refusal('no fresh joint position to check the robot against')
        max_step = self.settings.limits.max_step
        off = self.off_their_way(measured, reference)
        away = np.flatnonzero(off if joints is None else off & joints)
        if away.size == 0:
            self._state.moved_counted = False
            return None
        if not self._state.moved_counted:
            self._state.moved_counted = True
            self._counters['moved_robot_refusals'] += 1
        far = ', '.join(f'{self.settings.joint_names[i]} {measured[i] - reference[i]:+.3f}' for i in away[:8])
        return Refusal(f'joints moved during the hold, more than max_step = {max_step:g} off the way to their '
                       f'last command ({far} from it): someone moved the robot; not resuming until it is back, '
                       'or ~/restart_from_measured is called', ERROR)

    def restart_target(self, now: float, measured: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """
        Return (reference, target) of an operator's restart: where the setpoint is, where it walks to.

        The joints with a tracking error checked and those off their way walk to where they are
        measured (inside the limits); the others keep their point.
        """
        limits = self.settings.limits
        reference = self.reference(now)            # fresh measured: never None here
        restart = np.isfinite(limits.max_tracking_error) | self.off_their_way(measured, reference)
        return reference, np.where(restart, np.clip(measured, limits.lower, limits.upper), reference)

    def off_their_way(self, measured: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """Mark (J,) the joints beyond ``max_step`` of their way (where the last action left them to their point)."""
        max_step = self.settings.limits.max_step
        start = reference if self._state.commanded_at is None else self._state.commanded_at
        low, high = np.minimum(start, reference) - max_step, np.maximum(start, reference) + max_step
        return (measured < low) | (measured > high)

    def hold_targets(self, now: float, reference: np.ndarray, walk: bool) -> np.ndarray:
        """
        Return the hold's targets (T, J): the point due now, or, latched or restarting, where the joints were found.

        the gate (``Gate.emit``) clamps them to one step from the point executed now (``walk``: repeated into
        a walk at the step limit, for a last hold after which no tick continues it).
        """
        if self._state.yield_target is None:
            return self.due_point(now, reference)[None, :]
        if not walk:
            return self._state.yield_target[None, :]
        steps = np.abs(self._state.yield_target - reference) / self.settings.limits.max_delta(self.settings.dt)
        count = min(MAX_HOLD_POINTS, max(1, math.ceil(float(steps.max()) - 1e-9)))
        return np.repeat(self._state.yield_target[None, :], count, axis=0)

    def walked_back(self, now: float) -> bool:
        """Tell whether the setpoint executed now is where a latched stop walks it (inside the limits)."""
        reference, send_to = self.hold_reference(now)
        if reference is None:
            return True
        limits = self.settings.limits
        there = np.abs(reference - np.clip(self._state.yield_target, limits.lower, limits.upper)) <= 1e-12
        return bool(np.all(there if send_to is None else there[send_to]))
