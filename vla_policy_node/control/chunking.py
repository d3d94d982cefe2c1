# SPDX-License-Identifier: Apache-2.0
"""
Execute action chunks at the control rate while the next chunk is computed.

The control loop calls ``take(now)`` every period; inference runs elsewhere
and hands chunks back with ``submit_chunk``. Time is injected (seconds), so tests
drive the scheduler with a simulated clock. Not thread-safe: call it from one thread
(or under one lock).

Steps: every executed action has an episode step index ``k`` (0, 1, 2, ...). A
request remembers ``step`` = the next step to execute when the observation was taken,
so action ``j`` of the returned chunk is meant for step ``step + j``. When the chunk
arrives, the actions whose time has passed are skipped: ``round(latency * measured
rate)``, clamped to the steps the robot actually executed meanwhile (a starved or
stalled robot has not moved on). The first chunk of an episode is not counted in the
delay estimate (start-up latency is not steady-state delay).

Refill: the next chunk is asked for when ``refill_threshold * horizon`` actions are left; with
``refill_from_latency`` no later than with the actions the measured latency overdues plus
``REFILL_MARGIN_TICKS`` left (the largest of the latest ``REFILL_WINDOW`` steady-state chunks,
across episodes: the latency belongs to the policy and the machine, not to the episode; until
the first is measured, the first chunk's), so a slow policy does not starve the robot for want
of a setting. It only ever asks earlier than the threshold, counts ticks at the faster of the
configured and the measured rate, and a chunk that costs no time (lockstep) changes nothing.

Every planned action carries the time of the observation it was computed from (the oldest
one, where chunks are blended), so the loop can refuse actions whose observation is too old.

Blending of the overlap between the running plan and the new chunk (``blend``):

- ``latest``: switch to the new chunk at once.
- ``weighted``: over the overlap, ``w * new + (1 - w) * old``; new chunk after it.
- ``temporal_ensemble`` (ACT): every chunk covering step ``k`` votes with weight
  ``exp(-m * i)``, ``i = 0`` for the oldest such chunk.
- ``rtc``: the request carries the committed actions and the delay (``RTCGuidance``)
  for the policy to inpaint the new chunk (see ``rtc.py``); executed like ``latest``.
  ``rtc_guidance`` picks the paper's guidance or LeRobot's (``RTC_GUIDANCE``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

BLEND_MODES = ("latest", "weighted", "temporal_ensemble", "rtc")
REFILL_MARGIN_TICKS = 1  # the tick a request may wait for, and jitter
REFILL_WINDOW = 32  # steady-state latencies the refill follows: a slow chunk in ten is almost always among them
RTC_GUIDANCE = ("paper", "lerobot")


def refill_actions(latency_s: float, rate_hz: float) -> int:
    """Actions that must be left when a chunk of this latency is asked for: the ticks it takes, and a margin."""
    return math.ceil(latency_s * rate_hz - 1e-9) + REFILL_MARGIN_TICKS


@dataclass(frozen=True)
class SchedulerConfig:
    """Chunk execution settings; raises ValueError on bad values."""

    control_rate_hz: float
    horizon: int  # actions used per chunk (its first `horizon` rows)
    refill_threshold: float = 0.5  # request when actions left <= threshold * horizon
    refill_from_latency: bool = False  # ... or <= the measured delay + REFILL_MARGIN_TICKS, whichever is more
    blend: str = "latest"  # one of BLEND_MODES
    blend_weight: float = 0.5  # weighted: weight of the new chunk over the overlap
    ensemble_decay: float = 0.1  # temporal_ensemble: m in exp(-m * i), i = 0 oldest
    rtc_max_guidance_weight: float = 10.0  # rtc: beta, clip of the guidance weight
    rtc_guidance: str = "paper"  # rtc: one of RTC_GUIDANCE
    execution_horizon: int = 10  # rtc with lerobot guidance: committed actions guided (LeRobot's default)
    delay_window: int = 8  # delay estimate = max latency of the last N steady-state chunks
    rate_ema_alpha: float = 0.05  # weight of one tick interval in the measured rate

    def __post_init__(self) -> None:
        if not (math.isfinite(self.control_rate_hz) and self.control_rate_hz > 0):
            raise ValueError(f"control_rate_hz must be finite and > 0, got {self.control_rate_hz}")
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon}")
        if not 0.0 <= self.refill_threshold <= 1.0:
            raise ValueError(f"refill_threshold must be in [0, 1], got {self.refill_threshold}")
        if self.blend not in BLEND_MODES:
            raise ValueError(f"blend must be one of {BLEND_MODES}, got {self.blend!r}")
        if not 0.0 <= self.blend_weight <= 1.0:
            raise ValueError(f"blend_weight must be in [0, 1], got {self.blend_weight}")
        if not (math.isfinite(self.ensemble_decay) and self.ensemble_decay >= 0):
            raise ValueError(f"ensemble_decay must be finite and >= 0, got {self.ensemble_decay}")
        if not (math.isfinite(self.rtc_max_guidance_weight) and self.rtc_max_guidance_weight > 0):
            raise ValueError(f"rtc_max_guidance_weight must be finite and > 0, got {self.rtc_max_guidance_weight}")
        if self.rtc_guidance not in RTC_GUIDANCE:
            raise ValueError(f"rtc_guidance must be one of {RTC_GUIDANCE}, got {self.rtc_guidance!r}")
        if self.execution_horizon < 1:
            raise ValueError(f"execution_horizon must be >= 1, got {self.execution_horizon}")
        if self.delay_window < 1:
            raise ValueError(f"delay_window must be >= 1, got {self.delay_window}")
        if not 0.0 < self.rate_ema_alpha <= 1.0:
            raise ValueError(f"rate_ema_alpha must be in (0, 1], got {self.rate_ema_alpha}")


@dataclass(frozen=True)
class RTCGuidance:
    """What the policy needs to inpaint a chunk: committed actions and the delay."""

    prefix: np.ndarray  # (K, A) actions the robot will execute from the request on; read-only
    delay_steps: int  # d: actions of the new chunk that run before it arrives (0 <= d <= K); K until measured
    max_guidance_weight: float  # beta
    guidance: str = "paper"  # one of RTC_GUIDANCE
    execution_horizon: int | None = None  # lerobot guidance: only the first N committed actions (None: all K)


@dataclass(frozen=True)
class Plan:
    """The planned actions from this step on and the observation time of each."""

    actions: np.ndarray  # (K, A), row 0 for this step
    obs_times: np.ndarray  # (K,) seconds, the scheduler's clock


@dataclass(frozen=True)
class ChunkRequest:
    """One inference request; chunk action ``j`` is meant for episode step ``step + j``."""

    request_id: int
    episode: int
    obs_time: float  # seconds, the clock of the scheduler: when the request was made
    step: int
    rtc: RTCGuidance | None  # set in rtc mode when actions are committed
    oldest_input: float | None = None  # arrival of the oldest input it carries (None: obs_time)
    issuer: object = None  # the scheduler that made it: ids restart at 0 in every scheduler

    @property
    def observed_at(self) -> float:
        """Return when its observation was taken: its oldest input, which ages every action from it."""
        return self.obs_time if self.oldest_input is None else min(self.oldest_input, self.obs_time)


class ChunkScheduler:
    """Chunk queue, refill trigger, delay compensation and blending; see module docstring."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._period = 1.0 / config.control_rate_hz  # EMA of measured tick intervals
        self._last_tick: float | None = None
        self._next_id = 0
        self._episode = 0
        # A new loop (a lifecycle re-activation) has a new scheduler whose ids start at 0 again:
        # a late answer to the old one's request (0, 0) must not pass for this one's.
        self._issuer = object()
        # Steady-state latencies of the whole run (the refill's); the episode's own feed the delay.
        self._run_latencies: deque[float] = deque(maxlen=REFILL_WINDOW)
        self._run_from_startup = False  # _run_latencies holds only a first chunk's latency
        self._stats = dict.fromkeys(
            (
                "chunks_requested", "chunks_received", "chunks_discarded", "chunks_rejected",
                "requests_cancelled", "actions_taken", "actions_skipped", "actions_overdue",
                "waiting_ticks", "starved_ticks", "resets", "plans_dropped",
            ),
            0,
        )
        self._clear_episode()

    def _clear_episode(self) -> None:
        self._step = 0
        # (first step, actions (T, A), observation times (T,)), oldest first
        self._chunks: list[tuple[int, np.ndarray, np.ndarray]] = []
        self._pending: ChunkRequest | None = None
        self._pending_is_startup = False
        self._received = False
        self._latencies: deque[float] = deque(maxlen=self.config.delay_window)
        self._last_tick = None  # an interval spanning a reset is not a control period

    # ------------------------------------------------------------ state
    @property
    def stats(self) -> dict[str, int]:
        """
        Counters since construction (resets do not clear them).

        ``actions_taken`` counts the actions ``take`` handed out; the loop may still refuse to
        send one (its ``commands_published`` counts what left).
        """
        return dict(self._stats)

    @property
    def actions_left(self) -> int:
        """Planned actions from the next step on."""
        return max((start + len(a) for start, a, _ in self._chunks), default=self._step) - self._step

    @property
    def measured_rate_hz(self) -> float:
        """Control rate from an EMA of tick intervals (the configured one until measured)."""
        return 1.0 / self._period

    @property
    def delay_steps(self) -> int | None:
        """Conservative inference delay in control steps; None until measured this episode."""
        if not self._latencies:
            return None
        return max(0, math.ceil(max(self._latencies) * self.measured_rate_hz - 1e-9))

    @property
    def refill_at(self) -> int:
        """Actions left at which the next chunk is asked for (see the module docstring)."""
        at = math.floor(self.config.refill_threshold * self.config.horizon)
        slowest = max(self._run_latencies, default=0.0) if self.config.refill_from_latency else 0.0
        if slowest > 0:
            at = max(at, refill_actions(slowest, max(self.measured_rate_hz, self.config.control_rate_hz)))
        return at

    @property
    def in_flight(self) -> bool:
        """Whether a request waits for its chunk."""
        return self._pending is not None

    # ------------------------------------------------------------ requests
    def needs_chunk(self) -> bool:
        """Tell whether to request now: nothing in flight and no more than ``refill_at`` actions left."""
        return self._pending is None and self.actions_left <= self.refill_at

    def begin_request(self, now: float, oldest_input: float | None = None) -> ChunkRequest:
        """
        Open a request at ``now``; one at a time.

        ``oldest_input``: when the oldest input of its observation arrived. The actions are
        aged from it; the delay compensation counts from ``now``, when the steps it skips begin.
        """
        if self._pending is not None:
            raise RuntimeError(f"request {self._pending.request_id} is still in flight")
        rtc = None
        if self.config.blend == "rtc" and self.actions_left > 0:
            prefix, _ = self._plan()
            prefix.setflags(write=False)
            delay = self.delay_steps
            delay = len(prefix) if delay is None else min(delay, len(prefix))
            horizon = self.config.execution_horizon if self.config.rtc_guidance == "lerobot" else None
            rtc = RTCGuidance(prefix, delay, self.config.rtc_max_guidance_weight, self.config.rtc_guidance, horizon)
        self._pending = ChunkRequest(self._next_id, self._episode, now, self._step, rtc, oldest_input,
                                     self._issuer)
        self._pending_is_startup = not self._received
        self._next_id += 1
        self._stats["chunks_requested"] += 1
        return self._pending

    def awaits(self, request: ChunkRequest) -> bool:
        """Tell whether ``request`` is the one in flight (not cancelled, not of an ended episode)."""
        pending = self._pending
        return (pending is not None and request.issuer is self._issuer
                and (request.episode, request.request_id) == (pending.episode, pending.request_id))

    def cancel_request(self, request: ChunkRequest) -> None:
        """Inference failed: forget the request so the next tick may retry."""
        if self.awaits(request):
            self._pending = None
            self._stats["requests_cancelled"] += 1

    def submit_chunk(self, request: ChunkRequest, chunk: np.ndarray, now: float,
                     width: int | None = None) -> bool:
        """
        Queue a chunk (T, A), T >= horizon; False if it belongs to an old request or episode.

        Raises ValueError on a malformed or non-finite chunk, or one whose A is not ``width``
        (when given: the joints it drives); the request is closed.
        """
        if not self.awaits(request):
            self._stats["chunks_discarded"] += 1
            return False
        self._pending = None
        actions = np.asarray(chunk, dtype=np.float64)
        error = self._check_chunk(actions, width)
        if error:
            self._stats["chunks_rejected"] += 1
            raise ValueError(error)
        latency = now - request.obs_time
        if not self._pending_is_startup:
            self._latencies.append(latency)
            if self._run_from_startup:
                self._run_latencies.clear()
            self._run_latencies.append(latency)
            self._run_from_startup = False
        elif not self._run_latencies:
            self._run_latencies.append(latency)
            self._run_from_startup = True
        elapsed = max(0, round(latency * self.measured_rate_hz))
        skip = min(elapsed, self._step - request.step, self.config.horizon)
        self._stats["chunks_received"] += 1
        self._stats["actions_skipped"] += skip
        self._received = True
        kept = actions[skip:self.config.horizon]
        self._blend_in(kept, np.full(len(kept), request.observed_at))
        return True

    def _check_chunk(self, actions: np.ndarray, width: int | None) -> str | None:
        if actions.ndim != 2 or actions.shape[0] < self.config.horizon:
            return f"chunk must be (T >= {self.config.horizon}, A), got shape {actions.shape}"
        if width is not None and actions.shape[1] != width:
            return f"chunk of shape {actions.shape}, expected {width} actions per row (one per joint)"
        if self._chunks and actions.shape[1] != self._chunks[0][1].shape[1]:
            return f"chunk has {actions.shape[1]} action dims, the running one {self._chunks[0][1].shape[1]}"
        if not np.isfinite(actions).all():
            return "chunk has non-finite actions"
        return None

    def _blend_in(self, new: np.ndarray, obs_times: np.ndarray) -> None:
        """Merge ``new`` (N, A) observed at ``obs_times`` (N,), row 0 for the next step."""
        if len(new) == 0:
            return
        if self.config.blend == "temporal_ensemble":
            self._chunks.append((self._step, new, obs_times))
            return
        if self.config.blend == "weighted" and self._chunks:
            old, old_times = self._plan()
            n = min(len(old), len(new))
            w = self.config.blend_weight
            new = new.copy()
            new[:n] = w * new[:n] + (1.0 - w) * old[:n]
            obs_times[:n] = np.minimum(obs_times[:n], old_times[:n])
        self._chunks = [(self._step, new, obs_times)]

    def _plan(self) -> tuple[np.ndarray, np.ndarray]:
        """Remaining actions (K, A) of the running chunk and their observation times (K,)."""
        start, actions, obs_times = self._chunks[-1]
        return actions[self._step - start:].copy(), obs_times[self._step - start:].copy()

    # ------------------------------------------------------------ execution
    def take(self, now: float, n: int = 1) -> Plan | None:
        """
        Execute this tick's step: return its action and the plan after it, at most ``n`` rows.

        ``n`` = 0 returns every planned action. None when starved (the loop holds); the step
        is consumed only when an action is returned.
        """
        self._measure_tick(now)
        k = self._step
        self._chunks = [chunk for chunk in self._chunks if chunk[0] + len(chunk[1]) > k]
        plan = self._planned(n)
        if plan is None:
            self._stats["starved_ticks" if self._received else "waiting_ticks"] += 1
            return None
        self._step += 1
        self._stats["actions_taken"] += 1
        return plan

    def skip_overdue(self, steps: int) -> None:
        """Drop the next ``steps`` planned actions unexecuted: their time passed (a stalled tick)."""
        if steps > 0:
            self._step += steps
            self._stats["actions_overdue"] += steps

    def next_action(self, now: float) -> np.ndarray | None:
        """Return the action (A,) for this tick, or None when starved (see ``take``)."""
        plan = self.take(now, 1)
        return None if plan is None else plan.actions[0]

    def _planned(self, n: int) -> Plan | None:
        """Return the plan from the current step on (at most ``n`` rows, 0: all); None if empty."""
        count = self.actions_left if n <= 0 else min(n, self.actions_left)
        rows, times = [], []
        for k in range(self._step, self._step + count):
            planned = self._action_at(k)
            if planned is None:
                break
            rows.append(planned[0])
            times.append(planned[1])
        if not rows:
            return None
        return Plan(np.stack(rows), np.array(times))

    def _action_at(self, k: int) -> tuple[np.ndarray, float] | None:
        """Return the (blended) action for step ``k`` (a copy) and its oldest observation time."""
        covering = [(a[k - s], t[k - s]) for s, a, t in self._chunks if s <= k < s + len(a)]
        if not covering:
            return None
        obs_time = float(min(t for _, t in covering))
        if len(covering) == 1:
            return covering[0][0].copy(), obs_time
        weights = np.exp(-self.config.ensemble_decay * np.arange(len(covering)))
        return weights @ np.stack([a for a, _ in covering]) / weights.sum(), obs_time

    def _measure_tick(self, now: float) -> None:
        """EMA of tick intervals, each clamped to [0.5, 2] nominal periods (stalls are outliers)."""
        if self._last_tick is not None and now > self._last_tick:
            nominal = 1.0 / self.config.control_rate_hz
            interval = min(max(now - self._last_tick, 0.5 * nominal), 2.0 * nominal)
            self._period += self.config.rate_ema_alpha * (interval - self._period)
        self._last_tick = now

    def drop_plan(self) -> None:
        """
        Forget the queued actions and the request in flight, within the same episode.

        For an input that went bad: nothing planned from the older observation may run, but
        the measured delay and control rate stay valid (unlike ``reset``).
        """
        self._chunks = []
        self._pending = None
        self._stats["plans_dropped"] += 1

    def reset(self) -> None:
        """Episode boundary: drop queue, blending state, delay estimate and any request in flight."""
        self._episode += 1
        self._stats["resets"] += 1
        self._clear_episode()
