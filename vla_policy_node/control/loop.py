# SPDX-License-Identifier: Apache-2.0
"""
The control loop: one tick of input health, chunk scheduling, hold decisions and the gate.

Everything that decides what the robot is told lives here, free of ROS, so the node, the soak
run and the property tests drive the same code::

    inputs (on_image, on_joint_state, on_instruction, reject) --> ObservationBuffer
    tick(now) --> input health, command link --> ChunkScheduler.take --> _emit --> sink
    request --> inference thread --> on_inference_result --> ChunkScheduler.submit_chunk

Read it with its neighbours: ``state`` (what the loop is doing, :class:`~.state.Mode`), ``gate`` (the
only caller of ``sink``: every command, holds included, and what it guarantees), ``holds`` (what a
command steps from, when a hold refuses), ``ages`` (how old an action may be), ``safety`` (the limits).

When commanding stops (bad input, no plan, a policy fault, a lost or contested command
topic, a stalled clock) one hold is published and nothing after it until commanding resumes.
Episode resets clear the plan and the policy's cache but never the last published command:
the step limit survives resets. Limits may change at run time only inside the envelope given
at start, and not so that the last message falls outside them.

Thread safety: every public method takes the loop's lock; the inference thread calls ``on_inference_result``
(then ``on_chunk_ready``: the node's :meth:`refill`, or a tick ending a hold); ``sink`` is called with the lock
held (publish only, never block).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import math
import threading
import time

import numpy as np

from vla_policy_node.control.chunking import ChunkScheduler, Plan, SchedulerConfig
from vla_policy_node.control.gate import Gate, Sink
from vla_policy_node.control.health import ERROR, FaultTally, LimitedLog, OK, WARN
from vla_policy_node.control.holds import Holds
from vla_policy_node.control.inference import FAULT_RAISED, FAULTS, Inference, InferenceResult
from vla_policy_node.control.observations import INSTRUCTION, JOINT_STATES, ObservationBuffer
from vla_policy_node.control.safety import MotionLimits
from vla_policy_node.control.settings import LoopSettings, LoopStatus, loosenings, tight_tracking, update_refusal
from vla_policy_node.control.state import link_problem, LoopState, Mode, Refusal

FAULT_STALE = 'stale'   # a chunk whose observation was too old when it arrived
LOOP_FAULTS = FAULTS + (FAULT_STALE,)
LOOP_COUNTERS = ('control_ticks', 'commands_published', 'holds_published', 'clamped_joints',
                 'clamped_lookahead_joints', 'episode_resets', 'rejected_chunks',
                 'rejected_inputs', 'stale_actions_refused', 'unreachable_commands', 'moved_robot_refusals',
                 'tracking_error_holds', 'joint_states_without_positions', 'watchdog_holds', 'limits_loosened',
                 'joints_outside_limits')
LOG_PERIOD_S = 2.0
EARLY_TICK = 0.1            # a latched walk steps on a tick at most this fraction of a period early (timer jitter)


Log = Callable[[str, str], None]                # (severity 'info' | 'warning', text)


class ControlLoop:
    """
    Owns a tick: inputs, scheduler, holds; every command leaves through ``_emit`` (the gate).

    Long on purpose: the locked API and the hold/command transitions sharing its lock; split, a reader
    could no longer see every path to the robot under one lock (state, holds, gate, ages live beside).
    """

    def __init__(self, settings: LoopSettings, scheduler: SchedulerConfig, inference: Inference,
                 sink: Sink, log: Log = lambda severity, text: None,
                 wall_clock: Callable[[], float] = time.monotonic,
                 on_chunk_ready: Callable[[], None] = lambda: None,
                 envelope: MotionLimits | None = None) -> None:
        """``envelope``: the limits run-time updates may not loosen (None: ``settings.limits``)."""
        self._envelope = settings.limits if envelope is None else envelope
        looser = settings.limits.loosened_from(self._envelope)
        if looser is not None:
            raise ValueError(f'limits: {looser}')
        self._scheduler = ChunkScheduler(scheduler)
        self._inputs = ObservationBuffer(settings.camera_names, settings.joint_names)
        self._inference = inference
        self._sink = sink
        self._log = log
        self._wall = wall_clock
        self._on_chunk_ready = on_chunk_ready
        self._lock = threading.RLock()
        self._counters = dict.fromkeys(LOOP_COUNTERS, 0)
        self._faults = FaultTally(LOOP_FAULTS, warn_only=(FAULT_STALE,))
        self._state = LoopState(len(settings.joint_names), clock_advanced=wall_clock())
        self._holds = Holds(self._state, settings, self._inputs, self._counters)
        self._gate = Gate(self._state, self._holds, self._inputs, self._counters,
                          lambda *message: self._sink(*message), lambda: self.horizon)
        self._limited_log = LimitedLog(log, wall_clock, LOG_PERIOD_S)
        tight = tight_tracking(settings)
        if tight is not None:
            self._log('warning', tight)
        inference.bind(self.on_inference_result)

    # ------------------------------------------------------------------ settings
    @property
    def settings(self) -> LoopSettings:
        """Return the settings in force."""
        return self._holds.settings

    _settings = settings        # the loop's own reads: one source, shared with the hold rules

    @property
    def mode(self) -> Mode:
        """Return what the loop does now (commanding, holding, latched or stopped)."""
        with self._lock:
            return self._state.mode

    @property
    def horizon(self) -> int:
        """Return the actions executed per chunk (what ``max_action_age: 0`` derives from)."""
        return self._scheduler.config.horizon

    @property
    def hold_reason(self) -> str | None:
        """Return why the loop holds, or None while it commands."""
        with self._lock:
            return self._state.hold_reason

    def check_update(self, settings: LoopSettings) -> str | None:
        """Say why ``settings`` may not replace the current ones, or None when they may."""
        with self._lock:
            return update_refusal(settings, self._settings, self._envelope, self._state.sent)

    def update(self, settings: LoopSettings) -> None:
        """Replace the settings (run-time tunables); raises ValueError when ``check_update`` objects."""
        with self._lock:
            reason = self.check_update(settings)
            if reason is not None:
                raise ValueError(reason)
            tight, before = tight_tracking(settings), tight_tracking(self._settings)
            looser = loosenings(settings, self._settings, self.horizon)
            self._holds.settings = settings
            if looser:
                self._counters['limits_loosened'] += 1
                self._log('warning', 'safety event: limits loosened at run time (within the envelope given at '
                                     f"start): {'; '.join(looser)}")
            if tight is not None and tight != before:      # not again on an unrelated parameter change
                self._log('warning', tight)

    def set_command_link(self, subscribers: int, other_publishers: int,
                         topic: str = 'the command topic',
                         unheard_joints: Sequence[int] | None = None, refused: str | None = None) -> None:
        """
        Tell the loop who else is on the command topic; commands stop unless exactly we send.

        No subscriber: nothing sent is received, so the next command of ``unheard_joints``
        (indices; None: all joints) steps from their measured state (a new segment). Another
        publisher: two senders interleave and the step limit means nothing, so the loop
        refuses to command until it is alone. With several command topics (one per
        controller), the fewest subscribers and all other publishers count, ``topic`` names
        the one at fault in the reason, and ``unheard_joints`` are the joints whose controller
        is not known to run what it was sent: the topics without a subscriber, an action whose
        goal is not answered yet, or was not run. ``refused``: why a controller did not run what
        it was sent (an action's goal rejected, aborted, unanswered too long): a hold.
        """
        with self._lock:
            self._state.contested = other_publishers > 0
            self._state.link_problem = link_problem(subscribers, other_publishers, topic, refused)
            if unheard_joints is not None:          # not received, or not known to run: re-enter from measured
                self._state.unheard[list(unheard_joints)] = True
            elif subscribers == 0:
                self._state.unheard[:] = True

    # ------------------------------------------------------------------ inputs
    def on_image(self, camera: str, rgb: np.ndarray, now: float, stamp: float | None) -> None:
        """Store a converted frame; with all inputs healthy it may start a request at once."""
        with self._lock:
            settings = self._settings
            problem = self._inputs.set_image(
                camera, rgb, now, stamp if settings.use_header_stamps else None,
                settings.max_observation_age)
            if problem is not None:
                self._mark_rejected(camera, problem)
            elif not self._state.stopped and self._blocking_problem(now) is None:
                self._request_chunk(now)        # start on the fresh frame, not at the next tick

    def on_joint_state(self, names: Sequence[str], positions: Sequence[float], now: float,
                       stamp: float | None) -> tuple[str, ...]:
        """Merge a joint state (ignored without positions); returns its unconfigured names."""
        with self._lock:
            if len(positions) == 0:
                self._counters['joint_states_without_positions'] += 1
                return ()
            settings = self._settings
            try:
                problem, unknown = self._inputs.set_joint_state(
                    names, positions, now, stamp if settings.use_header_stamps else None,
                    settings.max_observation_age)
            except ValueError as error:
                problem, unknown = str(error), ()
            if problem is not None:
                self._mark_rejected(JOINT_STATES, problem)
            return unknown

    def on_instruction(self, text: str) -> bool:
        """Store a validated task; True when it changed and that started a new episode."""
        with self._lock:
            new = text != self._inputs.instruction
            changed = self._inputs.set_instruction(text)
        if new:
            self._log('info', f'instruction: {text[:200]!r}')
        if changed and self._settings.reset_on_instruction_change:
            self.reset_episode('instruction changed')
            return True
        return False

    def reject(self, stream: str, reason: str) -> None:
        """Mark ``stream`` faulted (no command until it recovers): a message that failed conversion."""
        with self._lock:
            self._mark_rejected(stream, reason)

    def _mark_rejected(self, stream: str, reason: str) -> None:
        self._inputs.reject(stream, reason)
        self._counters['rejected_inputs'] += 1
        self._limited_log(stream, 'warning', f'rejected {stream} input: {reason}; holding')

    # ------------------------------------------------------------------ control
    def tick(self, now: float) -> None:
        """Run one control step at ``now`` (the loop's clock): command, or hold."""
        with self._lock:
            if self._state.stopped:
                return
            if self._state.clock_now is not None and now < self._state.clock_now:
                self._clock_went_back(self._state.clock_now - now)
            if now != self._state.clock_now:
                self._state.clock_now, self._state.clock_advanced = now, self._wall()
            self._counters['control_ticks'] += 1
            problem = self._blocking_problem(now)
            if problem is not None:
                self._discard_plan()
                self._hold(now, problem)
                return
            # Execute this tick's step first: a request made now is for the next step, so the
            # delay compensation counts exactly the steps executed while the chunk is computed.
            # After a stall the controllers ran on through the last message: the plan's actions
            # of the ticks that did not happen (whole periods only: a late tick is followed by an
            # early one) and that the message covered are due no more.
            if self._state.hold_reason is None and self._state.sent is not None:
                missed = int(math.floor((now - self._state.sent_at) / self._settings.dt + 1e-6)) - 1
                self._scheduler.skip_overdue(min(missed, len(self._state.sent) - 1))
            plan = self._scheduler.take(now, self._settings.plan_points)
            if plan is None:
                self._hold(now, Refusal(self._state.policy_fault or 'waiting for actions from the policy'))
            else:
                self._command(now, plan)
            if self._state.latch is None:      # a protective stop asks nothing more of the policy
                self._request_chunk(now)

    def refill(self, now: float) -> None:
        """Request the next chunk now if one is due and nothing blocks (a chunk came: not a tick later)."""
        with self._lock:
            if not self._state.stopped and self._blocking_problem(now) is None:
                self._request_chunk(now)

    def _clock_went_back(self, seconds: float) -> None:
        """
        Hold on a loop clock that runs backwards (a simulator reset): every age means nothing.

        The inputs received before count as faulted until each stream sends again, so the
        loop holds (and drops its plan) at this tick and commands only from new messages.
        """
        reason = f'the loop clock went back by {seconds:.3f} s (simulation reset?): waiting for new messages'
        self._state.sent_at -= seconds            # the controllers still run through the last message
        for stream in (*self._settings.camera_names, JOINT_STATES):
            self._inputs.reject(stream, reason)
        self._limited_log('clock', 'warning', reason)

    def watchdog(self, now: float) -> None:
        """Hold once the loop's clock stood still for ``max_observation_age`` of wall-clock time."""
        with self._lock:
            problem = self._clock_problem()
            if self._state.stopped or problem is None:
                return
            self._discard_plan()
            self._hold(now, problem)

    def _clock_problem(self) -> Refusal | None:
        """Refuse to command on a stopped loop clock (no tick, a frozen /clock): ages mean nothing."""
        silent = self._wall() - self._state.clock_advanced
        if silent <= self._settings.max_observation_age:
            return None
        return Refusal(f'no control tick for {silent:.2f} s of wall-clock time '
                       '(with use_sim_time: is /clock running?)', counter='watchdog_holds')

    def _blocking_problem(self, now: float) -> Refusal | None:
        if self._state.link_problem is not None:
            return self._state.link_problem
        if self._state.latch is not None:     # latched: no request, and the ERROR stays
            return self._state.latch
        clock = self._clock_problem()
        if clock is not None:
            return clock
        problem = self._inputs.problem(now, self._settings.max_observation_age)
        if problem is not None:
            return Refusal(problem)
        beyond = self._holds.beyond_limits(now)
        if beyond is not None:
            return beyond
        if self._state.restarting:
            return Refusal('restarting from the measured joint state: the setpoint walks there at the step limit')
        if self._state.hold_reason is not None and self._state.sent is not None:   # the ERROR stays while it lasts
            reference = self._holds.reference(now)
            return None if reference is None else self._holds.moved_during_hold(now, reference)
        return None

    def _request_chunk(self, now: float) -> None:
        if self._scheduler.needs_chunk() and not self._inference.busy:
            request = self._scheduler.begin_request(now, self._inputs.oldest_input())
            if not self._inference.submit(request, self._inputs.observation()):
                self._scheduler.cancel_request(request)

    def _discard_plan(self) -> None:
        """Drop actions planned from observations taken before something went wrong."""
        if self._scheduler.actions_left > 0 or self._scheduler.in_flight:
            self._scheduler.drop_plan()

    def _command(self, now: float, plan: Plan) -> None:
        problem = self._emit(now, plan)
        if problem is not None:
            self._discard_plan()
            self._hold(now, problem)
            return
        if self._state.hold_reason is not None:
            self._log('info', f'commanding (was holding: {self._state.hold_reason})')
        self._state.hold_reason = None

    def _hold(self, now: float, why: Refusal) -> None:
        """
        Stop commanding; on the transition, send one hold command and log why.

        While a protective stop is latched it stays the reason (another cause is appended), and
        each period of the loop clock sends one more step of the walk back to where the joints
        were found, until the setpoint is there: one point per message, so a forward command
        controller walks too. Not on every call: the watchdog (a stopped clock) and a late
        policy result call this between ticks, and a step each time would outrun the velocity
        limit (a paused simulator would take the whole walk in one period when it resumes).
        """
        latch = self._state.latch
        if latch is not None and why is not latch:
            why = Refusal(f'{latch.reason} (also: {why.reason})', ERROR, why.counter)
        if self._state.hold_reason is None:
            if why.counter is not None:
                self._counters[why.counter] += 1
            problem = self._emit(now, None)
            suffix = f' (no hold sent: {problem.reason})' if problem and problem is not why else ''
            self._log('warning', f'holding: {why.reason}{suffix}')
        else:
            if why.reason != self._state.hold_reason:
                self._limited_log('hold', 'warning', f'holding: {why.reason}')
            walking = self._state.yield_target is not None
            walk_due = walking and now - self._state.sent_at >= (1.0 - EARLY_TICK) * self._settings.dt
            if walk_due and not self._holds.walked_back(now):
                self._emit(now, None)
            elif walk_due and self._state.restarting:         # there: commanding may resume from here
                self._state.restarting, self._state.yield_target = False, None
                self._log('info', 'restart: the setpoint reached the measured joint state')
        self._state.hold_reason, self._state.hold_level = why.reason, why.level

    def _emit(self, now: float, plan: Plan | None, walk: bool = False) -> Refusal | None:
        """Send ``plan`` (None: a hold) through the gate (``gate.Gate.emit``), or nothing; why not, or None."""
        return self._gate.emit(now, plan, walk)

    # ------------------------------------------------------------------ policy results
    def on_inference_result(self, result: InferenceResult) -> None:
        """Take a result of the inference thread; the scheduler decides whether it is used."""
        with self._lock:
            if self._state.stopped:
                return
            latency = result.finished_at - result.request.obs_time
            age = result.finished_at - result.request.observed_at
            fault, error = result.fault, result.error
            if fault is not None and fault not in LOOP_FAULTS:     # e.g. from a remote server
                fault, error = FAULT_RAISED, f'unknown fault kind {fault!r}: {error}'
            stale = age > self._settings.max_observation_age
            if fault is None and stale and self._scheduler.awaits(result.request):
                fault, error = FAULT_STALE, (
                    f'chunk arrived {age:.3f} s after its observation, more than '
                    f'max_observation_age = {self._settings.max_observation_age:g} s')
            if fault is not None:
                message = f'policy {fault}: {error}'
                self._faults.add(fault, message, result.finished_at)
                if not self._scheduler.awaits(result.request):
                    return          # an answer to a request of an ended episode: counted, not obeyed
                self._state.last_latency = latency
                self._scheduler.cancel_request(result.request)
                self._state.policy_fault = message
                self._discard_plan()
                self._hold(result.finished_at, Refusal(message, WARN if fault == FAULT_STALE else ERROR))
                self._limited_log(f'policy {fault}', 'warning', f'discarded policy output: {message}')
                return
            try:
                accepted = self._scheduler.submit_chunk(result.request, result.chunk, result.finished_at,
                                                        width=len(self._settings.joint_names))
            except ValueError as rejected:
                self._counters['rejected_chunks'] += 1
                self._state.policy_fault = f'policy output rejected: {rejected}'   # the hold that follows says why
                self._limited_log('rejected chunk', 'warning', f'discarded policy output: {rejected}')
                return
            if accepted:
                self._state.last_latency = latency
                self._state.policy_fault = None
                self._on_chunk_ready()

    # ------------------------------------------------------------------ episodes
    def reset_episode(self, reason: str) -> int:
        """Start a new episode (plan, blending, the policy's cache); return the reset count."""
        with self._lock:
            self._scheduler.reset()
            self._inference.request_reset()
            self._state.policy_fault = None          # the last episode's fault is not this one's
            self._counters['episode_resets'] += 1
            count = self._counters['episode_resets']
        self._log('info', f'episode reset #{count} ({reason})')
        return count

    def end_task(self, now: float, why: str) -> None:
        """
        End the task at once (a goal cancelled, timed out or preempted): hold now, and until a new instruction.

        The plan is dropped and the hold leaves through the gate like every command; the episode
        is reset, so the next task starts fresh.
        """
        with self._lock:
            if self._state.stopped:
                return
            self._inputs.clear_instruction(f'no task ({why}): waiting for an instruction')
            self._discard_plan()
            self._hold(now, Refusal(f'task ended: {why}'))
        self.reset_episode(why)

    def restart_from_measured(self, now: float) -> str | None:
        """
        Walk the setpoint to the measured state, on an operator's word; why not, or None.

        The way back from a hold the loop will not leave by itself (the robot moved during it,
        or stayed behind its controller): the operator has checked the robot. The joints with
        a tracking error checked and those moved off their way are walked from their setpoint
        to where they are measured (inside the limits), one step per period as a protective
        stop walks, never in one jump; commanding resumes from there. The others, on their
        way, keep their point: a gripper squeezing what it holds keeps its grip. Refused while
        commanding (nothing to restart) and without a fresh joint state.
        """
        with self._lock:
            if self._state.stopped:
                return 'the control loop is stopped'
            if self._state.hold_reason is None:
                return 'commanding: there is no hold to restart from'
            measured = self._inputs.fresh_positions(now, self._settings.max_observation_age)
            if measured is None:
                return 'no fresh joint state to start from'
            reference, target = self._holds.restart_target(now, measured)
            self._state.moved_counted = False
            self._state.latch, self._state.yield_target, self._state.restarting = None, target, True
            distance = float(np.max(np.abs(target - reference)))
            reason = self._state.hold_reason
        self._log('info', f'restarting from the measured joint state (was holding: {reason}): the setpoint '
                          f'walks up to {distance:.3f} to it at the step limit')
        return None

    def stop(self, now: float) -> bool:
        """Stop for good after one last hold; whether the hold was sent."""
        with self._lock:
            if self._state.stopped:
                return False
            self._state.stopped = True
            self._discard_plan()
            problem = self._emit(now, None, walk=True)
            self._state.hold_reason = 'stopped'
            return problem is None

    # ------------------------------------------------------------------ reporting
    def status(self, now: float, report_period: float) -> LoopStatus:
        """Take a consistent snapshot of counters, state and input health."""
        with self._lock:
            settings = self._settings
            inputs = self._inputs.health(now, settings.max_observation_age)
            faults = self._faults.report(now, report_period)
            counters = {**self._counters, **self._inputs.counters, **{
                f'policy_{kind}': count for kind, count in self._faults.totals.items()}, **{
                ('scheduler_resets' if key == 'resets' else key): value
                for key, value in self._scheduler.stats.items()}}
            hold, hold_level, latency = self._state.hold_reason, self._state.hold_level, self._state.last_latency
            action_age = settings.action_age_limit(self._scheduler.config.horizon)
            refill_at = self._scheduler.refill_at
        level = max([OK, faults.level] + [health.level for health in inputs])
        if hold is not None:
            level = max(level, hold_level)
        if latency is not None and latency > settings.max_observation_age:
            level = max(level, WARN)
        return LoopStatus(state='commanding' if hold is None else f'holding: {hold}', level=level,
                          counters=counters, inputs=inputs, policy_faults=faults,
                          max_action_age=action_age, last_chunk_latency=latency, refill_at=refill_at)


__all__ = ['ControlLoop', 'FAULT_STALE', 'INSTRUCTION', 'JOINT_STATES', 'LoopSettings', 'Mode',
           'LoopStatus', 'LOOP_FAULTS', 'Refusal']
