# SPDX-License-Identifier: Apache-2.0
"""The real-time verdict on /diagnostics: whether the measured chunk latency keeps the robot fed at these settings."""

import math

import numpy as np
from hypothesis import given, settings, strategies as st

from vla_policy_node.bench.schedule import simulate
from vla_policy_node.control.chunking import ChunkScheduler, REFILL_WINDOW, SchedulerConfig
from vla_policy_node.control.health import OK, WARN
from vla_policy_node.control.real_time import longest_latency, real_time_verdict, refill_threshold_for


def config(threshold: float = 0.5, horizon: int = 50, rate: float = 30.0, auto: bool = False) -> SchedulerConfig:
    return SchedulerConfig(control_rate_hz=rate, horizon=horizon, refill_threshold=threshold,
                           refill_from_latency=auto)


def test_a_fast_policy_at_the_default_threshold_is_ok_and_says_what_it_needs():
    verdict = real_time_verdict(0.2, config(), lockstep=False)
    assert verdict.level == OK and verdict.needed_threshold == 7 / 50          # ceil(6) + 1 ticks of 50
    assert verdict.message == ('chunks take 200 ms (p95): chunking.refill_threshold 0.5 keeps the robot fed '
                               '(it needs 0.14)')


def test_a_threshold_below_the_latency_is_a_warning_with_the_setting_rounded_up():
    verdict = real_time_verdict(0.2, config(0.1, horizon=30), lockstep=False)     # needs 7/30 = 0.2333...
    assert verdict.level == WARN and math.isclose(verdict.needed_threshold, 7 / 30)
    assert 'chunking.refill_threshold 0.1 is too low' in verdict.message
    assert verdict.message.endswith('set chunking.refill_threshold to 0.24 or more, '      # 0.23 would not do
                                    'or chunking.refill_from_latency to true')
    assert real_time_verdict(0.2, config(0.24, horizon=30), lockstep=False).level == OK


def test_with_the_refill_from_latency_the_verdict_judges_the_refill_the_scheduler_uses_now():
    """It needs 7 actions left at a 0.2 s p95 (30 Hz); the threshold 0.1 gives 3, the scheduler says how many now."""
    raised = real_time_verdict(0.2, config(0.1, horizon=30, auto=True), lockstep=False, refill_at=8)
    assert raised.level == OK and math.isclose(raised.needed_threshold, 7 / 30)
    assert raised.message == ('chunks take 200 ms (p95): chunking.refill_from_latency raises '
                              'chunking.refill_threshold 0.1 to 0.27, which keeps the robot fed (it needs 0.24)')
    short = real_time_verdict(0.2, config(0.1, horizon=30, auto=True), lockstep=False, refill_at=5)
    assert short.level == WARN and short.message.startswith('chunking.refill_from_latency asks with 5 actions left, '
                                                            'too few: chunks take 200 ms (p95)')
    assert short.message.endswith('set chunking.refill_threshold to 0.24 or more')
    unraised = real_time_verdict(0.2, config(0.1, horizon=30, auto=True), lockstep=False, refill_at=3)
    assert unraised.level == WARN and unraised.message.startswith('chunking.refill_threshold 0.1 is too low')
    assert unraised.message.endswith('or more')
    assert real_time_verdict(0.2, config(auto=True), lockstep=False, refill_at=25) == real_time_verdict(
        0.2, config(), lockstep=False)
    assert real_time_verdict(1.43, config(auto=True), lockstep=False, refill_at=49).message.startswith(
        'too slow for real time')


def test_a_slow_chunk_raises_the_refill_while_in_its_window_and_the_verdict_follows_the_refill():
    """0.6 s needs 19 actions left at 30 Hz (threshold 0.1: 5); the refill keeps them for REFILL_WINDOW chunks."""
    scheduler = ChunkScheduler(config(0.1, auto=True))
    now, refills = 0.0, []
    for latency in [1.0, 0.6] + [0.1] * REFILL_WINDOW:              # start-up (until replaced), one slow, then fast
        request = scheduler.begin_request(now)
        now += latency
        scheduler.submit_chunk(request, np.zeros((50, 1)), now)
        refills.append(scheduler.refill_at)
    assert refills == [31] + [19] * REFILL_WINDOW + [5]
    assert real_time_verdict(0.6, config(0.1, auto=True), False, refill_at=19).level == OK
    verdict = real_time_verdict(0.6, config(0.1, auto=True), False, refill_at=refills[-1])      # p95 still 0.6 s
    assert verdict.level == WARN and verdict.message.endswith('set chunking.refill_threshold to 0.38 or more')


def test_a_latency_over_half_a_chunk_is_too_slow_whatever_the_threshold():
    assert longest_latency(30.0, 50) == 0.8
    for threshold in (0.0, 0.5, 1.0):
        verdict = real_time_verdict(1.43, config(threshold), lockstep=False)
        assert verdict.level == WARN and verdict.needed_threshold is None
        assert verdict.message.startswith('too slow for real time: chunks take 1430 ms (p95), and 50 actions at 30 Hz '
                                          'keep up with 800 ms at most')
    assert 'keep up with no latency' in real_time_verdict(0.01, config(horizon=2), lockstep=False).message


def test_nothing_timed_yet_and_lockstep_are_ok_without_a_figure():
    assert real_time_verdict(math.nan, config(0.0), lockstep=False).message == 'no chunk timed yet'
    verdict = real_time_verdict(5.0, config(0.0), lockstep=True)      # a chunk costs no simulated time
    assert verdict.level == OK and verdict.needed_threshold is None and 'lockstep' in verdict.message


@settings(max_examples=60, deadline=None)
@given(latency=st.floats(0.01, 1.6), spread=st.floats(0.0, 0.5), threshold=st.floats(0.0, 1.0),
       horizon=st.integers(2, 80), rate=st.sampled_from([10.0, 20.0, 30.0, 50.0]))
def test_an_ok_verdict_is_a_promise_the_scheduler_keeps(latency, spread, threshold, horizon, rate):
    """Whatever the settings, OK at a p95 means no starved tick at latencies up to it (the scheduler, simulated)."""
    verdict = real_time_verdict(latency, config(threshold, horizon, rate), lockstep=False)
    latencies = [latency * (1.0 - spread * i / 4) for i in range(5)]
    starved = simulate(latencies, rate, horizon, threshold, 20.0, seed=2)['starved_ticks']
    if verdict.level == OK:
        assert starved == 0, verdict.message
        assert threshold >= verdict.needed_threshold - 1e-9
    elif verdict.needed_threshold is None:                          # too slow: no threshold helps
        assert refill_threshold_for(latency, rate, horizon) is None
        # The rule keeps a tick of margin, and a request follows the tick's action: two periods more surely starve.
        assert simulate([latency + 2.0 / rate], rate, horizon, 1.0, 20.0)['starved_ticks'] > 0


@settings(max_examples=60, deadline=None)
@given(latency=st.floats(0.01, 1.6), spread=st.floats(0.0, 0.5), threshold=st.floats(0.0, 1.0),
       horizon=st.integers(2, 80), rate=st.sampled_from([10.0, 20.0, 30.0, 50.0]))
def test_with_the_refill_from_latency_any_threshold_keeps_up_where_one_could(latency, spread, threshold, horizon,
                                                                             rate):
    """
    Where some threshold keeps up, the refill from latency does whatever the threshold: at most one chunk starves.

    A steady chunk slower than every one before it can starve once; never more than without the refill.
    """
    latencies = [latency * (1.0 - spread * i / 4) for i in range(5)]
    starved = simulate(latencies, rate, horizon, threshold, 20.0, seed=2, refill_from_latency=True)['starved_ticks']
    if refill_threshold_for(latency, rate, horizon) is not None:          # some threshold keeps up with it
        assert starved <= 1 + math.ceil(latency * rate)
        assert starved <= simulate(latencies, rate, horizon, threshold, 20.0, seed=2)['starved_ticks']


@settings(max_examples=60, deadline=None)
@given(latency=st.floats(0.01, 1.6), threshold=st.floats(0.0, 1.0), horizon=st.integers(2, 80),
       rate=st.sampled_from([10.0, 20.0, 30.0, 50.0]))
def test_with_the_refill_from_latency_a_steady_latency_some_threshold_keeps_up_with_never_starves(
        latency, threshold, horizon, rate):
    """The first chunk's latency sets the refill until a steady one is measured: not a tick starves."""
    if refill_threshold_for(latency, rate, horizon) is not None:
        assert simulate([latency], rate, horizon, threshold, 20.0, refill_from_latency=True)['starved_ticks'] == 0
