# SPDX-License-Identifier: Apache-2.0
"""Property-based fuzz of everything that crosses the ROS boundary: images, joint states, instructions."""

import unicodedata

from hypothesis import given, HealthCheck, settings
from hypothesis import strategies as st
import numpy as np
from sensor_msgs.msg import Image

from vla_policy_node.control.observations import merge_joint_state
from vla_policy_node.ros.conversions import ConversionError, image_to_rgb, instruction_text

ENCODINGS = ['rgb8', 'bgr8', 'rgba8', 'bgra8', 'mono8', 'mono16', '16UC1', 'yuv422', 'bayer_rggb8',
             '32FC1', '', 'RGB8', 'rgb8\x00']
JOINTS = ['a', 'b', 'c', 'd']
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(encoding=st.sampled_from(ENCODINGS), height=st.integers(0, 40), width=st.integers(0, 40),
       step_pad=st.integers(-5, 8), length_delta=st.integers(-7, 7), is_bigendian=st.integers(0, 1))
def test_any_image_converts_or_is_refused(encoding, height, width, step_pad, length_delta, is_bigendian):
    # Encodings are matched case-insensitively ('RGB8' is rgb8); anything else must be refused.
    channels = {'rgb8': 3, 'bgr8': 3, 'rgba8': 4, 'bgra8': 4, 'mono8': 1}.get(encoding.lower(), 2)
    step = max(0, width * channels + step_pad)
    size = max(0, step * height + length_delta)
    msg = Image(height=height, width=width, encoding=encoding, step=step, is_bigendian=is_bigendian,
                data=bytes(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)))
    try:
        rgb = image_to_rgb(msg)
    except ConversionError as error:
        assert str(error)
        return
    assert encoding.lower() in ('rgb8', 'bgr8', 'rgba8', 'bgra8', 'mono8')
    assert rgb.dtype == np.uint8 and rgb.shape == (height, width, 3) and height > 0 and width > 0
    assert step >= width * channels and size == step * height


def test_bgr_and_mono_frames_map_to_rgb():
    bgr = Image(height=1, width=2, encoding='bgr8', step=6, data=bytes([1, 2, 3, 4, 5, 6]))
    np.testing.assert_array_equal(image_to_rgb(bgr)[0], [[3, 2, 1], [6, 5, 4]])
    mono = Image(height=1, width=2, encoding='mono8', step=2, data=bytes([7, 9]))
    np.testing.assert_array_equal(image_to_rgb(mono)[0], [[7, 7, 7], [9, 9, 9]])


names_strategy = st.lists(st.sampled_from(JOINTS + ['x', 'y', '']), max_size=8)
value_strategy = st.floats(allow_nan=True, allow_infinity=True, width=64)


@FAST
@given(names=names_strategy, values=st.lists(value_strategy, max_size=8))
def test_any_joint_state_merges_or_is_refused(names, values):
    current = np.array([0.5, -0.5, 1.0, 2.0])
    before = current.copy()
    try:
        update = merge_joint_state(names, values, JOINTS, current)
    except ValueError as error:
        assert str(error) and any(name in JOINTS for name in names), 'only our joints are checked'
        np.testing.assert_array_equal(current, before)       # nothing half-written
        return
    ours = [name for name in names if name in JOINTS]
    if not ours:                                              # another device's message
        assert not update.updated.any()
        np.testing.assert_array_equal(update.positions, before)
        return
    assert len(names) == len(values) and len(set(ours)) == len(ours)
    assert np.all(np.isfinite(update.positions))
    for name, value in zip(names, values):
        if name in JOINTS:
            assert update.positions[JOINTS.index(name)] == value
    for i, joint in enumerate(JOINTS):
        if joint not in names:
            assert update.positions[i] == before[i]
    assert set(update.unknown_joints) == set(names) - set(JOINTS)


@FAST
@given(text=st.text(max_size=300) | st.sampled_from(['', '   ', 'pick\x00up', 'pick \u202epu', 'a\u200db', 'a' * 5000,
                                                    '\ud800 lone', 'ok']))
def test_any_instruction_is_accepted_clean_or_refused(text):
    try:
        clean = instruction_text(text, 2000)
    except ConversionError as error:
        assert str(error)
        return
    assert clean and clean == clean.strip() and len(clean) <= 2000
    assert not any(ord(c) < 32 and c not in '\t\n' for c in clean)
    assert not any(unicodedata.category(c) == 'Cf' for c in clean), 'a format character (a bidi override) passed'


def test_megabyte_instruction_is_refused_quickly():
    try:
        instruction_text('x' * (4 * 2**20), 2000)
    except ConversionError as error:
        assert '2000' in str(error)
    else:
        raise AssertionError('a 4 MB instruction was accepted')


def test_upper_case_encoding_is_read_as_its_lower_case_name():
    upper = Image(height=1, width=1, encoding='RGB8', step=3, data=bytes([1, 2, 3]))
    np.testing.assert_array_equal(image_to_rgb(upper)[0], [[1, 2, 3]])
