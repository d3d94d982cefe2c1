# SPDX-License-Identifier: Apache-2.0
"""
The control loop: one tick of input health, chunk scheduling, hold decisions and clamping.

Everything that decides what the robot is told lives here, free of ROS, so the node, the soak
run and the property tests drive the same code::

    inputs (on_image, on_joint_state, on_instruction, reject) --> ObservationBuffer
    tick(now) --> input health, command link --> ChunkScheduler.take --> _emit --> sink
    request --> inference thread --> on_inference_result --> ChunkScheduler.submit_chunk

**Every command leaves through** :meth:`ControlLoop._emit`, holds included; it is the only
caller of ``sink``. It guarantees, for every published point:

* finite, and inside the *current* position limits;
* within ``min(max_step, max_velocity / rate)`` of what the controllers execute *now*: the
  point of the previously published message due at this time (point i of a message is due
  (i + 1) periods after it left, so after a stall the controllers have run on through it;
  a controller that takes only the first point holds it). After a stall the plan's actions
  whose time has passed are skipped, so the robot does not run back over them.
  Only the first command of a *segment* steps from the measured joint state instead, which
  must then be fresh: the first ever, and, for the joints of a command topic that had no
  subscriber (so nothing sent to them meanwhile was received), the first after it; the
  joints of the other topics keep stepping from what their controllers last received (so a
  hold still reaches them when the joint states are stale, or an unheard joint is measured
  beyond its limits: it goes to their topics only, never to one whose next message has no
  usable measurement to step from). A
  robot measured outside its limits by more than one step cannot be reached by a safe
  command, so nothing is sent and the loop says so;
* after a hold (and for a last hold sent while holding), never for a robot moved meanwhile:
  every joint (but the unheard ones above) must be measured within ``max_step`` of the
  stretch from where it was when the last action left to the point it executes. On it, the
  joint is there, on its way, or stopped short (a gripper closed on what it holds), and the
  next command steps from its point, where the hold already told it to go. Off it, someone
  moved it (hand guiding, another node on the topic): a command stepping from the last one
  would jump by that distance, one from the measured state by a sensor glitch's. The loop
  cannot tell which, so it sends nothing and says so (ERROR) until the robot is back, or an
  operator restarts it from the measured state (:meth:`ControlLoop.restart_from_measured`; a
  lifecycle node's activation does the same);
* while commanding, never for a joint measured further than ``max_tracking_error`` from the
  point its controller executes (when set): it does not follow (a controller switched off, a
  joint blocked or pushed), and stepping on would leave its controller that far ahead of it
  when it follows again. The loop holds, stepping the checked joints' setpoint back to where
  they were found, one step per period of the loop clock (none while it stands still; a last
  hold sends the rest of the way at once), and
  stays latched (a protective stop) until an operator's :meth:`ControlLoop.restart_from_measured`;
* computed from observations at most ``max_action_age`` old at the time it is to execute:
  point i reached (i + 1) periods after it left, or at once where every controller takes the
  first point only (holds repeat the point being executed, or the measured state, and
  compute nothing).

Episode resets clear the plan and the policy's cache but never the last published command:
the step limit survives resets. Holds: when commanding stops (bad input, no plan, a policy
fault, a lost or contested command topic, a stalled clock) one hold is published and nothing
after it until commanding resumes. A topic without a subscriber does not stop the hold (the
controllers that listen get it); a topic with another publisher does (the loop is not alone
on it). Limits may change at run time only inside the envelope given at start, and not so
that the last message falls outside them.

Thread safety: every public method takes the loop's lock; the inference thread calls
``on_inference_result``; ``sink`` is called with the lock held (publish only, never block).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
import math
import threading
import time
from typing import Any, Protocol

import numpy as np

from vla_policy_node.control.chunking import ChunkRequest, ChunkScheduler, Plan, SchedulerConfig
from vla_policy_node.control.health import ERROR, FaultReport, FaultTally, InputHealth, OK, WARN
from vla_policy_node.control.inference import FAULT_RAISED, FAULTS, InferenceResult
from vla_policy_node.control.observations import INSTRUCTION, JOINT_STATES, ObservationBuffer
from vla_policy_node.control.safety import check_finite, MotionLimits, SafetyError

FAULT_STALE = 'stale'   # a chunk whose observation was too old when it arrived
LOOP_FAULTS = FAULTS + (FAULT_STALE,)
LOOP_COUNTERS = ('control_ticks', 'commands_published', 'holds_published', 'clamped_joints',
                 'clamped_lookahead_joints', 'episode_resets', 'rejected_chunks',
                 'rejected_inputs', 'stale_actions_refused', 'unreachable_commands', 'moved_robot_refusals',
                 'tracking_error_holds', 'joint_states_without_positions', 'watchdog_holds')
LOG_PERIOD_S = 2.0
MAX_HOLD_POINTS = 1000      # a last hold walking back to where the robot was found: at most this many
EARLY_TICK = 0.1            # a latched walk steps on a tick at most this fraction of a period early (timer jitter)


class Inference(Protocol):
    """What the loop needs of the inference thread (``InferenceWorker``, or a test double)."""

    busy: bool

    def bind(self, on_result: Callable[[InferenceResult], None]) -> None: ...
    def submit(self, request: ChunkRequest, observation: dict[str, Any]) -> bool: ...
    def request_reset(self) -> None: ...


# (points (T, J), observation time of each point (T,) or None for a hold, the joints (J,) whose
# topics get it or None for all: a hold while a topic has had no subscriber, and its joints have
# no usable measurement, goes to the other topics only)
Sink = Callable[[np.ndarray, 'np.ndarray | None', 'np.ndarray | None'], None]
Log = Callable[[str, str], None]                # (severity 'info' | 'warning', text)


@dataclass(frozen=True)
class Refusal:
    """Why nothing (or only a hold) may be commanded, and how bad that is."""

    reason: str
    level: int = WARN
    counter: str | None = None      # counted when it starts a hold


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


class ControlLoop:
    """Owns a tick: inputs, scheduler, holds and the one exit for commands (``_emit``)."""

    def __init__(self, settings: LoopSettings, scheduler: SchedulerConfig, inference: Inference,
                 sink: Sink, log: Log = lambda severity, text: None,
                 wall_clock: Callable[[], float] = time.monotonic,
                 on_chunk_ready: Callable[[], None] = lambda: None,
                 envelope: MotionLimits | None = None) -> None:
        """``envelope``: the limits run-time updates may not loosen (None: ``settings.limits``)."""
        self._settings = settings
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
        self._sent: np.ndarray | None = None         # the last message (T, J); point i due at
        self._sent_at = 0.0                           # _sent_at + (i + 1) dt on the loop clock
        self._unheard = np.zeros(len(settings.joint_names), dtype=bool)   # re-enter from measured
        self._contested = False                       # another publisher on a command topic
        self._commanded_at: np.ndarray | None = None  # measured when the last action left
        self._moved_counted = False                   # this refusal counted in moved_robot_refusals
        self._not_following_fault: Refusal | None = None   # latched until an operator's restart
        self._yield_target: np.ndarray | None = None  # while latched: the setpoint walks here (J,)
        self._hold_reason: str | None = 'starting'
        self._hold_level = WARN
        self._policy_fault: str | None = None
        self._link_problem: Refusal | None = None
        self._clock_now: float | None = None         # the loop clock at the last tick
        self._clock_advanced = wall_clock()            # wall time when it last moved on
        self._last_latency: float | None = None
        self._stopped = False
        self._last_log: dict[str, float] = {}
        tight = self._tight_tracking(settings)
        if tight is not None:
            self._log('warning', tight)
        inference.bind(self.on_inference_result)

    # ------------------------------------------------------------------ settings
    @property
    def settings(self) -> LoopSettings:
        """Return the settings in force."""
        return self._settings

    @property
    def horizon(self) -> int:
        """Return the actions executed per chunk (what ``max_action_age: 0`` derives from)."""
        return self._scheduler.config.horizon

    @property
    def last_published(self) -> np.ndarray | None:
        """Return the first point (J,) of the last message that left, or None before the first."""
        with self._lock:
            return None if self._sent is None else self._sent[0].copy()

    @property
    def hold_reason(self) -> str | None:
        """Return why the loop holds, or None while it commands."""
        with self._lock:
            return self._hold_reason

    def check_update(self, settings: LoopSettings) -> str | None:
        """Say why ``settings`` may not replace the current ones, or None when they may."""
        fixed = ('joint_names', 'camera_names', 'control_rate_hz', 'first_point_joints')
        changed = [name for name in fixed if getattr(settings, name) != getattr(self._settings, name)]
        if changed:
            return f'{changed} cannot change while the loop runs'
        looser = settings.limits.loosened_from(self._envelope)
        if looser is not None:
            return f'limits: {looser}'
        with self._lock:
            sent = self._sent
            if sent is not None and not settings.limits.contains(sent):
                outside = sorted({i for point in sent for i in settings.limits.outside(point)})
                joints = [self._settings.joint_names[i] for i in outside]
                return (f'limits: the last command lies outside the new limits for {joints}; '
                        'move the robot inside them first')
        return None

    def update(self, settings: LoopSettings) -> None:
        """Replace the settings (run-time tunables); raises ValueError when ``check_update`` objects."""
        with self._lock:
            reason = self.check_update(settings)
            if reason is not None:
                raise ValueError(reason)
            tight, before = self._tight_tracking(settings), self._tight_tracking(self._settings)
            self._settings = settings
            if tight is not None and tight != before:      # not again on an unrelated parameter change
                self._log('warning', tight)

    @staticmethod
    def _tight_tracking(settings: LoopSettings) -> str | None:
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

    def set_command_link(self, subscribers: int, other_publishers: int,
                         topic: str = 'the command topic',
                         unheard_joints: Sequence[int] | None = None) -> None:
        """
        Tell the loop who else is on the command topic; commands stop unless exactly we send.

        No subscriber: nothing sent is received, so the next command of ``unheard_joints``
        (indices; None: all joints) steps from their measured state (a new segment). Another
        publisher: two senders interleave and the step limit means nothing, so the loop
        refuses to command until it is alone. With several command topics (one per
        controller), the fewest subscribers and all other publishers count, ``topic`` names
        the one at fault in the reason, and ``unheard_joints`` are the joints of the topics
        without a subscriber.
        """
        with self._lock:
            self._contested = other_publishers > 0
            if other_publishers > 0:
                self._link_problem = Refusal(
                    f'{other_publishers} other publisher(s) on {topic}: refusing to '
                    'command (another node with the same name or topic?)', ERROR)
            elif subscribers == 0:
                self._link_problem = Refusal(f'nobody subscribes to {topic}')
            else:
                self._link_problem = None
            if subscribers == 0:                  # not received: re-enter from the measured state
                self._unheard[slice(None) if unheard_joints is None else list(unheard_joints)] = True

    # ------------------------------------------------------------------ inputs
    def wants_observation(self) -> bool:
        """Tell whether a fresh frame would start a request now (worth decoding it at once)."""
        with self._lock:
            return (not self._stopped and self._not_following_fault is None and self._scheduler.needs_chunk()
                    and not self._inference.busy)

    def on_image(self, camera: str, rgb: np.ndarray, now: float, stamp: float | None) -> None:
        """Store a converted frame; with all inputs healthy it may start a request at once."""
        with self._lock:
            settings = self._settings
            problem = self._inputs.set_image(
                camera, rgb, now, stamp if settings.use_header_stamps else None,
                settings.max_observation_age)
            if problem is not None:
                self._mark_rejected(camera, problem)
            elif not self._stopped and self._blocking_problem(now) is None:
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
            if self._stopped:
                return
            if self._clock_now is not None and now < self._clock_now:
                self._clock_went_back(self._clock_now - now)
            if now != self._clock_now:
                self._clock_now, self._clock_advanced = now, self._wall()
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
            if self._hold_reason is None and self._sent is not None:
                missed = int(math.floor((now - self._sent_at) / self._settings.dt + 1e-6)) - 1
                self._scheduler.skip_overdue(min(missed, len(self._sent) - 1))
            plan = self._scheduler.take(now, self._settings.plan_points)
            if plan is None:
                self._hold(now, Refusal(self._policy_fault or 'waiting for actions from the policy'))
            else:
                self._command(now, plan)
            if self._not_following_fault is None:      # a protective stop asks nothing more of the policy
                self._request_chunk(now)

    def _clock_went_back(self, seconds: float) -> None:
        """
        Hold on a loop clock that runs backwards (a simulator reset): every age means nothing.

        The inputs received before count as faulted until each stream sends again, so the
        loop holds (and drops its plan) at this tick and commands only from new messages.
        """
        reason = f'the loop clock went back by {seconds:.3f} s (simulation reset?): waiting for new messages'
        self._sent_at -= seconds            # the controllers still run through the last message
        for stream in (*self._settings.camera_names, JOINT_STATES):
            self._inputs.reject(stream, reason)
        self._limited_log('clock', 'warning', reason)

    def watchdog(self, now: float) -> None:
        """Hold once the loop's clock stood still for ``max_observation_age`` of wall-clock time."""
        with self._lock:
            problem = self._clock_problem()
            if self._stopped or problem is None:
                return
            self._discard_plan()
            self._hold(now, problem)

    def _clock_problem(self) -> Refusal | None:
        """Refuse to command on a stopped loop clock (no tick, a frozen /clock): ages mean nothing."""
        silent = self._wall() - self._clock_advanced
        if silent <= self._settings.max_observation_age:
            return None
        return Refusal(f'no control tick for {silent:.2f} s of wall-clock time '
                       '(with use_sim_time: is /clock running?)', counter='watchdog_holds')

    def _blocking_problem(self, now: float) -> Refusal | None:
        if self._link_problem is not None:
            return self._link_problem
        if self._not_following_fault is not None:     # latched: no request, and the ERROR stays
            return self._not_following_fault
        clock = self._clock_problem()
        if clock is not None:
            return clock
        problem = self._inputs.problem(now, self._settings.max_observation_age)
        if problem is not None:
            return Refusal(problem)
        if self._hold_reason is not None and self._sent is not None:   # the ERROR stays while it lasts
            reference = self._reference(now)
            return None if reference is None else self._moved_during_hold(now, reference)
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
        if self._hold_reason is not None:
            self._log('info', f'commanding (was holding: {self._hold_reason})')
        self._hold_reason = None

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
        latch = self._not_following_fault
        if latch is not None and why is not latch:
            why = Refusal(f'{latch.reason} (also: {why.reason})', ERROR, why.counter)
        if self._hold_reason is None:
            if why.counter is not None:
                self._counters[why.counter] += 1
            problem = self._emit(now, None)
            suffix = f' (no hold sent: {problem.reason})' if problem and problem is not why else ''
            self._log('warning', f'holding: {why.reason}{suffix}')
        else:
            if why.reason != self._hold_reason:
                self._limited_log('hold', 'warning', f'holding: {why.reason}')
            walk_due = latch is not None and now - self._sent_at >= (1.0 - EARLY_TICK) * self._settings.dt
            if walk_due and not self._walked_back(now):
                self._emit(now, None)
        self._hold_reason, self._hold_level = why.reason, why.level

    def _walked_back(self, now: float) -> bool:
        """Tell whether the setpoint executed now is where a latched stop walks it (inside the limits)."""
        reference, send_to = self._hold_reference(now)
        if reference is None:
            return True
        limits = self._settings.limits
        there = np.abs(reference - np.clip(self._yield_target, limits.lower, limits.upper)) <= 1e-12
        return bool(np.all(there if send_to is None else there[send_to]))

    def _emit(self, now: float, plan: Plan | None, walk: bool = False) -> Refusal | None:
        """
        Send ``plan`` (None: a hold) through every check, or nothing; why not, or None if sent.

        A hold repeats the point executed now; latched, it steps from there toward where the
        joints were found (``walk``: the whole way, for a last hold). With stale joint states
        or unheard joints measured beyond their limits it goes to the other topics only
        (``_hold_reference``).

        The only caller of the sink. See the module docstring for what it guarantees.
        """
        if self._link_problem is not None and (plan is not None or self._contested):
            return self._link_problem
        settings = self._settings
        limits = settings.limits
        reference, send_to = (self._reference(now), None) if plan is not None else self._hold_reference(now)
        if reference is None:
            return Refusal('no fresh joint position to start from')
        if self._hold_reason is not None and self._sent is not None and self._yield_target is None:
            moved = self._moved_during_hold(now, reference, send_to)   # after a hold, a final one too
            if moved is not None:
                return moved
        if plan is not None:
            lagging = self._not_following(now, reference)
            if lagging is not None:
                return lagging
        if plan is None:
            targets, obs_times = self._hold_targets(reference, walk), None
        else:
            targets = self._fresh_rows(now, plan)
            if targets is None:
                return self._stale(now, plan)
            obs_times = plan.obs_times[:len(targets)]
        try:
            safe, clamped = limits.clamp_sequence(targets, reference, settings.dt)
            check_finite(safe, 'command')
        except SafetyError as error:
            return Refusal(f'unsafe command: {error}', ERROR)
        if not limits.contains(safe):
            self._counters['unreachable_commands'] += 1
            joints = [settings.joint_names[i] for i in limits.outside(safe[0])]
            return Refusal(f'joints {joints} are measured outside their limits by more than one '
                           'step: nothing can be commanded until they are back inside', ERROR)
        self._sink(safe, obs_times, send_to)
        self._sent, self._sent_at = safe.copy(), now      # unsent joints are unheard: next from measured
        if self._link_problem is None and send_to is None:   # every topic has a subscriber: all was received
            self._unheard[:] = False
        if plan is None:
            self._counters['holds_published'] += 1
        else:
            self._commanded_at = self._inputs.last_positions()
            self._counters['commands_published'] += 1
            self._counters['clamped_joints'] += int(clamped[0])
            self._counters['clamped_lookahead_joints'] += int(clamped[1:].sum())
        return None

    def _reference(self, now: float) -> np.ndarray | None:
        """Return what the next command steps from (J,): the point executed now, measured where unheard."""
        if self._sent is None:
            return self._inputs.fresh_positions(now, self._settings.max_observation_age)
        executing = self._executing(now)
        if not self._unheard.any():
            return executing
        measured = self._inputs.fresh_positions(now, self._settings.max_observation_age)
        return None if measured is None else np.where(self._unheard, measured, executing)

    def _hold_reference(self, now: float) -> tuple[np.ndarray | None, np.ndarray | None]:
        """
        Return what a hold steps from (J,) and the joints (J,) it goes to (None: all), or (None, None).

        An unheard joint's next message must start from a measurement. With stale joint states
        there is none, and one beyond the joint's limits by more than a step (a limp gripper
        whose controller died) leaves nothing safe to send it; the other joints still have a
        start: what their controllers execute. So the hold goes to them, and their controllers
        stop instead of running on through a plan the loop has dropped. The unheard joints are
        left out together: they are whole command topics, and a message needs all of a topic's.
        """
        reference = self._reference(now)
        if self._sent is None or not self._unheard.any() or self._unheard.all():
            return reference, None
        if reference is not None:
            limits = self._settings.limits
            step = limits.max_delta(self._settings.dt)
            unheard = self._unheard
            if np.all((reference[unheard] >= limits.lower[unheard] - step[unheard])
                      & (reference[unheard] <= limits.upper[unheard] + step[unheard])):
                return reference, None
        return self._executing(now), ~self._unheard

    def _executing(self, now: float) -> np.ndarray:
        """Return the point (J,) of the last message the controllers execute now (one was sent)."""
        executing = self._sent[self._periods_since_sent(now)].copy()
        first_only = list(self._settings.first_point_joints)
        executing[first_only] = self._sent[0, first_only]
        return executing

    def _periods_since_sent(self, now: float) -> int:
        """Return the index of the point of the last message due now (point i at (i + 1) periods)."""
        if self._clock_now is not None and now < self._clock_now:     # went back since the last tick
            now = self._clock_now
        due = int(round((now - self._sent_at) / self._settings.dt)) - 1
        return min(max(due, 0), len(self._sent) - 1)

    def _moved_during_hold(self, now: float, reference: np.ndarray,
                           joints: np.ndarray | None = None) -> Refusal | None:
        """
        Refuse to send after a hold while a joint is off the way it was going, or None.

        Each joint must be measured within ``max_step`` of the stretch from where it was
        when the last action left to the point it executes: on it, it is there, on its way,
        or stopped short (a gripper closing on an object), and stepping from its point moves
        it no further than the hold already told it to go. Off it, someone moved it. Only
        ``joints`` (all by default) are checked: a hold to some topics says nothing to the others.
        """
        measured = self._inputs.fresh_positions(now, self._settings.max_observation_age)
        if measured is None:
            return Refusal('no fresh joint position to check the robot against')
        max_step = self._settings.limits.max_step
        off = self._off_their_way(measured, reference)
        away = np.flatnonzero(off if joints is None else off & joints)
        if away.size == 0:
            self._moved_counted = False
            return None
        if not self._moved_counted:
            self._moved_counted = True
            self._counters['moved_robot_refusals'] += 1
        far = ', '.join(f'{self._settings.joint_names[i]} {measured[i] - reference[i]:+.3f}' for i in away[:8])
        return Refusal(f'joints moved during the hold, more than max_step = {max_step:g} off the way to their '
                       f'last command ({far} from it): someone moved the robot; not resuming until it is back, '
                       'or ~/restart_from_measured is called', ERROR)

    def _off_their_way(self, measured: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """Mark (J,) the joints beyond ``max_step`` of their way (where the last action left them to their point)."""
        max_step = self._settings.limits.max_step
        start = reference if self._commanded_at is None else self._commanded_at
        low, high = np.minimum(start, reference) - max_step, np.maximum(start, reference) + max_step
        return (measured < low) | (measured > high)

    def _hold_targets(self, reference: np.ndarray, walk: bool) -> np.ndarray:
        """
        Return the hold's targets (T, J): the point executed now, or, latched, where the joints were found.

        ``_emit`` clamps them to one step from the point executed now (``walk``: repeated into
        a walk at the step limit, for a last hold after which no tick continues it).
        """
        if self._yield_target is None:
            return reference[None, :]
        if not walk:
            return self._yield_target[None, :]
        steps = np.abs(self._yield_target - reference) / self._settings.limits.max_delta(self._settings.dt)
        count = min(MAX_HOLD_POINTS, max(1, math.ceil(float(steps.max()) - 1e-9)))
        return np.repeat(self._yield_target[None, :], count, axis=0)

    def _not_following(self, now: float, reference: np.ndarray) -> Refusal | None:
        """
        Refuse to command once a joint was measured beyond ``max_tracking_error`` from its point.

        Such a joint does not follow what its controller is told: the controller is off (switched
        by a controller manager), the joint is blocked, or someone pushes it. Stepping on from
        its point would pile up that distance for the moment it follows again. The loop holds,
        walking the tracked joints' setpoint back to where they were found (a blocked joint stops
        pushing; the others keep their point, a gripper its grip), and stays latched, as a
        protective stop, until an operator restarts it.
        """
        if self._not_following_fault is not None:
            return self._not_following_fault
        limit = self._settings.limits.max_tracking_error
        if np.isinf(limit).all():
            return None
        measured = self._inputs.fresh_positions(now, self._settings.max_observation_age)
        if measured is None:
            return Refusal('no fresh joint position to compare the command with')
        off = np.flatnonzero(np.abs(measured - reference) > limit)
        if off.size == 0:
            return None
        far = ', '.join(f'{self._settings.joint_names[i]} {measured[i] - reference[i]:+.3f} '
                        f'(max {limit[i]:g})' for i in off[:8])
        self._not_following_fault = Refusal(
            f'joints do not follow the command, measured beyond max_tracking_error from the point their '
            f'controller executes ({far}): is a controller switched off, a joint blocked, or someone moving '
            'the robot? Protective stop: the setpoint walks back to where they were found; nothing is '
            'commanded until ~/restart_from_measured is called (lifecycle node: or re-activated)', ERROR)
        self._yield_target = np.where(np.isinf(limit), reference, measured)
        self._counters['tracking_error_holds'] += 1
        return self._not_following_fault

    def _fresh_rows(self, now: float, plan: Plan) -> np.ndarray | None:
        """
        Return the leading rows of ``plan`` still fresh when they execute.

        Row i is reached (i + 1) periods after it leaves (a trajectory point's
        ``time_from_start``), or at once where every controller takes the first point only.
        """
        settings = self._settings
        limit = settings.action_age_limit(self._scheduler.config.horizon)
        at_once = len(settings.first_point_joints) == len(settings.joint_names)
        due = now + settings.dt * (np.arange(len(plan.actions)) + (0 if at_once else 1))
        age = due - plan.obs_times
        fresh = (age <= limit) & (age >= 0.0)          # an observation from the future: a clock gone back
        count = len(fresh) if fresh.all() else int(np.argmin(fresh))
        return plan.actions[:count] if count else None

    def _stale(self, now: float, plan: Plan) -> Refusal:
        self._counters['stale_actions_refused'] += 1
        limit = self._settings.action_age_limit(self._scheduler.config.horizon)
        if plan.obs_times[0] > now:
            return Refusal(f'action computed from an observation {plan.obs_times[0] - now:.3f} s in the '
                           'future: the loop clock went back')
        return Refusal(f'action computed from an observation {now - plan.obs_times[0]:.3f} s '
                       f'old, more than max_action_age = {limit:.3f} s')

    # ------------------------------------------------------------------ policy results
    def on_inference_result(self, result: InferenceResult) -> None:
        """Take a result of the inference thread; the scheduler decides whether it is used."""
        with self._lock:
            if self._stopped:
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
                self._last_latency = latency
                self._scheduler.cancel_request(result.request)
                self._policy_fault = message
                self._discard_plan()
                self._hold(result.finished_at, Refusal(message, WARN if fault == FAULT_STALE else ERROR))
                self._limited_log(f'policy {fault}', 'warning', f'discarded policy output: {message}')
                return
            try:
                accepted = self._scheduler.submit_chunk(result.request, result.chunk, result.finished_at,
                                                        width=len(self._settings.joint_names))
            except ValueError as rejected:
                self._counters['rejected_chunks'] += 1
                self._policy_fault = f'policy output rejected: {rejected}'   # the hold that follows says why
                self._limited_log('rejected chunk', 'warning', f'discarded policy output: {rejected}')
                return
            if accepted:
                self._last_latency = latency
                self._policy_fault = None
                if self._hold_reason is not None:
                    self._on_chunk_ready()

    # ------------------------------------------------------------------ episodes
    def reset_episode(self, reason: str) -> int:
        """Start a new episode (plan, blending, the policy's cache); return the reset count."""
        with self._lock:
            self._scheduler.reset()
            self._inference.request_reset()
            self._policy_fault = None          # the last episode's fault is not this one's
            self._counters['episode_resets'] += 1
            count = self._counters['episode_resets']
        self._log('info', f'episode reset #{count} ({reason})')
        return count

    def restart_from_measured(self, now: float) -> str | None:
        """
        Make the next command step from the measured state, on an operator's word; why not, or None.

        The way back from a hold the loop will not leave by itself (the robot moved during it,
        or stayed behind its controller): the operator has checked the robot, and the next
        command starts a segment from where it is measured, as after a lost subscriber, for
        the joints with a tracking error checked and those moved off their way. The others,
        on their way, keep stepping from their point: a gripper squeezing what it holds keeps
        its grip. Refused while commanding (nothing to restart) and without a fresh joint state.
        """
        with self._lock:
            if self._stopped:
                return 'the control loop is stopped'
            if self._hold_reason is None:
                return 'commanding: there is no hold to restart from'
            measured = self._inputs.fresh_positions(now, self._settings.max_observation_age)
            if measured is None:
                return 'no fresh joint state to start from'
            reference = self._reference(now)            # fresh measured: never None here
            self._unheard |= np.isfinite(self._settings.limits.max_tracking_error)
            self._unheard |= self._off_their_way(measured, reference)
            self._moved_counted = False
            self._not_following_fault, self._yield_target = None, None
            reason = self._hold_reason
        self._log('info', f'restarting from the measured joint state (was holding: {reason})')
        return None

    def stop(self, now: float) -> bool:
        """Stop for good after one last hold; whether the hold was sent."""
        with self._lock:
            if self._stopped:
                return False
            self._stopped = True
            self._discard_plan()
            problem = self._emit(now, None, walk=True)
            self._hold_reason = 'stopped'
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
            hold, hold_level = self._hold_reason, self._hold_level
            action_age = settings.action_age_limit(self._scheduler.config.horizon)
            latency = self._last_latency
        level = max([OK, faults.level] + [health.level for health in inputs])
        if hold is not None:
            level = max(level, hold_level)
        if latency is not None and latency > settings.max_observation_age:
            level = max(level, WARN)
        return LoopStatus(state='commanding' if hold is None else f'holding: {hold}', level=level,
                          counters=counters, inputs=inputs, policy_faults=faults,
                          max_action_age=action_age, last_chunk_latency=latency)

    def _limited_log(self, key: str, severity: str, text: str) -> None:
        """Log at most once per LOG_PERIOD_S per key, so a bad stream cannot flood the log."""
        wall = self._wall()
        if wall - self._last_log.get(key, -math.inf) >= LOG_PERIOD_S:
            self._last_log[key] = wall
            self._log(severity, text)


__all__ = ['ControlLoop', 'FAULT_STALE', 'INSTRUCTION', 'JOINT_STATES', 'LoopSettings',
           'LoopStatus', 'LOOP_FAULTS', 'Refusal']
