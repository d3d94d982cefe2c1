# SPDX-License-Identifier: Apache-2.0
"""The real-time verdict on /diagnostics: whether the measured chunk latency keeps the robot fed at these settings."""

import math

from hypothesis import given, settings, strategies as st

from vla_policy_node.bench.schedule import simulate
from vla_policy_node.control.chunking import SchedulerConfig
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
    assert verdict.message.endswith('set it to 0.24 or more, or chunking.refill_from_latency true')  # not 0.23
    assert real_time_verdict(0.2, config(0.24, horizon=30), lockstep=False).level == OK


def test_with_the_refill_from_latency_a_low_threshold_is_raised_and_ok():
    verdict = real_time_verdict(0.2, config(0.1, horizon=30, auto=True), lockstep=False)
    assert verdict.level == OK and math.isclose(verdict.needed_threshold, 7 / 30)
    assert verdict.message == ('chunks take 200 ms (p95): chunking.refill_from_latency raises '
                               'chunking.refill_threshold 0.1 to 0.24, which keeps the robot fed')
    assert real_time_verdict(0.2, config(auto=True), lockstep=False) == real_time_verdict(0.2, config(),
                                                                                          lockstep=False)
    assert real_time_verdict(1.43, config(auto=True), lockstep=False).message.startswith('too slow for real time')


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
def test_with_the_refill_from_latency_ok_is_a_promise_whatever_the_threshold(latency, spread, threshold, horizon,
                                                                             rate):
    """
    OK with the refill from latency: whatever the threshold, ticks starve only for the second chunk, and fewer.

    The second chunk is asked for at the threshold (no steady latency measured yet); never more than without it.
    """
    verdict = real_time_verdict(latency, config(threshold, horizon, rate, auto=True), lockstep=False)
    latencies = [latency * (1.0 - spread * i / 4) for i in range(5)]
    starved = simulate(latencies, rate, horizon, threshold, 20.0, seed=2, refill_from_latency=True)['starved_ticks']
    if verdict.level == OK:
        assert starved <= 1 + math.ceil(latency * rate)
        assert starved <= simulate(latencies, rate, horizon, threshold, 20.0, seed=2)['starved_ticks']
