# SPDX-License-Identifier: Apache-2.0
"""
vla-policy-record refuses bad arguments before anything runs: one line, exit 1 (2 for usage), no bag, no DDS.

Each of these once ended in a traceback, was ignored, or recorded forever.
"""

from __future__ import annotations

import pytest
import rclpy
from ros_harness import DEFAULT_CONFIG

from vla_policy_node.replay.record import main

CASES = {
    'a bag under /proc': (['/proc/vla_bag'], 1, 'cannot make the bag /proc/vla_bag'),
    'a bag in a missing folder': (['/nonexistent/vla_bag'], 1, 'cannot make the bag'),
    'a bag that exists': (['{tmp}'], 1, 'it exists: name a new folder'),
    '--duration inf': (['{bag}', '--duration', 'inf'], 2, 'must be finite seconds'),
    '--duration 1e20': (['{bag}', '--duration', '1e20'], 2, 'must be finite seconds'),
    '--duration nan': (['{bag}', '--duration', 'nan'], 2, 'must be finite seconds'),
    '--duration -5': (['{bag}', '--duration', '-5'], 2, 'must be finite seconds'),
    '--duration ten': (['{bag}', '--duration', 'ten'], 2, 'is not a number of seconds'),
    '-p camera_topics:=[1,2]': (['{bag}', '-p', 'camera_topics:=[1,2]'], 1,
                                "parameter 'camera_topics' must be a string array, not [1, 2]"),
    '-p with broken YAML': (['{bag}', '-p', 'joint_names:=[a'], 1, 'not a YAML value'),
    '-p without :=': (['{bag}', '-p', 'joint_names'], 1, 'write name:=value'),
    'a missing parameter file': (['{bag}', '--params-file', '/nonexistent.yaml'], 1, 'cannot read parameter file'),
    '--ros-args -r foo': (['{bag}', '--ros-args', '-r', 'foo'], 2, "bad --ros-args: Failed to parse ROS arguments"),
    '--ros-args --bogus': (['{bag}', '--ros-args', '--bogus'], 2, "bad --ros-args: ['--bogus']"),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_a_bad_argument_ends_in_one_line_before_anything_runs(case, tmp_path, capsys):
    arguments, code, message = CASES[case]
    bag = tmp_path / 'bag'
    argv = [a.format(tmp=tmp_path, bag=bag) for a in arguments[:1]] + ['--params-file', str(DEFAULT_CONFIG)] + [
        a.format(tmp=tmp_path, bag=bag) for a in arguments[1:]]
    try:
        result = main(argv)
    except SystemExit as usage:
        result = usage.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith('vla-policy-record:')]
    assert result == code and len(lines) == 1 and message in lines[0] and 'Traceback' not in err, err
    assert not bag.exists() and not rclpy.ok()
