# SPDX-License-Identifier: Apache-2.0
"""
Joint units: the map itself (round trip, refusals) and where it acts (around the inference).

The control loop must see ROS units only (its limits and step are in them) and the policy
training units only; the RTC prefix of committed actions must reach the policy converted too.
"""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st
from loop_harness import ScriptedInference
import numpy as np
import pytest

from vla_policy_node.control.chunking import SchedulerConfig
from vla_policy_node.control.loop import ControlLoop, LoopSettings
from vla_policy_node.control.joint_map import JointMap, joint_mapped, JointMappedInference
from vla_policy_node.control.safety import MotionLimits

DEGREES = 180.0 / math.pi
SO101 = JointMap([DEGREES] * 5 + [100.0 / 1.91986], [0.0] * 5 + [-0.17453])
JOINTS = ('shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll', 'gripper')

finite = st.integers(-10**9, 10**9).map(lambda v: v / 1e6)      # +-1000 at 1e-6 resolution
scales = st.floats(1e-3, 1e3).flatmap(lambda v: st.sampled_from([v, -v]))


@given(st.lists(st.tuples(finite, scales, finite), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
def test_round_trip_is_exact_to_the_last_bits(joints):
    ros, scale, offset = (np.array(column) for column in zip(*joints))
    joint_map = JointMap(scale, offset)
    back = joint_map.action_to_ros(joint_map.state_to_policy(ros))
    # Two roundings each way: within 4 units in the last place of the largest term.
    ulp = np.spacing(np.maximum(np.abs(ros), np.abs(offset)) + np.abs(ros - offset))
    assert np.all(np.abs(back - ros) <= 4 * ulp)


@given(st.lists(st.tuples(st.integers(-2**20, 2**20), st.integers(-8, 8), st.integers(-2**10, 2**10)),
                min_size=1, max_size=8))
def test_round_trip_is_bit_exact_for_power_of_two_scales(joints):
    ros = np.array([value / 64.0 for value, _, _ in joints])
    scale = np.array([2.0 ** power for _, power, _ in joints])
    offset = np.array([value / 16.0 for _, _, value in joints])
    joint_map = JointMap(scale, offset)
    np.testing.assert_array_equal(joint_map.action_to_ros(joint_map.state_to_policy(ros)), ros)


def test_so101_degrees_and_gripper_percent():
    ros = np.array([math.pi / 2, -math.pi / 4, 0.0, 1.0, -1.0, 1.74533])
    policy = SO101.state_to_policy(ros)
    np.testing.assert_allclose(policy[:5], [90.0, -45.0, 0.0, DEGREES, -DEGREES])
    assert policy[5] == pytest.approx(100.0, abs=1e-3)          # fully open
    assert SO101.state_to_policy(np.r_[np.zeros(5), -0.17453])[5] == pytest.approx(0.0)
    np.testing.assert_allclose(SO101.action_to_ros(policy), ros, rtol=0, atol=1e-15)


@pytest.mark.parametrize('scale, offset, message', [
    ([1.0] * 5, None, 'scale has 5 entries, expected one per joint (6)'),
    (None, [0.0] * 7, 'offset has 7 entries, expected one per joint (6)'),
    ([1.0] * 5 + [0.0], None, 'scale must not be 0 (joint indices [5])'),
    ([1.0] * 5 + [math.inf], None, 'scale and offset must be finite'),
])
def test_wrong_lengths_and_values_are_refused(scale, offset, message):
    with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')
                       .replace('[', r'\[').replace(']', r'\]')):
        JointMap.for_joints(6, scale, offset)


def test_identity_adds_no_wrapper():
    inference = ScriptedInference()
    assert joint_mapped(inference, JointMap.identity(3)) is inference
    assert isinstance(joint_mapped(inference, SO101), JointMappedInference)


RATE = 20.0
LIMITS = MotionLimits(np.full(6, -3.0), np.full(6, 3.0), np.full(6, 2.0), 0.1)


def mapped_loop(blend: str = 'latest'):
    inference = ScriptedInference()
    sent = []
    loop = ControlLoop(LoopSettings(JOINTS, ('front',), RATE, LIMITS),
                       SchedulerConfig(control_rate_hz=RATE, horizon=4, blend=blend),
                       joint_mapped(inference, SO101), lambda points, *_: sent.append(points.copy()))
    loop.on_instruction('pick up the cube')
    return loop, inference, sent


def test_the_policy_sees_training_units_and_the_loop_ros_units():
    loop, inference, sent = mapped_loop()
    state = np.array([0.1, -0.2, 0.3, 0.0, 0.5, 0.2])
    now = 10.0
    loop.on_image('front', np.zeros((4, 4, 3), np.uint8), now, None)
    loop.on_joint_state(JOINTS, state, now, None)
    loop.tick(now)
    observed = inference.observations[-1]['state']
    assert observed.dtype == np.float32
    np.testing.assert_allclose(observed, SO101.state_to_policy(state), rtol=1e-6)
    # The policy answers in degrees / percent: the state plus 2 degrees, the gripper at 50 %.
    chunk = np.tile(np.r_[SO101.state_to_policy(state)[:5] + 2.0, 50.0], (4, 1))
    inference.deliver(chunk, None, now + 0.01)
    loop.tick(now + 1 / RATE)
    command = sent[-1][0]
    target = SO101.action_to_ros(chunk[0])
    # ROS units: the 2 degrees arrive as 0.035 rad; the gripper step is clamped at 0.1 (ROS).
    np.testing.assert_allclose(command[:5], target[:5], atol=1e-12)
    assert command[5] == pytest.approx(state[5] + 0.1)
    assert target[5] == pytest.approx(-0.17453 + 0.5 * 1.91986)


@pytest.mark.parametrize('width', [1, 5, 7])
def test_a_chunk_of_another_width_is_refused_not_broadcast_over_the_joints(width):
    loop, inference, sent = mapped_loop()
    now = 10.0
    loop.on_image('front', np.zeros((4, 4, 3), np.uint8), now, None)
    loop.on_joint_state(JOINTS, np.zeros(6), now, None)
    loop.tick(now)
    inference.deliver(np.full((4, width), 20.0), None, now + 0.01)
    loop.tick(now + 1 / RATE)
    status = loop.status(now + 1 / RATE, 1.0)
    assert sent == [], 'nothing commanded from it'
    assert status.counters['rejected_chunks'] == 1 and 'policy output rejected' in status.state


def test_the_rtc_prefix_reaches_the_policy_in_training_units():
    loop, inference, sent = mapped_loop('rtc')
    state = np.full(6, 0.1)
    now = 10.0
    loop.on_image('front', np.zeros((4, 4, 3), np.uint8), now, None)
    loop.on_joint_state(JOINTS, state, now, None)
    loop.tick(now)
    chunk = np.tile(SO101.state_to_policy(state), (4, 1))
    inference.deliver(chunk, None, now + 0.01)
    for step in range(1, 4):        # execute until the next request carries committed actions
        t = now + step / RATE
        loop.on_image('front', np.zeros((4, 4, 3), np.uint8), t, None)
        loop.on_joint_state(JOINTS, state, t, None)
        loop.tick(t)
        if inference.pending is not None:
            break
    assert inference.pending is not None and inference.pending.rtc is not None
    np.testing.assert_allclose(inference.pending.rtc.prefix, chunk[:len(inference.pending.rtc.prefix)],
                               rtol=1e-12)
    assert not inference.pending.rtc.prefix.flags.writeable


def test_shipped_so101_config_maps_radians_to_lerobot_degrees_and_gripper_percent():
    from pathlib import Path

    from vla_policy_node.replay.bag_replay import settings_from_files
    config = Path(__file__).resolve().parents[2] / 'config'
    settings = settings_from_files([str(config / 'default.yaml'), str(config / 'so101.yaml')],
                                   ['allow_random_weights:=true'])
    joint_map, limits = settings.joint_map, settings.limits
    # LeRobot degrees: (ticks - middle) * 360 / 4095, with 4096 ticks per turn.
    quarter = joint_map.state_to_policy(np.r_[[math.pi / 2] * 5, limits.lower[5]])
    np.testing.assert_allclose(quarter[:5], 90.0 * 4096 / 4095, rtol=1e-6)
    assert quarter[5] == pytest.approx(0.0, abs=1e-3)                        # closed
    assert joint_map.state_to_policy(limits.upper)[5] == pytest.approx(100.0, abs=1e-3)   # open
    assert [group.name for group in settings.command_groups] == ['arm', 'gripper']
    assert settings.camera_transports == ('compressed', 'compressed')
