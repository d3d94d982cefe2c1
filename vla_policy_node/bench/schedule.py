# SPDX-License-Identifier: Apache-2.0
"""
The node's chunk scheduler run on a simulated clock with a given chunk-latency distribution.

Used by ``benchmarks/closed_loop.py`` to feed LeRobot's measured chunk latencies (and ours) to
the scheduler the node runs (``control.chunking.ChunkScheduler``), tick by tick, without a
robot or a model: one request at a time, as in the node; a chunk computed from the observation
of tick ``k`` arrives ``latency`` seconds later, and the actions whose time passed are skipped.
``control.real_time.refill_threshold_for`` is the setting that rule implies for a latency
(``test/tools/test_schedule.py`` checks the two agree).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vla_policy_node.control.chunking import ChunkScheduler, SchedulerConfig


def simulate(latencies_s: Sequence[float], rate_hz: float, horizon: int, refill_threshold: float,
             duration_s: float, seed: int = 0, refill_from_latency: bool = False) -> dict:
    """
    Run ``duration_s`` of control ticks; each chunk's latency is drawn from ``latencies_s``.

    Returns the scheduler's counters (``starved_ticks``: ticks after the first chunk with no
    action to execute; ``waiting_ticks``: before it), the ticks, and the latencies drawn.
    """
    if not latencies_s or min(latencies_s) <= 0:
        raise ValueError("latencies_s must be a non-empty list of positive seconds")
    rng = np.random.default_rng(seed)
    scheduler = ChunkScheduler(SchedulerConfig(control_rate_hz=rate_hz, horizon=horizon,
                                               refill_threshold=refill_threshold,
                                               refill_from_latency=refill_from_latency))
    chunk = np.zeros((horizon, 1))
    pending, arrival, drawn = None, 0.0, []
    ticks = int(round(duration_s * rate_hz))
    for k in range(ticks):
        now = k / rate_hz
        if pending is not None and arrival <= now:
            scheduler.submit_chunk(pending, chunk, arrival)
            pending = None
        scheduler.take(now)
        if pending is None and scheduler.needs_chunk():
            pending = scheduler.begin_request(now)
            drawn.append(float(rng.choice(np.asarray(latencies_s))))
            arrival = now + drawn[-1]
    return {**scheduler.stats, "ticks": ticks, "latencies_s": drawn}
