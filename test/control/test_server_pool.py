# SPDX-License-Identifier: Apache-2.0
"""Which server a robot asks (server/pool.py): liveness from heartbeats, rendezvous hashing."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st
import pytest

from vla_policy_node.server.pool import rendezvous, ServerPool

NAMES = st.text(alphabet='abcdefgh/_0123456789', min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(robots=st.lists(NAMES, min_size=1, max_size=30, unique=True),
       servers=st.lists(NAMES, min_size=2, max_size=6, unique=True), data=st.data())
def test_a_lost_server_moves_only_its_own_robots_and_they_come_back(robots, servers, data):
    lost = data.draw(st.sampled_from(servers))
    before = {robot: rendezvous(robot, servers) for robot in robots}
    after = {robot: rendezvous(robot, [s for s in servers if s != lost]) for robot in robots}
    for robot in robots:
        assert after[robot] != lost
        if before[robot] != lost:
            assert after[robot] == before[robot], 'a robot of a live server moved'
    assert {robot: rendezvous(robot, list(reversed(servers))) for robot in robots} == before, \
        'the choice must not depend on the order servers are listed in'


def test_rendezvous_splits_a_fleet_evenly_and_never_picks_from_nothing():
    servers = ['/gpu0/vla_policy_server', '/gpu1/vla_policy_server', '/gpu2/vla_policy_server']
    counts = Counter(rendezvous(f'/robot{i}/vla_policy_node', servers) for i in range(3000))
    assert set(counts) == set(servers) and min(counts.values()) > 900, counts
    assert rendezvous('/robot', []) is None


def test_a_server_is_live_until_its_heartbeats_stop_for_the_timeout():
    pool = ServerPool(('/a', '/b'), timeout=0.5)
    assert not pool.is_live('/a', 0.0) and pool.silence('/a', 0.0) is None
    assert pool.heartbeat('/a', 'run1', 1.0) is True, 'first seen'
    assert pool.heartbeat('/a', 'run1', 1.1) is False
    assert pool.heartbeat('/unknown', 'x', 1.1) is False and not pool.is_live('/b', 1.1)
    assert pool.expire(1.6) == [] and pool.is_live('/a', 1.6)
    assert pool.expire(1.61) == ['/a'] and pool.expire(1.7) == [], 'lost once, reported once'
    assert not pool.is_live('/a', 1.61) and pool.silence('/a', 1.7) == pytest.approx(0.6)
    assert pool.heartbeat('/a', 'run1', 2.0) is True, 'back after a loss'
    assert pool.heartbeat('/a', 'run2', 2.1) is True, 'a restarted server is found again'
    assert pool.instance('/a') == 'run2' and pool.is_live('/a', 2.1)


def test_a_pool_needs_distinct_servers_and_a_positive_timeout():
    with pytest.raises(ValueError, match='distinct'):
        ServerPool(('/a', '/a'), 0.5)
    with pytest.raises(ValueError, match='distinct'):
        ServerPool((), 0.5)
    with pytest.raises(ValueError, match='timeout'):
        ServerPool(('/a',), 0.0)
