# SPDX-License-Identifier: Apache-2.0
"""Batched serving of several robots (server/batching.py, Policy.predict_action_chunks)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from vla_policy_node.server.batching import BatchConfig, BatchServer, ServedRequest
from vla_policy_node.control.chunking import RTCGuidance
from vla_policy_node.loading.load import build_tiny_policy

CAMERAS = ('observation.images.front', 'observation.images.wrist')
TASKS = ('pick up the red cube', 'open the top drawer and put the sponge inside', 'wave')


@pytest.fixture(scope='module')
def policy():
    return build_tiny_policy(camera_names=CAMERAS, chunk_size=16, num_steps=5)


def observations(count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{'images': {name: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for name in CAMERAS},
             'state': rng.normal(size=6).astype(np.float32), 'task': TASKS[i % len(TASKS)]}
            for i in range(count)]


@pytest.mark.parametrize('with_rtc', [False, True])
def test_batched_chunks_equal_per_robot_chunks(policy, with_rtc):
    obs = observations(3)
    rng = np.random.default_rng(1)
    noise = rng.normal(size=(3, policy.chunk_size, policy.model.max_action_dim)).astype(np.float32)
    rtcs = [None] * 3
    if with_rtc:   # no guidance, the paper's and LeRobot's, each with its own prefix and delay
        rtcs = [None, RTCGuidance(rng.normal(size=(5, 6)), 2, 10.0, 'paper'),
                RTCGuidance(rng.normal(size=(9, 6)), 3, 4.0, 'lerobot')]
    passes = policy.stats.prefix_passes
    batched = policy.predict_action_chunks(obs, rtcs, noise)
    assert policy.stats.prefix_passes == passes + 1
    assert batched.dtype == np.float32 and batched.shape == (3, policy.chunk_size, 6)
    for i in range(3):
        alone = policy.predict_action_chunk(obs[i], noise[i:i + 1], rtcs[i])[0]
        np.testing.assert_allclose(batched[i], alone, rtol=0, atol=1e-5)
    if with_rtc:
        plain = policy.predict_action_chunks(obs, [None] * 3, noise)
        assert not np.allclose(plain[1], batched[1], atol=1e-3), 'guidance must act'


def test_batch_of_different_cameras_is_refused_with_a_clear_error(policy):
    obs = observations(2)
    del obs[1]['images'][CAMERAS[1]]
    with pytest.raises(ValueError, match='same cameras'):
        policy.predict_action_chunks(obs, [None, None])


class Answers:
    def __init__(self, expected: int) -> None:
        self.items, self.expected, self.done = [], expected, threading.Event()

    def __call__(self, served) -> None:
        self.items.append(served)
        if len(self.items) >= self.expected:
            self.done.set()


def request(client: str, observation: dict, request_id: int = 0) -> ServedRequest:
    return ServedRequest(client, request_id, observation, None)


def test_requests_within_the_window_share_one_prefix_pass(policy):
    answers = Answers(4)
    server = BatchServer(policy, answers, BatchConfig(window=0.5, max_batch=4))
    server.start()
    passes = policy.stats.prefix_passes
    for i, obs in enumerate(observations(4)):
        server.submit(request(f'/robot{i}', obs, request_id=10 + i))
    assert answers.done.wait(30.0)
    assert server.stop(5.0)
    assert policy.stats.prefix_passes == passes + 1
    stats = server.stats
    assert stats['counters']['batches'] == 1 and stats['counters']['prefix_passes'] == 1
    assert stats['mean_batch_size'] == 4.0 and stats['max_batch_size'] == 4
    assert sorted(a.request.client for a in answers.items) == [f'/robot{i}' for i in range(4)]
    for answer in answers.items:
        assert answer.fault is None and answer.batch_size == 4
        assert answer.request.reply_to == 10 + int(answer.request.client[-1])
        assert answer.chunk.shape == (policy.chunk_size, 6) and answer.queue_wait >= 0


def test_a_newer_request_replaces_the_queued_one_of_the_same_robot(policy):
    answers = Answers(2)
    server = BatchServer(policy, answers, BatchConfig(window=0.5, max_batch=8))
    server.start()
    obs = observations(3)
    server.submit(request('/a', obs[0], 1))
    server.submit(request('/b', obs[1], 1))
    server.submit(request('/a', obs[2], 2))
    assert answers.done.wait(30.0)
    assert server.stop(5.0)
    assert sorted((a.request.client, a.request.reply_to) for a in answers.items) == [('/a', 2), ('/b', 1)]
    assert server.stats['counters']['superseded_requests'] == 1


def test_a_bad_observation_faults_only_its_own_robot(policy):
    answers = Answers(3)
    server = BatchServer(policy, answers, BatchConfig(window=0.5, max_batch=3))
    server.start()
    obs = observations(3)
    obs[1]['task'] = 7      # not a str: the preprocessor refuses it
    for i in range(3):
        server.submit(request(f'/r{i}', obs[i]))
    assert answers.done.wait(30.0)
    assert server.stop(5.0)
    faults = {a.request.client: a.fault for a in answers.items}
    assert faults == {'/r0': None, '/r1': 'raised', '/r2': None}
    assert server.stats['counters']['batch_faults'] == 1


def test_batch_config_refuses_bad_values():
    with pytest.raises(ValueError, match='window'):
        BatchConfig(window=-1.0)
    with pytest.raises(ValueError, match='max_batch'):
        BatchConfig(max_batch=0)
    with pytest.raises(ValueError, match='max_queued'):
        BatchConfig(max_batch=4, max_queued=3)


def test_robots_beyond_the_queue_bound_are_refused_at_once_and_a_waiting_robot_may_renew(policy):
    """A flood of robots cannot grow the queue: each one beyond the bound gets a fault answer."""
    answers = Answers(2)
    server = BatchServer(policy, answers, BatchConfig(window=0.5, max_batch=2, max_queued=2))
    obs = observations(1)[0]           # not started: requests stay queued
    for i in range(5):
        server.submit(request(f'/r{i}', obs, i))
    server.submit(request('/r0', obs, 9))                        # a queued robot renews its request
    assert [(a.request.client, a.fault) for a in answers.items] == [(f'/r{i}', 'raised') for i in (2, 3, 4)]
    assert 'server overloaded: 2 robots already wait' in answers.items[0].error
    counters = server.stats['counters']
    assert (counters['requests'], counters['refused_requests'], counters['superseded_requests']) == (6, 3, 1)
    answers.items.clear()
    answers.done.clear()                       # the refusals counted towards it: wait for two served
    server.start()
    assert answers.done.wait(30.0)
    assert server.stop(5.0)
    assert sorted((a.request.client, a.request.reply_to, a.fault) for a in answers.items) == [
        ('/r0', 9, None), ('/r1', 1, None)]


def test_an_answer_that_cannot_be_sent_does_not_stop_serving(policy):
    sent = []

    def flaky(served) -> None:
        if served.request.client == '/bad':
            raise RuntimeError('publisher gone')
        sent.append(served)
    server = BatchServer(policy, flaky, BatchConfig(window=0.2, max_batch=2))
    server.start()
    obs = observations(2)
    server.submit(request('/bad', obs[0]))
    server.submit(request('/good', obs[1]))
    deadline = time.monotonic() + 30.0
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    server.submit(request('/good', obs[1], 1))
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.alive and server.stop(5.0)
    assert [a.request.reply_to for a in sent] == [0, 1]
    assert server.stats['counters']['answer_errors'] == 1


class SlowPolicy:
    """Stands in for a policy whose batch takes ``seconds`` whatever its size: only timing matters here."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.batches = seconds, []
        self.stats = type('Stats', (), {'prefix_passes': 0})()

    def predict_action_chunks(self, observations, rtcs):
        self.batches.append(len(observations))
        self.stats.prefix_passes += 1
        time.sleep(self.seconds)
        return np.zeros((len(observations), 4, 6), np.float32)


def test_an_idle_server_answers_a_lone_request_without_waiting_a_window(policy):
    waits = {}
    for window in (0.0, 0.3):
        answers = Answers(1)
        server = BatchServer(policy, answers, BatchConfig(window=window))
        server.start()
        server.submit(request('/alone', observations(1)[0]))
        assert answers.done.wait(30.0) and server.stop(5.0)
        waits[window] = answers.items[0].queue_wait
    assert BatchConfig().window == 0.0, 'continuous batching is the default'
    assert waits[0.0] < 0.1 and waits[0.3] >= 0.29, waits


def test_robots_out_of_step_share_batches_while_the_server_is_busy():
    """Four robots asking every 100 ms at phases 25 ms apart; a batch takes 60 ms: they meet in batches."""
    slow = SlowPolicy(0.06)
    answers = Answers(10 ** 6)
    server = BatchServer(slow, answers, BatchConfig())
    server.start()
    start = time.monotonic()
    sends = sorted((start + phase * 0.025 + k * 0.1, f'/r{phase}', k) for phase in range(4) for k in range(12))
    for at, client, k in sends:
        time.sleep(max(0.0, at - time.monotonic()))
        server.submit(request(client, observations(1)[0], k))
    deadline = time.monotonic() + 10.0
    while len(answers.items) + server.stats['counters']['superseded_requests'] < len(sends) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.stop(5.0)
    assert max(slow.batches) >= 2 and np.mean(slow.batches) > 1.5, slow.batches
    assert all(a.fault is None for a in answers.items)
    assert {a.request.client for a in answers.items} == {f'/r{i}' for i in range(4)}


def test_a_request_older_than_its_deadline_is_dropped_unserved():
    """Its robot stopped waiting (it measures from sending): computing it would only cost the others."""
    slow = SlowPolicy(0.2)
    answers = Answers(2)
    server = BatchServer(slow, answers, BatchConfig(max_batch=1))
    server.start()
    obs = observations(1)[0]
    server.submit(ServedRequest('/first', 0, obs, None))
    time.sleep(0.05)                                          # /first runs for 0.2 s
    server.submit(ServedRequest('/impatient', 0, obs, None, deadline=0.1))
    server.submit(ServedRequest('/patient', 0, obs, None, deadline=5.0))
    assert answers.done.wait(10.0) and server.stop(5.0)
    assert [a.request.client for a in answers.items] == ['/first', '/patient']
    assert server.stats['counters']['expired_requests'] == 1 and slow.batches == [1, 1]


def test_a_request_that_could_not_be_answered_in_time_is_dropped_but_one_slow_batch_never_stops_serving():
    """Wait + one batch (the last one's time) past the deadline: dropped, unless nothing else is left."""
    slow = SlowPolicy(0.3)
    answers = Answers(3)
    server = BatchServer(slow, answers, BatchConfig(max_batch=1))
    obs = observations(1)[0]
    server.start()
    server.submit(ServedRequest('/first', 0, obs, None))
    time.sleep(0.05)                           # /first runs 0.3 s: later answers come >= 0.3 s after it
    server.submit(ServedRequest('/tight', 0, obs, None, deadline=0.4))     # waits 0.25 + 0.3 > 0.4
    server.submit(ServedRequest('/roomy', 0, obs, None, deadline=5.0))
    deadline = time.monotonic() + 10.0
    while len(answers.items) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [a.request.client for a in answers.items] == ['/first', '/roomy']
    assert server.stats['counters']['expired_requests'] == 1
    server.submit(ServedRequest('/lone', 0, obs, None, deadline=0.2))      # 0.3 s batches, 0.2 s deadline
    assert answers.done.wait(10.0) and server.stop(5.0)
    assert answers.items[-1].request.client == '/lone', 'served anyway: the estimate may be out of date'
