# SPDX-License-Identifier: Apache-2.0
"""
ros/params_file.py: parameter files read as rcl reads them, and their values type-checked before rcl merges them.

The expected values follow rcl's rules for parameter files (its wildcard sections ``/**`` and
``*``, file order, later values winning) and the node's declared types in ros/param_specs.py.
"""

import pytest

from vla_policy_node.ros.params import ParameterError
from vla_policy_node.ros.params_file import check_override_sources, read_params_file

FILE = """
/**:
  ros__parameters:
    control_rate_hz: 20.0
    limits: {max_step: 0.1}
/arm/vla_policy_node:
  ros__parameters:
    control_rate_hz: 30.0
/other/node:
  ros__parameters:
    control_rate_hz: 99.0
/*/vla_policy_node:
  ros__parameters:
    camera_names: [front]
"""


def test_sections_match_as_rcl_matches_them_later_values_winning(tmp_path):
    path = tmp_path / 'params.yaml'
    path.write_text(FILE)
    values = read_params_file(str(path), '/arm/vla_policy_node')
    assert values == {'control_rate_hz': 30.0, 'limits.max_step': 0.1, 'camera_names': ['front']}
    assert read_params_file(str(path), '/vla_policy_node') == {'control_rate_hz': 20.0, 'limits.max_step': 0.1}


def test_an_unreadable_file_is_one_clear_error(tmp_path):
    path = tmp_path / 'broken.yaml'
    path.write_text('/**: {ros__parameters: [unclosed')
    with pytest.raises(ParameterError, match='cannot read parameter file .*broken.yaml'):
        read_params_file(str(path), '/vla_policy_node')
    with pytest.raises(ParameterError, match='cannot read parameter file'):
        read_params_file(str(tmp_path / 'missing.yaml'), '/vla_policy_node')


def test_a_value_of_the_wrong_type_in_a_later_file_is_refused_by_name(tmp_path):
    """Without the check rcl would keep the first file's 20.0 and never show the node the string."""
    first, second = tmp_path / 'a.yaml', tmp_path / 'b.yaml'
    first.write_text('/**:\n  ros__parameters:\n    control_rate_hz: 20.0\n')
    second.write_text('/**:\n  ros__parameters:\n    control_rate_hz: fast\n')
    check_override_sources(['--ros-args', '--params-file', str(first)], '/vla_policy_node')
    with pytest.raises(ParameterError, match=r"parameter 'control_rate_hz' .*b\.yaml gives"):
        check_override_sources(['--ros-args', '--params-file', str(first), '--params-file', str(second)],
                               '/vla_policy_node')
    with pytest.raises(ParameterError, match="parameter 'control_rate_hz'"):
        check_override_sources(['--ros-args', '-p', 'control_rate_hz:=fast'], '/vla_policy_node')
