# SPDX-License-Identifier: Apache-2.0
"""
The simulator's real-time physics on a thread of its own, paced by the monotonic clock (no ROS).

An rclpy timer at the physics rate costs the executor's wait-set work at every wake (~5% of a
core at 100 Hz), CPU the policy node beside the simulation needs; a thread that sleeps to its
next deadline costs none of it. It ticks every ``period`` on average (``Cadence``): after a
stall longer than a period it starts afresh from then instead of ticking in a burst, as the
tick integrates the time that passed itself.
"""

from __future__ import annotations

from collections.abc import Callable
import threading
import time

from vla_policy_node.ros.sim.lockstep import Cadence


class PacedThread:
    """
    Call ``tick`` every ``period`` s on a (non-daemon) thread from ``start`` until ``stop``.

    The first exception of ``tick`` ends the thread and goes to ``failed`` (called on the thread:
    the owner makes it visible). ``release`` runs on the thread as it ends, whatever the reason:
    what the ticks made that belongs to their thread (an OpenGL context is current in one thread).
    """

    def __init__(self, name: str, period: float, tick: Callable[[], None],
                 failed: Callable[[Exception], None], release: Callable[[], None] = lambda: None) -> None:
        self._cadence = Cadence(period, time.monotonic())       # restarted by start
        self._tick, self._failed, self._release = tick, failed, release
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name)

    def start(self) -> None:
        """Start ticking (the first tick at once)."""
        self._cadence = Cadence(self._cadence.period, time.monotonic())
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking and wait for the thread's end (a tick under way finishes first); no tick follows."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def alive(self) -> bool:
        """Tell whether the thread runs (started, not stopped, not failed)."""
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stopping.wait(max(0.0, self._cadence.next_due - time.monotonic())):
                if self._cadence.due(time.monotonic()):
                    self._tick()
        except Exception as error:              # noqa: B902 - any failure of a tick ends the run visibly
            self._failed(error)
        finally:
            self._release()
