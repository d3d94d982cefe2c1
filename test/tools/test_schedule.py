# SPDX-License-Identifier: Apache-2.0
"""The closed-loop benchmark's scheduler simulation and the refill setting it recommends for a latency."""

import math

import pytest
from hypothesis import given, settings, strategies as st

from vla_policy_node.bench.schedule import simulate
from vla_policy_node.control.real_time import refill_threshold_for

RATE, HORIZON = 30.0, 50


def test_a_fast_policy_never_starves_and_the_first_chunk_is_waited_for():
    r = simulate([0.3], RATE, HORIZON, 0.5, 10.0)
    assert r["ticks"] == 300 and r["starved_ticks"] == 0
    assert r["waiting_ticks"] == 9                       # 0.3 s at 30 Hz before the first chunk
    assert r["actions_taken"] + r["waiting_ticks"] == 300
    assert 0 < r["actions_skipped"] <= 9 * (r["chunks_received"] - 1)   # a later chunk arrives <= 9 ticks late


def test_a_chunk_latency_above_half_a_chunk_starves_whatever_the_threshold():
    # 1 s = 30 ticks: a new chunk brings 50 - 30 = 20 actions, 10 ticks short of the next one; the
    # chunk after a starved wait skips only the 20 executed, so every second chunk starves the robot
    assert refill_threshold_for(1.0, RATE, HORIZON) is None
    for threshold in (0.5, 0.8, 1.0):
        r = simulate([1.0], RATE, HORIZON, threshold, 60.0)
        cycles = r["chunks_received"] - 1
        assert 3 * cycles < r["starved_ticks"] < 10 * cycles      # about 5 a chunk


def test_a_threshold_below_the_latency_starves_and_the_recommended_one_does_not():
    assert simulate([0.7], RATE, HORIZON, 0.3, 30.0)["starved_ticks"] > 0      # 15 actions last 0.5 s < 0.7 s
    threshold = refill_threshold_for(0.7, RATE, HORIZON)
    assert threshold == 22 / 50
    assert simulate([0.7], RATE, HORIZON, threshold, 30.0)["starved_ticks"] == 0


@settings(max_examples=30, deadline=None)
@given(latency=st.floats(0.05, 0.8), jitter=st.floats(0.0, 0.2))
def test_the_recommended_threshold_keeps_the_robot_fed_up_to_its_latency(latency, jitter):
    """For latencies spread up to the one the threshold was chosen for, no tick after the first chunk starves."""
    threshold = refill_threshold_for(latency, RATE, HORIZON)
    if threshold is None:
        assert math.ceil(latency * RATE) + 1 > HORIZON / 2
        return
    spread = [latency * (1.0 - jitter * i / 4) for i in range(5)]
    r = simulate(spread, RATE, HORIZON, threshold, 20.0, seed=1)
    assert r["starved_ticks"] == 0 and r["chunks_received"] >= 1


def test_bad_latencies_are_one_clear_error():
    with pytest.raises(ValueError, match="positive seconds"):
        simulate([], RATE, HORIZON, 0.5, 1.0)
    with pytest.raises(ValueError, match="positive seconds"):
        simulate([0.2, 0.0], RATE, HORIZON, 0.5, 1.0)
