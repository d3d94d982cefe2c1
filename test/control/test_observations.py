# SPDX-License-Identifier: Apache-2.0
"""
The observation buffer against hostile and unlucky inputs (ROS-free).

Actions age from when their inputs were observed (a header stamp earlier than the arrival
counts); another device's joint states on the same topic are ignored, not a fault; a huge or
duplicated message is refused fast with a short reason; the worst stream is named first.
"""

from __future__ import annotations

import time

from hypothesis import given, HealthCheck, settings
from hypothesis import strategies as st
from loop_harness import ScriptedInference
import numpy as np
import pytest

from vla_policy_node.control.chunking import SchedulerConfig
from vla_policy_node.control.loop import ControlLoop, LoopSettings
from vla_policy_node.control.health import ERROR
from vla_policy_node.control.observations import (JOINT_STATES, MAX_JOINT_STATE_NAMES, merge_joint_state, newly_unknown,
                                                  ObservationBuffer, preview, unknown_joints_line)
from vla_policy_node.control.safety import MotionLimits

JOINTS = ('shoulder', 'elbow', 'gripper')
RATE = 20.0
DT = 1.0 / RATE
FRAME = np.zeros((4, 4, 3), np.uint8)
LIMITS = MotionLimits(np.full(3, -3.0), np.full(3, 3.0), np.full(3, 2.0), 0.1)
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_loop(horizon: int = 4, **overrides):
    """Return (loop, inference, sent) with the instruction given."""
    sent: list[tuple[np.ndarray, np.ndarray | None]] = []
    inference = ScriptedInference()
    loop = ControlLoop(LoopSettings(JOINTS, ('front',), RATE, LIMITS, **overrides),
                       SchedulerConfig(control_rate_hz=RATE, horizon=horizon), inference,
                       lambda points, times, joints: sent.append((points.copy(), times)),
                       wall_clock=lambda: 0.0)
    loop.on_instruction('pick')
    return loop, inference, sent


# ------------------------------------------------------------------ observation time
def test_an_input_is_observed_at_the_earlier_of_arrival_and_header_stamp():
    buffer = ObservationBuffer(['front'], JOINTS)
    assert buffer.set_image('front', FRAME, 100.0, 99.55, 0.5) is None
    assert buffer.set_joint_state(JOINTS, [0.0] * 3, 100.0, 99.8, 0.5) == (None, ())
    assert buffer.oldest_input() == 99.55
    assert buffer.set_image('front', FRAME, 100.1, 100.3, 0.5) is None    # clock ahead: arrival
    assert buffer.oldest_input() == 99.8
    assert buffer.set_joint_state(JOINTS[:1], [0.0], 100.2, None, 0.5) == (None, ())
    assert buffer.oldest_input() == 99.8, 'elbow and gripper are still those stamped 99.8'
    assert 'late' in buffer.set_image('front', FRAME, 100.3, 99.0, 0.5)  # refused: time unchanged
    assert buffer.oldest_input() == 99.8


stamp_offsets = st.none() | st.floats(-0.8, 0.8, allow_nan=False)
inputs = st.lists(st.tuples(st.sampled_from(['front', 'wrist', 'joints']),
                            st.lists(st.booleans(), min_size=3, max_size=3),
                            st.floats(0.0, 0.3), stamp_offsets), min_size=1, max_size=30)


@FAST
@given(inputs=inputs)
def test_the_observation_time_is_never_later_than_any_accepted_stamp_or_arrival(inputs):
    """Whatever the mix of stamps (missing, early, late, ahead), model the newest accepted ones."""
    buffer = ObservationBuffer(['front', 'wrist'], JOINTS)
    now, kept = 100.0, {}
    for stream, named, step, offset in inputs:
        now += step
        stamp = None if offset is None else now + offset
        if stream == 'joints':
            names = [joint for joint, given_ in zip(JOINTS, named) if given_]
            problem, _ = buffer.set_joint_state(names, [0.0] * len(names), now, stamp, 0.5)
            accepted = names if problem is None else []
        else:
            accepted = [stream] if buffer.set_image(stream, FRAME, now, stamp, 0.5) is None else []
        for key in accepted:
            kept[key] = (now, stamp)
    if len(kept) < 5:
        return                      # no complete observation yet
    oldest = buffer.oldest_input()
    for arrival, stamp in kept.values():
        assert oldest <= arrival and (stamp is None or oldest <= stamp)
    assert oldest == min(arrival if stamp is None else min(arrival, stamp) for arrival, stamp in kept.values())


def test_no_action_is_commanded_later_than_max_action_age_after_its_frame_was_captured():
    """A frame stamped 0.4 s before it arrived leaves its actions 0.1 s, not 0.5 s (point reached a period on)."""
    loop, inference, sent = make_loop(horizon=20, max_observation_age=0.5, max_action_age=0.5,
                                      use_header_stamps=True)
    now, captured = 100.0, 99.6
    loop.on_image('front', FRAME, now, captured)
    loop.on_joint_state(JOINTS, [0.0] * 3, now, captured)
    loop.tick(now)
    assert inference.pending.observed_at == captured
    inference.deliver(np.zeros((20, 3)), None, now + 0.01)
    due = []
    for _ in range(12):
        now += DT
        loop.on_image('front', FRAME, now, now)
        loop.on_joint_state(JOINTS, [0.0] * 3, now, now)
        inference.pending = None            # no further chunk is answered
        before = len(sent)
        loop.tick(now)
        if len(sent) > before and sent[-1][1] is not None:
            due.append(now)
    assert due and all(t + DT - captured <= 0.5 + 1e-9 for t in due), due


def test_inputs_are_stale_by_their_header_stamp_not_only_by_their_arrival():
    """Stamped 0.45 s before arrival: stale 0.05 s after it, not 0.5 s (segment starts, checks, health)."""
    from vla_policy_node.control.observations import ObservationBuffer

    buffer = ObservationBuffer(('front',), JOINTS)
    buffer.set_instruction('pick')
    buffer.set_image('front', FRAME, 100.0, 99.55, max_age=0.5)
    assert buffer.set_joint_state(JOINTS, [0.1, 0.2, 0.3], 100.0, 99.55, max_age=0.5)[0] is None
    assert buffer.fresh_positions(100.04, 0.5) is not None and buffer.problem(100.04, 0.5) is None
    assert buffer.fresh_positions(100.06, 0.5) is None
    problem = buffer.problem(100.06, 0.5)
    assert 'front: stale' in problem and 'joint_states' in problem, problem


# ------------------------------------------------------------------ other devices' messages
@pytest.mark.parametrize('names, positions', [
    (['wheel_l', 'wheel_r'], [0.0]),              # names and positions disagree
    (['wheel', 'wheel'], [0.0, 1.0]),             # a duplicated name
    (['', 'wheel'], [0.0, 1.0]),                  # an empty name
    (['wheel'], [float('nan')]),
])
@pytest.mark.parametrize('wheels_first', [True, False])
def test_a_malformed_message_naming_none_of_the_joints_is_ignored_and_counted(names, positions, wheels_first):
    loop, inference, _ = make_loop()
    now = 100.0
    for _ in range(10):
        loop.on_image('front', FRAME, now, None)
        if wheels_first:
            loop.on_joint_state(names, positions, now, None)
        loop.on_joint_state(JOINTS, [0.0] * 3, now, None)
        if not wheels_first:
            loop.on_joint_state(names, positions, now, None)
        loop.tick(now)
        if inference.pending is not None:
            inference.deliver(np.zeros((4, 3)), None, now + 0.005)
        now += DT
    status = loop.status(now, 1.0)
    assert status.state == 'commanding' and status.counters['commands_published'] >= 8
    assert status.counters['rejected_inputs'] == 0

    buffer = ObservationBuffer(['front'], JOINTS)
    assert buffer.set_joint_state(names, positions, 1.0) == (None, tuple(names))
    assert buffer.counters == {'joint_states_without_configured_joints': 1}
    assert np.isnan(buffer.positions).all()


@pytest.mark.parametrize('names, positions, reason', [
    (['shoulder', 'wheel'], [0.0], 'joint state has 2 names but 1 positions'),
    (['shoulder', 'elbow'], [0.0, float('nan')], "joint state position of 'elbow' is not finite (nan)"),
    (['elbow', 'wheel', 'elbow'], [0.0, 0.0, 1.0], "joint state names are duplicated: ['elbow']"),
])
def test_a_malformed_message_naming_a_joint_still_faults_the_stream(names, positions, reason):
    loop, _, _ = make_loop()
    loop.on_joint_state(JOINTS, [0.0] * 3, 100.0, None)
    loop.on_joint_state(names, positions, 100.0, None)
    health = {h.name: h for h in loop.status(100.0, 1.0).inputs}[JOINT_STATES]
    assert (health.level, health.message) == (ERROR, reason)


def test_entries_of_other_devices_in_a_message_naming_joints_are_not_checked():
    update = merge_joint_state(['shoulder', '', 'wheel', 'wheel'], [1.0, 2.0, float('nan'), 3.0],
                               JOINTS, np.zeros(3))
    np.testing.assert_array_equal(update.positions, [1.0, 0.0, 0.0])
    assert update.unknown_joints == ('', 'wheel', 'wheel')


# ------------------------------------------------------------------ hostile messages
def test_duplicate_detection_is_linear_and_the_reason_short():
    names = ['shoulder'] + [f'j{i}' for i in range(MAX_JOINT_STATE_NAMES - 2)] + ['shoulder']
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"duplicated: \['shoulder'\]"):
        merge_joint_state(names, [0.0] * len(names), JOINTS, np.zeros(3))
    assert time.perf_counter() - start < 0.1            # quadratic: about 0.25 s at this size


def test_a_message_with_too_many_names_is_refused_unread():
    names = ['x' * 1000 + str(i) for i in range(MAX_JOINT_STATE_NAMES + 1)] + ['shoulder']
    start = time.perf_counter()
    with pytest.raises(ValueError) as error:
        merge_joint_state(names, [0.0] * len(names), JOINTS, np.zeros(3))
    assert time.perf_counter() - start < 0.05
    assert str(error.value) == (f'joint state has {len(names)} names, more than {MAX_JOINT_STATE_NAMES}: '
                                'refused unread')


@FAST
@given(names=st.lists(st.text(max_size=3000), max_size=60), ours=st.integers(0, 2),
       extra=st.integers(-1, 1), value=st.sampled_from([0.0, float('nan')]))
def test_any_fault_text_is_short_whatever_the_names(names, ours, extra, value):
    names = names + ['shoulder'] * ours
    loop, _, _ = make_loop()
    loop.on_joint_state(names, [value] * max(0, len(names) + extra), 100.0, None)
    loop.tick(100.0)
    status = loop.status(100.0, 1.0)
    assert all(len(h.message) < 400 for h in status.inputs)
    assert len(status.state) < 600


def test_preview_bounds_the_count_and_the_width_of_names():
    assert preview(['a', 'b']) == "['a', 'b']"
    text = preview(['x' * 10_000] * 5_000)
    assert len(text) < 8 * 80 + 40 and text.endswith(', ... 4992 more]')


def test_unknown_names_are_reported_once_and_remembered_up_to_a_bound():
    reported: set[str] = set()
    assert newly_unknown(('wheel_r', 'wheel_l'), reported) == ['wheel_l', 'wheel_r']
    assert newly_unknown(('wheel_l',), reported) == []
    assert len(newly_unknown(tuple(f'junk{i}' + 'y' * 5000 for i in range(1000)), reported, 100)) == 98
    assert len(reported) == 100 and max(map(len, reported)) <= 64
    assert newly_unknown(('more',), reported, 100) == []


def test_the_unknown_joints_line_names_the_new_ones_once_and_says_when_it_stops():
    reported: set[str] = set()
    line = unknown_joints_line(('wheel_r', 'wheel_l'), reported)
    assert line == "ignoring joints not in joint_names: ['wheel_l', 'wheel_r']"
    assert unknown_joints_line(('wheel_l',), reported) is None
    line = unknown_joints_line(tuple(f'junk{i:03d}' for i in range(200)), reported)
    assert line.endswith(', ... 90 more] (no further names are reported)') and len(reported) == 100
    assert unknown_joints_line(('more',), reported) is None


# ------------------------------------------------------------------ several faults
def test_the_worst_stream_is_named_first_and_the_others_counted():
    buffer = ObservationBuffer(['front', 'wrist'], JOINTS)
    buffer.set_instruction('pick')
    buffer.set_image('front', FRAME, 100.0)
    buffer.set_image('wrist', FRAME, 100.5)
    buffer.set_joint_state(JOINTS, [0.0] * 3, 100.5)
    assert buffer.problem(100.6, 0.5) == 'front: stale: last image 0.600 s ago'
    buffer.reject(JOINT_STATES, "joint state position of 'elbow' is not finite (nan)")
    assert buffer.problem(100.6, 0.5) == ("joint_states: joint state position of 'elbow' is not finite (nan) "
                                          '(also unhealthy: front)')
    assert buffer.problem(101.2, 0.5).endswith('(also unhealthy: front, wrist)')
