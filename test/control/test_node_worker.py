# SPDX-License-Identifier: Apache-2.0
"""
The inference thread with a scripted policy (no DDS, no torch): faults, deadline, resets.

The scripted policy raises, returns NaN, sleeps or blocks on request, and records the order
of its calls, so the tests see exactly what the node's worker does with each outcome.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from scripted_policy import CHUNK, JOINTS, ScriptedPolicy

from vla_policy_node.control.chunking import ChunkRequest
from vla_policy_node.control.inference import (FAULT_LATE, FAULT_NON_FINITE, FAULT_RAISED, InferenceResult,
                                               InferenceWorker)


class Harness:
    """A started worker whose results are collected in order."""

    def __init__(self, policy: ScriptedPolicy, deadline: float = 5.0) -> None:
        self.results: list[InferenceResult] = []
        self._done = threading.Condition()
        self.worker = InferenceWorker(policy, self._on_result, time.monotonic, deadline)
        self.worker.start()
        self._next = 0

    def _on_result(self, result: InferenceResult) -> None:
        with self._done:
            self.results.append(result)
            self._done.notify_all()

    def submit(self) -> ChunkRequest:
        request = ChunkRequest(self._next, 0, time.monotonic(), 0, None)
        self._next += 1
        assert self.worker.submit(request, {})
        return request

    def wait_results(self, count: int, timeout: float = 5.0) -> list[InferenceResult]:
        with self._done:
            assert self._done.wait_for(lambda: len(self.results) >= count, timeout)
            return list(self.results)


@pytest.fixture
def make():
    harnesses = []

    def build(script=(), deadline: float = 5.0):
        harness = Harness(ScriptedPolicy(script), deadline)
        harnesses.append(harness)
        return harness
    yield build
    for harness in harnesses:
        harness.worker.stop(timeout=2.0)


@pytest.mark.parametrize('step, fault, message', [
    ('raise', FAULT_RAISED, 'RuntimeError: scripted failure'),
    ('nan', FAULT_NON_FINITE, '1 of 48 actions are not finite'),
    (('sleep', 0.05), FAULT_LATE, 'more than policy_deadline = 0.010 s'),
])
def test_a_bad_step_is_a_fault_without_chunk_and_the_next_step_runs(
        make, step, fault, message):
    harness = make([step], deadline=0.01 if fault == FAULT_LATE else 5.0)
    harness.submit()
    bad = harness.wait_results(1)[0]
    assert bad.fault == fault and bad.chunk is None and message in bad.error
    assert not harness.worker.busy
    harness.worker.deadline = 5.0
    harness.submit()
    good = harness.wait_results(2)[1]
    assert good.fault is None and good.error == ''
    np.testing.assert_allclose(good.chunk, np.full((CHUNK, JOINTS), 0.02), rtol=1e-6)
    assert good.duration >= 0.0


def test_deadline_is_judged_on_the_policy_call_and_can_change(make):
    harness = make([('sleep', 0.05), ('sleep', 0.05)], deadline=0.01)
    harness.submit()
    assert harness.wait_results(1)[0].fault == FAULT_LATE
    harness.worker.deadline = 1.0
    harness.submit()
    assert harness.wait_results(2)[1].fault is None


def test_a_second_job_is_refused_while_one_runs(make):
    harness = make(['block'])
    harness.submit()
    policy = harness.worker._policy
    assert policy.started.wait(5.0)
    assert harness.worker.busy
    assert not harness.worker.submit(ChunkRequest(99, 0, 0.0, 0, None), {})
    policy.release.set()
    harness.wait_results(1)


def test_reset_during_inference_runs_between_steps_and_bursts_coalesce(make):
    harness = make(['block'])
    policy = harness.worker._policy
    harness.submit()
    assert policy.started.wait(5.0)
    for _ in range(20):
        harness.worker.request_reset()
    assert policy.calls == [('predict', 1)], 'reset must not run during a step'
    policy.release.set()
    first = harness.wait_results(1)[0]
    assert first.fault is None, 'the old step still returns: the scheduler discards it'
    deadline = time.monotonic() + 5.0
    while 'reset' not in policy.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    harness.submit()
    harness.wait_results(2)
    assert policy.calls == [('predict', 1), 'reset', ('predict', 2)]
    assert harness.worker.stats['counters']['cache_resets'] == 1


def test_stop_during_a_step_returns_within_its_timeout(make):
    harness = make(['block'])
    policy = harness.worker._policy
    harness.submit()
    assert policy.started.wait(5.0)
    start = time.monotonic()
    assert not harness.worker.stop(timeout=0.2)
    assert time.monotonic() - start < 1.0
    assert not harness.worker.submit(ChunkRequest(7, 0, 0.0, 0, None), {})
    policy.release.set()
    assert harness.worker.stop(timeout=2.0)


def test_alive_until_stopped(make):
    harness = make()
    assert harness.worker.alive
    assert harness.worker.stop(timeout=2.0)
    assert not harness.worker.alive
