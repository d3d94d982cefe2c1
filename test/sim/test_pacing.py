# SPDX-License-Identifier: Apache-2.0
"""The simulator's real-time physics thread: its cadence, its clean stop and its failures (no ROS)."""

import threading
import time

from ros_harness import wait_until

from vla_policy_node.ros.sim.pacing import PacedThread

PERIOD = 0.01


class Recorder:
    """A tick that records when it started (monotonic), stalls or raises at the given ticks."""

    def __init__(self, stall: dict[int, float] | None = None, fail_at: int | None = None) -> None:
        self.starts: list[float] = []
        self.stall, self.fail_at = stall or {}, fail_at
        self.failures: list[Exception] = []
        self.released_on: list[int] = []

    def tick(self) -> None:
        self.starts.append(time.monotonic())
        if len(self.starts) == self.fail_at:
            raise ValueError('the physics diverged')
        time.sleep(self.stall.get(len(self.starts), 0.0))

    def thread(self) -> PacedThread:
        return PacedThread('test_physics', PERIOD, self.tick, self.failures.append,
                           release=lambda: self.released_on.append(threading.get_ident()))


def test_ticks_keep_the_period_and_none_follows_stop_which_joins_the_thread():
    recorder = Recorder()
    paced = recorder.thread()
    started = time.monotonic()
    paced.start()
    assert wait_until(lambda: len(recorder.starts) >= 30, 5.0)
    paced.stop()
    elapsed = time.monotonic() - started
    ticks = len(recorder.starts)
    assert not paced.alive
    assert ticks <= elapsed / PERIOD + 2                     # never faster than the cadence
    assert len(recorder.released_on) == 1 and recorder.released_on[0] != threading.get_ident()
    paced.stop()                                            # twice is fine
    assert len(recorder.starts) == ticks and not recorder.failures


def test_the_first_tick_comes_at_once_not_after_a_period():
    ticks = []
    paced = PacedThread('test_physics', 2.0, lambda: ticks.append(time.monotonic()), lambda error: None)
    started = time.monotonic()
    paced.start()
    assert wait_until(lambda: ticks, 1.0) and ticks[0] - started < 1.0
    paced.stop()


def test_after_a_stall_the_thread_ticks_once_then_keeps_the_period_instead_of_a_burst():
    recorder = Recorder(stall={5: 6 * PERIOD})               # six ticks' time in one tick
    paced = recorder.thread()
    paced.start()
    assert wait_until(lambda: len(recorder.starts) >= 12, 5.0)
    paced.stop()
    stalled = recorder.starts[5] - recorder.starts[4]
    assert 6 * PERIOD <= stalled < 12 * PERIOD               # the next tick right after the stalled one
    # Then a period before the next one, however late the stall ended: no tick made up in a burst.
    assert recorder.starts[6] - recorder.starts[5] >= PERIOD / 2


def test_stop_waits_for_the_tick_under_way_and_no_tick_follows():
    inside, finished = threading.Event(), threading.Event()
    ticks = []

    def slow_tick():
        ticks.append(time.monotonic())
        inside.set()
        time.sleep(0.1)
        finished.set()

    paced = PacedThread('test_physics', PERIOD, slow_tick, lambda error: None)
    paced.start()
    assert inside.wait(5.0)
    paced.stop()
    assert finished.is_set() and not paced.alive and len(ticks) == 1


def test_a_tick_that_raises_ends_the_thread_goes_to_failed_once_and_the_release_still_runs():
    recorder = Recorder(fail_at=3)
    paced = recorder.thread()
    paced.start()
    assert wait_until(lambda: not paced.alive, 5.0)
    assert len(recorder.starts) == 3
    assert [str(e) for e in recorder.failures] == ['the physics diverged']
    assert len(recorder.released_on) == 1
    paced.stop()                                            # the owner's destroy after the failure
