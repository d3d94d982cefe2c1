# SPDX-License-Identifier: Apache-2.0
"""The fleet benchmark's robot model and projection (benchmarks/fleet.py), on a short run."""

from __future__ import annotations

import pytest

from benchmarks.fleet import BatchCosts, projection, Robot, run_fleet


def test_costs_interpolate_eager_and_pay_the_bucket_when_padded():
    measured = {1: 0.010, 4: 0.040, 8: 0.050}
    assert BatchCosts(measured, padded=False)(2) == pytest.approx(0.020)
    assert BatchCosts(measured, padded=True)(5) == pytest.approx(0.050)


def test_projection_takes_the_batch_that_carries_most_robots_within_the_deadline():
    costs = {1: 0.01, 8: 0.04, 64: 0.4}         # 64 rows: 2 x 0.4 s is past a 0.5 s deadline
    best = projection(costs, demand=1.0, deadline=0.5)
    assert (best['batch'], best['robots']) == (8, pytest.approx(200.0))


def test_a_robot_starves_only_when_its_chunk_runs_out_and_skips_what_the_round_trip_took():
    asked = []
    robot = Robot('/r', rate=10.0, horizon=10, refill=5, deadline=1.0)
    robot.tick(0.0, asked.append)
    assert asked == [robot] and robot.request_id == 1 and robot.ticks == 0, 'no starving before a first chunk'
    robot.inbox.append((1, 0.3))
    robot.tick(0.3, asked.append)
    assert robot.started and robot.left == 10 - 3 - 1 and robot.round_trips == [pytest.approx(0.3)]
    robot.inbox.append((7, 0.4))                          # an answer to nothing in flight: ignored
    for k in range(8):
        robot.tick(0.4 + 0.1 * k, asked.append)
    assert len(asked) == 2 and robot.starved == 2 and robot.wasted == 1, (robot.left, robot.starved)


def test_two_servers_share_an_out_of_step_fleet_and_serve_every_robot():
    result = run_fleet(robots=6, servers=2, costs=BatchCosts({1: 0.02, 8: 0.04}, padded=False), window=0.0,
                       seconds=2.0, rates=(15.0, 30.0), horizon=20, refill=0.5, deadline=0.5, max_batch=8,
                       seed=1)
    assert result['servers'] == 2 and result['batches'] > 0 and result['mean_batch'] >= 1.0
    assert result['starved_mean_pct'] == 0.0 and result['wasted'] == 0
    assert result['useful_per_s'] > 0.5 * result['demand_per_s']
