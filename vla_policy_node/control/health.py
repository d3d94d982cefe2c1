# SPDX-License-Identifier: Apache-2.0
"""
Health levels, input health and policy fault tallies: what the control loop reports.

Levels are plain integers ordered by severity (``max`` of several is the worst); the ROS layer
maps them onto ``diagnostic_msgs/DiagnosticStatus`` levels, which use the same numbers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
import math

OK, WARN, ERROR = 0, 1, 2


@dataclass
class LimitedLog:
    """Logs at most once per ``period`` seconds of ``wall`` per key, so a bad stream cannot flood the log."""

    log: Callable[[str, str], None]         # (severity, text)
    wall: Callable[[], float]
    period: float
    _last: dict[str, float] = field(default_factory=dict)

    def __call__(self, key: str, severity: str, text: str) -> None:
        wall = self.wall()
        if wall - self._last.get(key, -math.inf) >= self.period:
            self._last[key] = wall
            self.log(severity, text)


@dataclass(frozen=True)
class InputHealth:
    """Health of one input stream (a camera, the joint states or the instruction)."""

    name: str
    level: int
    message: str
    age_s: float | None = None


@dataclass(frozen=True)
class FaultReport:
    """Policy faults of the last report period: count per kind and the newest message."""

    counts: Mapping[str, int]
    last: str = ''
    warn_only: frozenset[str] = frozenset()

    @property
    def level(self) -> int:
        """ERROR when the policy failed, WARN when it was only too slow, OK otherwise."""
        if any(count for kind, count in self.counts.items() if kind not in self.warn_only):
            return ERROR
        return WARN if any(self.counts.values()) else OK


class FaultTally:
    """
    Policy faults by kind: totals for the counters, and the recent ones for one report.

    Reports cover a sliding window (the diagnostics period), so every report says what went
    wrong since the previous one without anybody having to reset a counter, and a status
    taken for another purpose (the summary at exit) does not swallow a report.
    ``warn_only`` kinds (a slow policy) report at WARN, the others at ERROR.
    Not thread-safe: the control loop calls it under its lock.
    """

    def __init__(self, kinds: Sequence[str], warn_only: Sequence[str] = ()) -> None:
        self._kinds = tuple(kinds)
        self._warn_only = frozenset(warn_only)
        self.totals = dict.fromkeys(self._kinds, 0)
        self._recent: deque[tuple[float, str, str]] = deque(maxlen=1000)

    def add(self, kind: str, message: str, now: float) -> None:
        """Count one fault of ``kind`` seen at ``now`` (seconds)."""
        self.totals[kind] += 1
        self._recent.append((now, kind, message))

    def report(self, now: float, window: float) -> FaultReport:
        """Faults of the last ``window`` seconds before ``now``."""
        while self._recent and self._recent[0][0] < now - window:
            self._recent.popleft()
        counts = dict.fromkeys(self._kinds, 0)
        for _, kind, _ in self._recent:
            counts[kind] += 1
        last = self._recent[-1][2] if self._recent else ''
        return FaultReport(counts, last, self._warn_only)
