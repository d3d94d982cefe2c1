# SPDX-License-Identifier: Apache-2.0
"""
When a simulator in lockstep may take its next step, how fast it runs, and when a slower sensor is due (no ROS).

In lockstep the simulated robot steps one control period, publishes ``/clock`` and its
sensors, and waits for the policy node's answer for that tick (``~/tick_done``: the tick has
run and no chunk is being computed, ``ros/tick_answers.py``). A node that does not answer
within ``timeout`` seconds of wall-clock time (dead, stuck, or not using sim time) cannot
freeze the simulation: from then on it steps in real time, counting each step taken without
an answer, until the node answers the tick the simulator waits on again.
"""

from __future__ import annotations

from collections.abc import Callable
import math
import time

TIME_EPSILON = 1e-6             # s: stamps go through integer nanoseconds


class Lockstep:
    """The tick a simulator waits on, whether it was answered, and the wall-clock bound on the wait."""

    def __init__(self, timeout: float, wall: Callable[[], float] = time.monotonic) -> None:
        if not timeout > 0.0:
            raise ValueError(f'lockstep_timeout must be > 0 s, got {timeout}')
        self.timeout = timeout
        self._wall = wall
        self._awaited = -math.inf       # simulated time of the tick waited on
        self._answered = True
        self._since = wall()
        self.late = False               # the node missed the bound: stepping in real time
        self.unanswered = 0             # steps taken without the node's answer

    def stepped(self, sim_time: float) -> None:
        """Note a step to ``sim_time``: its tick is waited on from now."""
        if not self._answered:
            self.unanswered += 1
        self._awaited, self._answered, self._since = sim_time, False, self._wall()

    def answer(self, stamp: float) -> bool:
        """Take the node's answer for the tick at ``stamp``; True when it answers the awaited tick."""
        if stamp + TIME_EPSILON < self._awaited:
            return False
        self._answered = True
        self.late = False
        return True

    @property
    def answered(self) -> bool:
        """Tell whether the awaited tick was answered."""
        return self._answered

    def overdue(self) -> bool:
        """Tell whether the answer is later than ``timeout`` (from then on: real time until it comes)."""
        if self._answered:
            return False
        if self._wall() - self._since > self.timeout:
            self.late = True
        return self.late

    def wait_again(self) -> None:
        """Start a new episode's wait (for the node's reset, answered with ``answer(inf)``); nothing missed yet."""
        self._answered, self._since, self.unanswered, self.late = False, self._wall(), 0, False


class RealTimeFactor:
    """Simulated seconds per wall-clock second since ``start``."""

    def __init__(self, wall: Callable[[], float] = time.monotonic) -> None:
        self._wall = wall
        self._sim0 = 0.0
        self._wall0 = wall()

    def start(self, sim_time: float) -> None:
        """Measure from now and ``sim_time`` on."""
        self._sim0, self._wall0 = sim_time, self._wall()

    def factor(self, sim_time: float) -> float:
        """Return the factor up to ``sim_time`` (nan before any wall-clock time passed)."""
        wall = self._wall() - self._wall0
        return (sim_time - self._sim0) / wall if wall > 0.0 else math.nan


class Cadence:
    """
    When something periodic (a camera, the episode's tick) is next due, checked at a faster tick (physics).

    Due every ``period`` on average, however the ticks fall; after a stall longer than a
    period it starts afresh from then instead of catching up in a burst.
    """

    def __init__(self, period: float, start: float) -> None:
        if not period > 0.0:
            raise ValueError(f'a cadence needs a period > 0 s, got {period}')
        self.period = period
        self._due = start

    @property
    def next_due(self) -> float:
        """Return when it is next due."""
        return self._due

    def due(self, now: float) -> bool:
        """Tell whether it is due at ``now``; when it is, the next one is counted from its due time."""
        if now + TIME_EPSILON < self._due:
            return False
        late = now - self._due
        self._due = (self._due if late < self.period else now) + self.period
        return True

    def restart(self, now: float) -> None:
        """Count the next one from ``now`` (it just ran out of turn)."""
        self._due = now + self.period
