# SPDX-License-Identifier: Apache-2.0
"""
The gate: every command the loop sends, holds included, leaves through :meth:`Gate.emit`.

It is the only caller of the sink; its docstring lists what each published point obeys. What
a command steps from and when a hold refuses are in ``holds``; how old an action may be in
``ages``; the motion limits in ``safety``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vla_policy_node.control import ages
from vla_policy_node.control.chunking import Plan
from vla_policy_node.control.health import ERROR
from vla_policy_node.control.holds import Holds
from vla_policy_node.control.observations import ObservationBuffer
from vla_policy_node.control.safety import check_finite, SafetyError
from vla_policy_node.control.state import LoopState, Refusal

# (points (T, J), observation time of each point (T,) or None for a hold, the joints (J,) whose
# topics get it or None for all: a hold while a topic has had no subscriber, and its joints have
# no usable measurement, goes to the other topics only)
Sink = Callable[[np.ndarray, 'np.ndarray | None', 'np.ndarray | None'], None]


class Gate:
    """The one exit for commands; the loop calls it with its lock held."""

    def __init__(self, state: LoopState, holds: Holds, inputs: ObservationBuffer, counters: dict[str, int],
                 sink: Sink, horizon: Callable[[], int]) -> None:
        """Share the loop's state, hold rules, inputs and counters; ``horizon``: actions per chunk."""
        self._state = state
        self._holds = holds
        self._inputs = inputs
        self._counters = counters
        self._sink = sink
        self._horizon = horizon

    def emit(self, now: float, plan: Plan | None, walk: bool = False) -> Refusal | None:
        """
        Send ``plan`` (None: a hold) through every check, or nothing; why not, or None if sent.

        The gate: the only caller of ``sink``. Every point it publishes is

        * finite, and inside the *current* position limits (a robot measured outside them by
          more than one step cannot be reached by a safe command: nothing is sent);
        * within ``min(max_step, max_velocity / rate)`` of what the controllers execute now,
          or of the fresh measured state for the first command of a segment (``holds``), and
          its first point within ``max_velocity`` times the loop-clock time since the last
          message of that message's first point (``Holds.first_point_band``);
        * after a hold, never for a robot moved meanwhile, and while commanding never for a
          joint that does not follow its command (``Holds.moved_during_hold``,
          ``Holds.not_following``);
        * computed from observations at most ``max_action_age`` old when it executes (``ages``).

        A hold repeats the point due now (``Holds.due_point``); latched, it steps toward where the
        joints were found (``walk``: the whole way, for a last hold). With stale joint states
        or unheard joints measured beyond their limits it goes to the other topics only.
        """
        planned = self._targets(now, plan, walk)
        if isinstance(planned, Refusal):
            return planned
        targets, obs_times, reference, send_to = planned
        settings = self._holds.settings
        limits = settings.limits
        try:
            safe, clamped = limits.clamp_sequence(targets, reference, settings.dt,
                                                  first_band=self._holds.first_point_band(now))
            check_finite(safe, 'command')
        except SafetyError as error:
            return Refusal(f'unsafe command: {error}', ERROR)
        if not limits.contains(safe):
            self._counters['unreachable_commands'] += 1
            joints = [settings.joint_names[i] for i in limits.outside(safe[0])]
            return Refusal(f'joints {joints} are measured outside their limits by more than one '
                           'step: nothing can be commanded until they are back inside', ERROR)
        self._sink(safe, obs_times, send_to)
        self._record(now, safe, reference, plan is None, clamped, send_to)
        return None

    def _targets(self, now: float, plan: Plan | None, walk: bool) -> Refusal | tuple:
        """
        Return what the gate is to send, before the limits: (targets, obs_times, reference, send_to), or why not.

        A topic without a subscriber does not stop a hold (the controllers that listen get it);
        a topic with another publisher does (the loop is not alone on it).
        """
        state = self._state
        if state.link_problem is not None and (plan is not None or state.contested):
            return state.link_problem
        reference, send_to = (self._holds.reference(now), None) if plan is not None else self._holds.hold_reference(now)
        if reference is None:
            return Refusal('no fresh joint position to start from')
        if state.hold_reason is not None and state.sent is not None and state.yield_target is None:
            moved = self._holds.moved_during_hold(now, reference, send_to)   # after a hold, a final one too
            if moved is not None:
                return moved
        if plan is None:
            return self._holds.hold_targets(now, reference, walk), None, reference, send_to
        lagging = self._holds.not_following(now, reference)
        if lagging is not None:
            return lagging
        targets = ages.fresh_rows(self._holds.settings, self._horizon(), now, plan)
        if targets is None:
            self._counters['stale_actions_refused'] += 1
            return ages.stale(self._holds.settings, self._horizon(), now, plan)
        return targets, plan.obs_times[:len(targets)], reference, send_to

    def _record(self, now: float, safe: np.ndarray, reference: np.ndarray, hold: bool, clamped: np.ndarray,
                send_to: np.ndarray | None) -> None:
        """Record a message that left: the step limit's start, and the counters."""
        state = self._state
        state.sent, state.sent_at = safe.copy(), now      # unsent joints are unheard: next from measured
        state.sent_from = reference.copy()
        if state.link_problem is None and send_to is None:   # every topic has a subscriber: all was received
            state.unheard[:] = False
        if hold:
            self._counters['holds_published'] += 1
        else:
            state.commanded_at = self._inputs.last_positions()
            self._counters['commands_published'] += 1
            self._counters['clamped_joints'] += int(clamped[0])
            self._counters['clamped_lookahead_joints'] += int(clamped[1:].sum())
