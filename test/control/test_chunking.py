# SPDX-License-Identifier: Apache-2.0
"""ChunkScheduler driven by a simulated clock and a scripted policy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vla_policy_node.control.chunking import BLEND_MODES, ChunkRequest, ChunkScheduler, SchedulerConfig

RATE = 30.0
PERIOD = 1.0 / RATE


def reference(steps: np.ndarray) -> np.ndarray:
    """Smooth 2-joint trajectory (T, 2); per-step change is at most 0.05 + 0.03."""
    steps = np.asarray(steps, dtype=np.float64)
    return np.stack([np.sin(0.05 * steps), 0.5 * np.cos(0.03 * steps) + 0.001 * steps], axis=-1)


def exact_policy(request: ChunkRequest, length: int = 16) -> np.ndarray:
    """Act as a policy that knows the reference: action j is reference(step + j)."""
    return reference(request.step + np.arange(length))


@dataclass
class Run:
    commands: list = field(default_factory=list)  # per tick: (A,) or None
    skips: list = field(default_factory=list)  # per chunk: (actions skipped, ticks executed while in flight)
    scheduler: ChunkScheduler | None = None


def simulate(
    config: SchedulerConfig,
    n_ticks: int,
    latency: Callable[[int], float],
    tick_jitter: float = 0.0,
    policy: Callable[[ChunkRequest], np.ndarray] = exact_policy,
    seed: int = 0,
) -> Run:
    """Ticks every period (+-jitter periods); the chunk for request i arrives latency(i) s later."""
    rng = np.random.default_rng(seed)
    period = 1.0 / config.control_rate_hz
    sched = ChunkScheduler(config)
    run = Run(scheduler=sched)
    in_flight = None  # (arrival time, request, actions executed at request)
    for k in range(n_ticks):
        now = k * period + tick_jitter * period * rng.uniform(-1.0, 1.0)
        if in_flight is not None and in_flight[0] <= now:
            arrival, request, taken_at_request = in_flight
            skipped_before = sched.stats["actions_skipped"]
            assert sched.submit_chunk(request, policy(request), arrival)
            run.skips.append(
                (sched.stats["actions_skipped"] - skipped_before, sched.stats["actions_taken"] - taken_at_request)
            )
            in_flight = None
        run.commands.append(sched.next_action(now))
        if sched.needs_chunk():
            request = sched.begin_request(now)
            in_flight = (now + latency(request.request_id), request, sched.stats["actions_taken"])
    return run


def published(commands: list) -> np.ndarray:
    """Return what the node publishes: hold the last command while starved (after the first one)."""
    first = next(i for i, c in enumerate(commands) if c is not None)
    held, last = [], commands[first]
    for c in commands[first:]:
        last = last if c is None else c
        held.append(last)
    return np.array(held)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"control_rate_hz": 0.0}, "control_rate_hz"),
        ({"control_rate_hz": math.inf}, "control_rate_hz"),
        ({"horizon": 0}, "horizon"),
        ({"refill_threshold": 1.5}, "refill_threshold"),
        ({"blend": "average"}, "blend"),
        ({"blend_weight": -0.1}, "blend_weight"),
        ({"ensemble_decay": -1.0}, "ensemble_decay"),
        ({"rtc_max_guidance_weight": 0.0}, "rtc_max_guidance_weight"),
        ({"delay_window": 0}, "delay_window"),
        ({"rate_ema_alpha": 0.0}, "rate_ema_alpha"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    base = {"control_rate_hz": RATE, "horizon": 16}
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**{**base, **kwargs})


# ---------------------------------------------------------------- steady state


@pytest.mark.parametrize("blend", BLEND_MODES)
def test_boundaries_have_no_gap_and_no_jump(blend):
    # ~2.6 periods of latency (86 ms at 30 Hz) +-30 %, ticks +-10 %: refill at 8 of 16 never runs dry.
    rng = np.random.default_rng(1)
    latencies = 0.086 * (1 + 0.3 * rng.uniform(-1, 1, size=100))
    config = SchedulerConfig(RATE, horizon=16, refill_threshold=0.5, blend=blend)
    run = simulate(config, 300, lambda i: 0.3 if i == 0 else latencies[i], tick_jitter=0.1)
    first = next(i for i, c in enumerate(run.commands) if c is not None)
    assert all(c is not None for c in run.commands[first:])  # a new command every tick: no gap
    commands = np.array(run.commands[first:])
    max_step = 0.08  # configured step; the reference never moves more per step
    assert np.abs(np.diff(commands, axis=0)).max() <= max_step
    np.testing.assert_allclose(commands, reference(np.arange(len(commands))), atol=1e-12)
    assert run.scheduler.stats["starved_ticks"] == 0
    assert run.scheduler.stats["chunks_received"] > 15


@settings(max_examples=25, deadline=None)
@given(
    latency_periods=st.floats(0.0, 6.0),
    latency_jitter=st.floats(0.0, 0.5),
    tick_jitter=st.floats(0.0, 0.3),
    seed=st.integers(0, 1000),
)
def test_skipped_counts_equal_elapsed_actions(latency_periods, latency_jitter, tick_jitter, seed):
    rng = np.random.default_rng(seed)
    latencies = PERIOD * latency_periods * (1 + latency_jitter * rng.uniform(-1, 1, size=200))
    config = SchedulerConfig(RATE, horizon=16, refill_threshold=0.5)
    run = simulate(config, 150, lambda i: latencies[i], tick_jitter=tick_jitter, seed=seed)
    assert all(skipped == elapsed for skipped, elapsed in run.skips)
    commands = published(run.commands)
    np.testing.assert_allclose(commands[0], reference([0])[0])
    # Whatever the latency, the robot never executes an action twice or skips one.
    executed = np.array([c for c in run.commands if c is not None])
    np.testing.assert_allclose(executed, reference(np.arange(len(executed))), atol=1e-12)


def test_skip_clamped_to_actions_consumed_when_the_robot_stalls():
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4))
    request = sched.begin_request(0.0)
    # The timer stalls for 0.5 s: time says 5 actions passed, the robot executed none.
    assert sched.submit_chunk(request, np.arange(4.0)[:, None], now=0.5)
    assert sched.stats["actions_skipped"] == 0
    assert sched.next_action(0.5)[0] == 0.0


def test_skip_limited_to_elapsed_time():
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=8, refill_threshold=1.0))
    assert sched.submit_chunk(sched.begin_request(0.0), np.zeros((8, 1)), now=0.0)
    request = sched.begin_request(0.0)
    for now in (0.01, 0.02, 0.03):  # a burst of three ticks within 0.03 s
        sched.next_action(now)
    assert sched.submit_chunk(request, np.arange(8.0)[:, None], now=0.04)
    assert sched.stats["actions_skipped"] == 0  # round(0.04 s * 10 Hz) = 0 actions' time has passed
    assert sched.next_action(0.1)[0] == 0.0


def test_measured_rate_and_delay_estimate():
    sched = ChunkScheduler(SchedulerConfig(30.0, horizon=100, refill_threshold=1.0, rate_ema_alpha=0.2))
    assert sched.measured_rate_hz == 30.0
    assert sched.submit_chunk(sched.begin_request(0.0), np.zeros((100, 1)), now=1.0)  # start-up: 1 s
    assert sched.delay_steps is None  # start-up latency is not steady-state delay
    for k in range(60):  # the timer really runs at 25 Hz
        sched.next_action(1.0 + k / 25.0)
    assert sched.measured_rate_hz == pytest.approx(25.0, rel=1e-3)
    now = 1.0 + 59 / 25.0
    assert sched.submit_chunk(sched.begin_request(now), np.zeros((100, 1)), now=now + 0.115)
    assert sched.delay_steps == 3  # ceil(0.115 s * 25 Hz); the nominal 30 Hz would say 4
    assert sched.submit_chunk(sched.begin_request(now), np.zeros((100, 1)), now=now + 0.05)
    assert sched.delay_steps == 3  # conservative: max over the window


@pytest.mark.parametrize("auto", [False, True])
def test_the_refill_from_latency_asks_earlier_once_a_steady_latency_is_measured_and_never_later(auto):
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=20, refill_threshold=0.1, refill_from_latency=auto))
    assert sched.refill_at == 2                                        # floor(0.1 * 20)
    assert sched.submit_chunk(sched.begin_request(0.0), np.zeros((20, 1)), now=3.0)   # start-up: 30 ticks
    assert sched.refill_at == (31 if auto else 2)                     # only until a steady latency is measured
    request = sched.begin_request(3.0)
    assert sched.submit_chunk(request, np.zeros((20, 1)), now=3.45)  # 0.45 s at 10 Hz: 5 ticks overdue
    asked_at = None
    for k in range(19):                                                # all but the last of its 20 actions
        assert sched.next_action(3.5 + k / 10) is not None
        if asked_at is None and sched.needs_chunk():
            asked_at = sched.actions_left
    assert asked_at == (6 if auto else 2)                             # the 5 ticks plus a tick of margin
    sched.reset()                                                      # the latency belongs to the policy
    assert sched.refill_at == (6 if auto else 2)
    high = ChunkScheduler(SchedulerConfig(10.0, horizon=20, refill_threshold=0.9, refill_from_latency=auto))
    high.submit_chunk(high.begin_request(0.0), np.zeros((20, 1)), now=3.0)
    high.submit_chunk(high.begin_request(3.0), np.zeros((20, 1)), now=3.45)
    assert high.refill_at == 18                                        # never later than the threshold


def test_a_chunk_that_costs_no_time_leaves_the_refill_at_the_threshold():
    """Lockstep: the simulator's clock waits for each chunk, so the refill from latency must not move the request."""
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4, refill_threshold=0.0, refill_from_latency=True))
    for now in (0.0, 0.0, 0.4):
        assert sched.submit_chunk(sched.begin_request(now), np.zeros((4, 1)), now=now)
    assert sched.refill_at == 0


# ---------------------------------------------------------------- blending, hand-computed


def two_chunks(blend: str, **kwargs) -> tuple[ChunkScheduler, list]:
    """
    Chunk A = 0,1,2,3 from step 0; at step 2 (t=0.1) request B = 10..13, arriving at t=0.27.

    Step 2 ran at t=0.2 while B was in flight, so B[0] (step 2) is skipped; B[1] is for step 3.
    """
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4, refill_threshold=0.5, blend=blend, **kwargs))
    assert sched.submit_chunk(sched.begin_request(0.0), np.arange(4.0)[:, None], now=0.0)
    out = [sched.next_action(0.0), sched.next_action(0.1)]
    assert sched.needs_chunk()  # 2 actions left = 0.5 * 4
    request = sched.begin_request(0.1)
    out.append(sched.next_action(0.2))
    assert sched.submit_chunk(request, 10.0 + np.arange(4.0)[:, None], now=0.27)
    assert sched.stats["actions_skipped"] == 1
    out += [sched.next_action(0.1 * k) for k in (3, 4, 5, 6)]
    return sched, [None if a is None else float(a[0]) for a in out]


def test_latest_switches_at_once():
    _, out = two_chunks("latest")
    assert out == [0.0, 1.0, 2.0, 11.0, 12.0, 13.0, None]


def test_weighted_blends_the_overlap():
    _, out = two_chunks("weighted", blend_weight=0.25)
    assert out == [0.0, 1.0, 2.0, 0.25 * 11 + 0.75 * 3, 12.0, 13.0, None]


def test_temporal_ensemble_weights_oldest_first():
    _, out = two_chunks("temporal_ensemble", ensemble_decay=math.log(2.0))
    # Step 3: A says 3 (oldest, weight 1), B says 11 (weight exp(-ln 2) = 0.5).
    assert out[3] == pytest.approx((3.0 + 0.5 * 11.0) / 1.5)
    assert out[:3] == [0.0, 1.0, 2.0] and out[4:] == [12.0, 13.0, None]


def test_temporal_ensemble_averages_three_chunks():
    sched = ChunkScheduler(
        SchedulerConfig(10.0, horizon=4, refill_threshold=1.0, blend="temporal_ensemble", ensemble_decay=1.0)
    )
    for value in (0.0, 1.0, 2.0):
        assert sched.submit_chunk(sched.begin_request(0.0), np.full((4, 1), value), now=0.0)
    w = np.exp(-np.arange(3.0))
    assert sched.next_action(0.0)[0] == pytest.approx(w @ [0.0, 1.0, 2.0] / w.sum())


def test_rtc_request_carries_committed_actions_and_delay():
    sched, out = two_chunks("rtc", rtc_max_guidance_weight=5.0)
    assert out == [0.0, 1.0, 2.0, 11.0, 12.0, 13.0, None]  # executed like latest
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4, refill_threshold=0.5, blend="rtc"))
    first = sched.begin_request(0.0)
    assert first.rtc is None  # nothing committed yet
    assert sched.submit_chunk(first, np.arange(4.0)[:, None], now=0.0)
    sched.next_action(0.0)
    sched.next_action(0.1)
    request = sched.begin_request(0.1)
    np.testing.assert_array_equal(request.rtc.prefix, [[2.0], [3.0]])
    assert not request.rtc.prefix.flags.writeable
    assert request.rtc.delay_steps == 2  # no steady-state estimate yet: the whole prefix is frozen
    sched.next_action(0.2)
    assert sched.submit_chunk(request, np.full((4, 1), 2.0), now=0.27)
    sched.next_action(0.3)
    request = sched.begin_request(0.3)
    assert request.rtc.delay_steps == 2  # ceil(0.17 s * 10 Hz)
    np.testing.assert_array_equal(request.rtc.prefix, [[2.0], [2.0]])


# ---------------------------------------------------------------- starvation, reset, stale chunks


def test_starvation_holds_and_recovers():
    # Chunks 3 and 4 take 20 periods: longer than the 8 actions left at refill.
    slow = {3, 4}
    config = SchedulerConfig(RATE, horizon=16, refill_threshold=0.5)
    run = simulate(config, 200, lambda i: 20 * PERIOD + 1e-4 if i in slow else 2.5 * PERIOD)
    stats = run.scheduler.stats
    assert stats["starved_ticks"] > 0
    first = next(i for i, c in enumerate(run.commands) if c is not None)
    starved = [k for k, c in enumerate(run.commands) if c is None and k > first]
    assert len(starved) == stats["starved_ticks"]
    assert max(starved) < 150 and all(c is not None for c in run.commands[max(starved) + 1:])  # recovered
    # After starving, the robot resumes where it stopped: no action skipped that it did not execute.
    executed = np.array([c for c in run.commands if c is not None])
    np.testing.assert_allclose(executed, reference(np.arange(len(executed))), atol=1e-12)
    held = published(run.commands)
    assert np.abs(np.diff(held, axis=0)).max() <= 0.08


def test_reset_clears_queue_blending_state_and_delay():
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4, refill_threshold=1.0, blend="temporal_ensemble"))
    for now in (0.0, 0.1):
        assert sched.submit_chunk(sched.begin_request(now), np.ones((4, 1)), now=now + 0.05)
        sched.next_action(now + 0.05)
    assert sched.delay_steps == 1
    in_flight = sched.begin_request(0.2)
    sched.reset()
    assert sched.actions_left == 0 and sched.delay_steps is None and not sched.in_flight
    assert sched.needs_chunk()
    assert sched.next_action(0.3) is None
    assert sched.stats["waiting_ticks"] == 1 and sched.stats["starved_ticks"] == 0
    assert not sched.submit_chunk(in_flight, np.ones((4, 1)), now=0.3)
    request = sched.begin_request(0.3)
    assert request.step == 0 and request.episode == 1
    assert sched.submit_chunk(request, np.full((4, 1), 7.0), now=0.35)
    assert sched.next_action(0.4)[0] == 7.0  # no old chunk left to ensemble with


def test_drop_plan_forgets_actions_and_request_but_keeps_the_delay_estimate():
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4, refill_threshold=1.0, blend="temporal_ensemble"))
    for now in (0.0, 0.1):
        assert sched.submit_chunk(sched.begin_request(now), np.ones((4, 1)), now=now + 0.05)
        sched.next_action(now + 0.05)
    in_flight = sched.begin_request(0.2)
    sched.drop_plan()
    assert sched.actions_left == 0 and not sched.in_flight and sched.delay_steps == 1
    assert not sched.submit_chunk(in_flight, np.full((4, 1), 5.0), now=0.3)   # planned from the old inputs
    request = sched.begin_request(0.3)
    assert request.episode == in_flight.episode and request.step > 0
    assert sched.submit_chunk(request, np.full((4, 1), 7.0), now=0.35)
    assert sched.next_action(0.4)[0] == 7.0    # nothing old left to ensemble with
    assert sched.stats["plans_dropped"] == 1 and sched.stats["resets"] == 0


def test_stale_episode_chunk_is_discarded():
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4))
    old = sched.begin_request(0.0)
    sched.reset()
    new = sched.begin_request(0.1)
    assert old.episode != new.episode
    assert not sched.submit_chunk(old, np.ones((4, 1)), now=0.2)
    assert sched.in_flight  # the stale chunk did not close the current request
    assert sched.submit_chunk(new, np.zeros((4, 1)), now=0.2)
    assert sched.stats["chunks_discarded"] == 1 and sched.stats["chunks_received"] == 1


def test_cancel_lets_the_next_tick_retry():
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4))
    request = sched.begin_request(0.0)
    assert not sched.needs_chunk()
    sched.cancel_request(request)
    assert sched.needs_chunk() and sched.stats["requests_cancelled"] == 1
    assert not sched.submit_chunk(request, np.zeros((4, 1)), now=0.1)


def test_one_request_at_a_time():
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4))
    sched.begin_request(0.0)
    with pytest.raises(RuntimeError, match="in flight"):
        sched.begin_request(0.1)


@pytest.mark.parametrize(
    "chunk, message",
    [(np.zeros((3, 1)), "shape"), (np.zeros(4), "shape"), (np.full((4, 1), np.nan), "non-finite")],
)
def test_bad_chunk_is_rejected_and_closes_the_request(chunk, message):
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4))
    request = sched.begin_request(0.0)
    with pytest.raises(ValueError, match=message):
        sched.submit_chunk(request, chunk, now=0.1)
    assert not sched.in_flight and sched.stats["chunks_rejected"] == 1


def test_chunk_with_other_action_dim_is_rejected():
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=4, refill_threshold=1.0))
    assert sched.submit_chunk(sched.begin_request(0.0), np.zeros((4, 2)), now=0.0)
    with pytest.raises(ValueError, match="action dims"):
        sched.submit_chunk(sched.begin_request(0.0), np.zeros((4, 3)), now=0.0)


def test_longer_chunk_is_cut_to_the_horizon():
    sched = ChunkScheduler(SchedulerConfig(10.0, horizon=2, refill_threshold=0.0))
    assert sched.submit_chunk(sched.begin_request(0.0), np.arange(5.0)[:, None], now=0.0)
    assert sched.actions_left == 2
    assert [sched.next_action(t) is None for t in (0.0, 0.1, 0.2)] == [False, False, True]
    assert sched.stats["starved_ticks"] == 1


def test_a_request_of_another_scheduler_is_never_awaited():
    """A lifecycle re-activation makes a new loop whose ids start at 0 again: the old (0, 0) is not its own."""
    config = SchedulerConfig(control_rate_hz=10.0, horizon=4)
    old, new = ChunkScheduler(config), ChunkScheduler(config)
    stale = old.begin_request(0.0, None)
    fresh = new.begin_request(1.0, None)
    assert (stale.episode, stale.request_id) == (fresh.episode, fresh.request_id)
    assert not new.awaits(stale) and new.awaits(fresh)
    assert not new.submit_chunk(stale, np.ones((4, 2)), 1.1)
    new.cancel_request(stale)
    assert new.awaits(fresh), 'an old request cannot cancel the new one'
    assert new.submit_chunk(fresh, np.zeros((4, 2)), 1.1)
