# SPDX-License-Identifier: Apache-2.0
"""Image, joint state, instruction and command conversions, without a running ROS graph."""

import ast
from pathlib import Path

import numpy as np
import pytest
from sensor_msgs.msg import Image

from vla_policy_node.ros import conversions
from vla_policy_node.ros.conversions import (action_to_float64_multiarray, chunk_to_joint_trajectory, ConversionError,
                                             image_to_rgb, instruction_text)
from vla_policy_node.control.observations import merge_joint_state

RGB = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)


def image(encoding: str, pixels: np.ndarray, padding: int = 0) -> Image:
    """Pack (H, W, C) pixels with ``padding`` extra bytes per row."""
    height, width = pixels.shape[:2]
    rows = pixels.reshape(height, -1)
    rows = np.concatenate([rows, np.full((height, padding), 255, np.uint8)], axis=1)
    return Image(height=height, width=width, encoding=encoding, step=rows.shape[1],
                 data=rows.tobytes())


@pytest.mark.parametrize('encoding, pixels', [
    ('rgb8', RGB),
    ('bgr8', RGB[:, :, ::-1]),
    ('rgba8', np.concatenate([RGB, np.full((2, 3, 1), 7, np.uint8)], axis=2)),
    ('bgra8', np.concatenate([RGB[:, :, ::-1], np.full((2, 3, 1), 7, np.uint8)], axis=2)),
])
@pytest.mark.parametrize('padding', [0, 5])
def test_color_encodings_become_rgb(encoding, pixels, padding):
    out = image_to_rgb(image(encoding, pixels, padding))
    assert out.dtype == np.uint8 and out.shape == (2, 3, 3)
    np.testing.assert_array_equal(out, RGB)
    assert out.flags.c_contiguous


def test_mono8_is_replicated():
    gray = np.arange(6, dtype=np.uint8).reshape(2, 3, 1)
    out = image_to_rgb(image('mono8', gray))
    np.testing.assert_array_equal(out, np.repeat(gray, 3, axis=2))


@pytest.mark.parametrize('change, message', [
    (dict(encoding='16UC1'),
     "unsupported image encoding '16UC1' (supported: rgb8, bgr8, rgba8, bgra8, mono8)"),
    (dict(height=0), 'image has no pixels (3x0)'),
    (dict(step=8), 'image step 8 is smaller than width * channels = 9 for rgb8'),
    (dict(data=bytes(17)), 'image data has 17 bytes, expected step * height = 18'),
    (dict(data=b''), 'image data has 0 bytes, expected step * height = 18'),
])
def test_bad_images_are_refused_with_a_reason(change, message):
    msg = image('rgb8', RGB)
    for key, value in change.items():
        setattr(msg, key, value)
    with pytest.raises(ConversionError) as error:
        image_to_rgb(msg)
    assert str(error.value) == message


def test_huge_image_is_refused_before_decoding():
    msg = Image(height=5000, width=5000, encoding='mono8', step=5000, data=b'')
    with pytest.raises(ConversionError, match='more than'):
        image_to_rgb(msg)


ORDER = ('a', 'b', 'c')


def test_partial_and_reordered_joint_states_merge_by_name():
    current = np.full(3, np.nan)
    first = merge_joint_state(['c', 'a'], [3.0, 1.0], ORDER, current)
    np.testing.assert_array_equal(first.positions[[0, 2]], [1.0, 3.0])
    assert [name for name, value in zip(ORDER, first.positions) if np.isnan(value)] == ['b']   # not given yet
    np.testing.assert_array_equal(first.updated, [True, False, True])
    second = merge_joint_state(['b', 'gripper_extra'], [2.0, 9.0], ORDER, first.positions)
    np.testing.assert_array_equal(second.positions, [1.0, 2.0, 3.0])
    assert second.unknown_joints == ('gripper_extra',)
    assert np.isnan(current).all(), 'the input vector must not be modified'


@pytest.mark.parametrize('names, positions, message', [
    (['a', 'b'], [1.0, float('nan')], "joint state position of 'b' is not finite (nan)"),
    (['a', 'b'], [1.0], 'joint state has 2 names but 1 positions'),
    (['a', 'a'], [1.0, 2.0], "joint state names are duplicated: ['a']"),
    (['b', 'x', 'b', 'a', 'a'], [1.0] * 5, "joint state names are duplicated: ['a', 'b']"),
])
def test_bad_joint_states_are_refused(names, positions, message):
    with pytest.raises(ValueError) as error:
        merge_joint_state(names, positions, ORDER, np.zeros(3))
    assert str(error.value) == message


def test_nan_of_an_unknown_joint_is_ignored():
    update = merge_joint_state(['a', 'other'], [1.0, float('nan')], ORDER, np.zeros(3))
    assert update.unknown_joints == ('other',)


@pytest.mark.parametrize('names, positions', [
    (['wheel_l', 'wheel_r'], [1.0]),
    (['', ' '], [1.0, 2.0]),
    (['x', 'x'], [1.0, 2.0]),
])
def test_a_malformed_message_naming_no_configured_joint_changes_nothing(names, positions):
    update = merge_joint_state(names, positions, ORDER, np.zeros(3))
    assert not update.updated.any() and update.unknown_joints == tuple(names)
    np.testing.assert_array_equal(update.positions, np.zeros(3))


@pytest.mark.parametrize('text, message', [
    ('', 'instruction is empty'),
    ('  \n ', 'instruction is empty'),
    ('x' * 11, 'instruction has 11 characters, more than max_instruction_length = 10'),
    ('go\x00now', "instruction contains control characters ['0x0']"),
    ('go \u202ewon', "instruction contains format characters ['U+202E']"),
    ('go\u200bnow', "instruction contains format characters ['U+200B']"),
])
def test_bad_instructions_are_refused(text, message):
    with pytest.raises(ConversionError) as error:
        instruction_text(text, max_length=10)
    assert str(error.value).startswith(message)


def test_instruction_is_stripped():
    assert instruction_text('  pick\tit up \n', max_length=100) == 'pick\tit up'


def test_chunk_becomes_timed_trajectory_points():
    actions = np.array([[0.0, 1.0], [0.5, 1.5], [1.0, 2.0]])
    msg = chunk_to_joint_trajectory(actions, ['j1', 'j2'], dt=0.05)
    assert msg.joint_names == ['j1', 'j2']
    assert [list(p.positions) for p in msg.points] == actions.tolist()
    times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in msg.points]
    np.testing.assert_allclose(times, [0.05, 0.1, 0.15])
    assert msg.header.stamp.sec == 0 and msg.header.stamp.nanosec == 0


@pytest.mark.parametrize('actions, message', [
    (np.zeros((2, 3)), 'expected actions of shape (T, 2), got (2, 3)'),
    (np.array([[0.0, np.nan]]), 'actions contain non-finite values'),
])
def test_bad_chunks_are_refused(actions, message):
    with pytest.raises(ConversionError) as error:
        chunk_to_joint_trajectory(actions, ['j1', 'j2'], dt=0.05)
    assert str(error.value) == message


def test_forward_command_message():
    msg = action_to_float64_multiarray(np.array([0.1, 0.2]))
    assert list(msg.data) == [0.1, 0.2]
    assert msg.layout.dim[0].size == 2
    with pytest.raises(ConversionError):
        action_to_float64_multiarray(np.array([np.inf]))


def test_conversions_do_not_import_torch():
    tree = ast.parse(Path(conversions.__file__).read_text())
    imported = {alias.name.split('.')[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split('.')[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert 'torch' not in imported


def test_an_instruction_is_read_from_the_wire_whole_or_refused():
    """The node reads the serialized bytes: rclpy's C conversion cuts a string at a NUL."""
    from rclpy.serialization import serialize_message
    from std_msgs.msg import String
    from vla_policy_node.ros.conversions import instruction_from_cdr

    assert instruction_from_cdr(serialize_message(String(data=' pick up ')), 100) == 'pick up'
    assert instruction_from_cdr(b'\x00\x00\x00\x00\x00\x00\x00\x05pick\x00', 100) == 'pick', 'big endian'
    for raw, said in [(b'\x00\x01\x00\x00\x08\x00\x00\x00pick\x00up\x00', 'a NUL character at byte 4'),
                      (b'\x00\x01\x00\x00\xff\x00\x00\x00pick\x00', 'declares 255 bytes but carries 5'),
                      (b'\x00\x01\x00\x00\x03\x00\x00\x00\xff\xfe\x00', 'not valid UTF-8'),
                      (b'\x12\x34\x00\x00\x01\x00\x00\x00\x00', 'not a serialized std_msgs/String'),
                      (b'\x00\x01', 'not a serialized std_msgs/String')]:
        with pytest.raises(ConversionError, match=said):
            instruction_from_cdr(raw, 100)
