# SPDX-License-Identifier: Apache-2.0
"""
Whether the measured chunk latency keeps the robot fed at the configured refill timing.

With one request in flight, a chunk computed from the observation at tick ``k`` arrives
``n = latency * rate`` ticks later with its first ``n`` actions overdue: ``horizon - n`` are
left. Two conditions follow (``n`` plus one tick for the wait before a request and jitter): the
actions left at the request, ``refill_threshold * horizon``, must last ``n`` ticks, and so must
the ``horizon - n`` a new chunk brings, or the next request starts from too few. Past
``horizon / 2`` no threshold helps (at 30 Hz with 50-action chunks: above 0.8 s); only a faster
policy or a longer chunk does. With ``refill_from_latency`` the scheduler raises the threshold to
what its latest latencies need; the verdict judges the refill it uses now against the p95, which
a rare slow chunk past its window can still exceed. The node reports the verdict on
/diagnostics (``real time``);
``test/control/test_real_time.py`` holds it to the scheduler itself, run by ``bench.schedule``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from vla_policy_node.control.chunking import REFILL_MARGIN_TICKS, SchedulerConfig, refill_actions
from vla_policy_node.control.health import OK, WARN


def refill_threshold_for(latency_s: float, rate_hz: float, horizon: int) -> Optional[float]:
    """Return the smallest ``refill_threshold`` that keeps the robot fed at this chunk latency, or None (none does)."""
    needed = refill_actions(latency_s, rate_hz)
    return None if 2 * needed > horizon else needed / horizon


def longest_latency(rate_hz: float, horizon: int) -> float:
    """Return the longest chunk latency (s) some ``refill_threshold`` keeps up with (<= 0: none)."""
    return (horizon // 2 - REFILL_MARGIN_TICKS) / rate_hz


@dataclass(frozen=True)
class RealTimeVerdict:
    """What /diagnostics says: a level (control.health), one line, and the threshold the latency needs."""

    level: int
    message: str
    needed_threshold: Optional[float]       # None: no threshold keeps the robot fed (or nothing timed yet)


def real_time_verdict(latency_p95_s: float, config: SchedulerConfig, lockstep: bool,
                      refill_at: Optional[int] = None) -> RealTimeVerdict:
    """
    Judge the p95 chunk latency (s; NaN before the first chunk) against ``config``'s rate and horizon and the refill.

    ``refill_at``: the actions left at which the scheduler asks for the next chunk now
    (``ChunkScheduler.refill_at``, which ``refill_from_latency`` raises from the latest
    latencies); None: the threshold's. ``lockstep``: the node runs on a simulator's clock that
    waits for each chunk, so latency costs no simulated time and cannot starve the robot.
    """
    rate, horizon, threshold = config.control_rate_hz, config.horizon, config.refill_threshold
    if lockstep:
        return RealTimeVerdict(OK, "lockstep (use_sim_time): the simulation waits for each chunk", None)
    if not math.isfinite(latency_p95_s):
        return RealTimeVerdict(OK, "no chunk timed yet", None)
    needed = refill_threshold_for(latency_p95_s, rate, horizon)
    took = f"chunks take {latency_p95_s * 1e3:.0f} ms (p95)"
    if needed is None:
        limit = longest_latency(rate, horizon)
        reach = f"keep up with {limit * 1e3:.0f} ms at most" if limit > 0 else "keep up with no latency"
        return RealTimeVerdict(WARN, f"too slow for real time: {took}, and {horizon} actions at {rate:g} Hz {reach}: "
                               "the robot holds between chunks whatever chunking.refill_threshold; only a faster "
                               "policy or a longer chunk keeps it fed", None)
    fixed = math.floor(threshold * horizon)
    at = fixed if refill_at is None else refill_at
    setting = f"set chunking.refill_threshold to {_up(needed):.2f} or more"
    if at < refill_actions(latency_p95_s, rate):
        if at > fixed:
            return RealTimeVerdict(WARN, f"chunking.refill_from_latency asks with {at} actions left, too few: {took}, "
                                   f"the robot holds between chunks; {setting}", needed)
        return RealTimeVerdict(WARN, f"chunking.refill_threshold {threshold:g} is too low: {took}, the robot holds "
                               f"between chunks; {setting}" + ("" if config.refill_from_latency else
                                                               ", or chunking.refill_from_latency to true"), needed)
    if at > fixed:
        return RealTimeVerdict(OK, f"{took}: chunking.refill_from_latency raises chunking.refill_threshold "
                               f"{threshold:g} to {at / horizon:.2f}, which keeps the robot fed "
                               f"(it needs {_up(needed):.2f})", needed)
    return RealTimeVerdict(OK, f"{took}: chunking.refill_threshold {threshold:g} keeps the robot fed "
                           f"(it needs {_up(needed):.2f})", needed)


def _up(fraction: float) -> float:
    """Round up to two decimals: a threshold set to the figure shown must suffice."""
    return math.ceil(fraction * 100 - 1e-9) / 100
