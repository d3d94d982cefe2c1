# SPDX-License-Identifier: Apache-2.0
"""
Parameter validation: bad values are refused with a reason, at start-up and at run time.

Most cases run in-process against ``settings_from_values`` / ``declare_parameters``; a few
start the installed node with a bad parameter file and check the exit code and the exact
message (as joy_teleop's test_parameter_failures does).
"""

from pathlib import Path
import re

import numpy as np
import pytest
import rclpy
from rclpy.parameter import Parameter
from ros_harness import DEFAULT_CONFIG, next_domain_id, NodeProcess, RANDOM_WEIGHTS_ARGS
import yaml

from vla_policy_node.ros.param_specs import ParameterError, PARAMETERS
from vla_policy_node.ros.params import declare_parameters, settings_from_values

pytestmark = pytest.mark.dds
DEFAULTS = yaml.safe_load(DEFAULT_CONFIG.read_text())['/**']['ros__parameters']


def flatten(tree: dict, prefix: str = '') -> dict:
    """Nested YAML parameters -> dotted ROS parameter names."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f'{prefix}{key}.'))
        else:
            flat[f'{prefix}{key}'] = value
    return flat


# default.yaml with the tiny random model allowed, as the tests run it.
VALUES = {**flatten(DEFAULTS), 'allow_random_weights': True}


def test_default_yaml_declares_every_parameter_and_nothing_else():
    """Optional parameters (no default: absent means unused) are there as comments."""
    assert set(flatten(DEFAULTS)) == {spec.name for spec in PARAMETERS if not spec.optional}
    text = DEFAULT_CONFIG.read_text()
    for spec in PARAMETERS:
        if spec.optional:
            assert re.search(rf'#\s+{spec.name.rpartition(".")[2]}:', text), spec.name


def test_random_weights_never_start_unless_allowed():
    with pytest.raises(ParameterError, match="'checkpoint' is empty, which builds a model with RANDOM"):
        settings_from_values(flatten(DEFAULTS))
    assert settings_from_values({**VALUES, 'checkpoint': '/robot/policy',
                                 'allow_random_weights': False}).checkpoint == '/robot/policy'


def test_rtc_guidance_reaches_the_chunking_settings():
    assert settings_from_values(VALUES).scheduler.rtc_guidance == 'paper'
    lerobot = settings_from_values({**VALUES, 'chunking.rtc_guidance': 'lerobot'})
    assert lerobot.scheduler.rtc_guidance == 'lerobot'


def test_remote_inference_needs_a_horizon_and_a_server_name_but_no_checkpoint():
    remote = {**flatten(DEFAULTS), 'inference': 'remote'}      # random weights not allowed here
    with pytest.raises(ParameterError, match="inference 'remote' needs chunking.horizon > 0"):
        settings_from_values(remote)
    settings = settings_from_values({**remote, 'chunking.horizon': 50})
    assert (settings.inference, settings.remote_servers) == ('remote', ('/vla_policy_server',))
    assert settings.remote_server_timeout == 0.5
    with pytest.raises(ParameterError, match="'remote.server' = 'server' must be a fully qualified"):
        settings_from_values({**remote, 'chunking.horizon': 50, 'remote.server': 'server'})


def test_a_pool_of_servers_starts_with_remote_server_and_names_each_once():
    remote = {**flatten(DEFAULTS), 'inference': 'remote', 'chunking.horizon': 50}
    pool = settings_from_values({**remote, 'remote.servers': ['/gpu1', '/vla_policy_server', '/gpu2']})
    assert pool.remote_servers == ('/vla_policy_server', '/gpu1', '/gpu2')
    with pytest.raises(ParameterError, match="'remote.servers' = 'gpu1' must be a fully qualified"):
        settings_from_values({**remote, 'remote.servers': ['gpu1']})
    with pytest.raises(ParameterError, match="'remote.servers' lists a server twice"):
        settings_from_values({**remote, 'remote.servers': ['/gpu1', '/gpu1']})
    with pytest.raises(ParameterError, match='inference'):
        settings_from_values({**VALUES, 'inference': 'cloud'})


def test_a_fleet_key_is_read_from_a_file_that_must_exist_be_long_enough_and_private(tmp_path):
    remote = {**flatten(DEFAULTS), 'inference': 'remote', 'chunking.horizon': 50}
    assert settings_from_values(remote).remote_fleet_key is None
    key = tmp_path / 'fleet.key'
    key.write_text('ab' * 32 + '\n')
    key.chmod(0o600)
    settings = settings_from_values({**remote, 'remote.fleet_key_file': str(key)})
    assert settings.remote_fleet_key == b'ab' * 32 and 'abab' not in repr(settings), 'the key is never printed'
    for content, mode, reason in (('ab' * 32, 0o644, 'readable or writable by every user'),
                                  ('short', 0o600, 'holds 5 bytes, at least 16')):
        key.write_text(content)
        key.chmod(mode)
        with pytest.raises(ParameterError, match=f"'remote.fleet_key_file': .*{reason}"):
            settings_from_values({**remote, 'remote.fleet_key_file': str(key)})
    with pytest.raises(ParameterError, match='cannot be read: No such file.*openssl rand -hex 32'):
        settings_from_values({**remote, 'remote.fleet_key_file': str(tmp_path / 'missing.key')})


@pytest.mark.parametrize('key, value', [
    ('camera_topics', ['camera/front/image_raw', 'camera/wr ist']),
    ('command_topic', '1st_arm/commands'),
    ('joint_states_topic', 'joint states'),
])
def test_a_name_no_topic_can_have_is_refused_at_start(key, value):
    with pytest.raises(ParameterError, match=f"parameter '{key}' has '.+', which is not a topic name"):
        settings_from_values({**VALUES, key: value})


def test_default_yaml_is_valid():
    settings = settings_from_values(VALUES)
    assert settings.joint_names == tuple(DEFAULTS['joint_names'])
    np.testing.assert_array_equal(settings.limits.upper, DEFAULTS['limits']['upper'])


@pytest.mark.parametrize('change, message', [
    ({'control_rate_hz': 0.0},
     "parameter 'control_rate_hz' = 0.0 must be a double in [1.0, 1000.0]"),
    ({'command_interface': 'velocity'},
     "parameter 'command_interface' = 'velocity' must be a string "
     '(one of joint_trajectory, forward_command, follow_joint_trajectory, gripper_command)'),
    ({'dtype': 'float64'},
     "parameter 'dtype' = 'float64' must be a string (one of float32, bfloat16, float16, int8)"),
    ({'device': 'tpu'}, "parameter 'device' = 'tpu' must be auto, cpu, cuda or cuda:N"),
    ({'camera_names': ['front']},
     'camera_topics has 2 entries but camera_names has 1; give one name per topic'),
    ({'joint_names': ['a', 'a', 'b', 'c', 'd', 'e']},
     "parameter 'joint_names' has duplicated entries: ['a', 'a', 'b', 'c', 'd', 'e']"),
    ({'limits.lower': [-1.0] * 5},
     "parameter 'limits.lower' has 5 entries, expected one per joint (6)"),
    ({'limits.upper': [-5.0] * 6},
     'invalid limits: lower position limit must be below upper at joint indices '
     '[0, 1, 2, 3, 4, 5]'),
    ({'limits.max_velocity': [1.0] * 5 + [0.0]},
     'invalid limits: max_velocity must be positive at joint indices [5]'),
    ({'command_topic': ' '}, "parameter 'command_topic' must not be empty"),
    ({'limits.max_tracking_error': [0.3] * 5},
     "parameter 'limits.max_tracking_error' = [0.3, 0.3, 0.3, 0.3, 0.3] must give one value >= 0 per joint "
     '(6), or one for all (0: not checked)'),
    ({'limits.max_tracking_error': [-0.3]},
     "parameter 'limits.max_tracking_error' = [-0.3] must give one value >= 0 per joint "
     '(6), or one for all (0: not checked)'),
    ({'chunking.blend': 'smooth'},
     "parameter 'chunking.blend' = 'smooth' must be a string "
     '(one of latest, weighted, temporal_ensemble, rtc)'),
    ({'joint_units.scale': [57.3] * 5},
     'joint_units: scale has 5 entries, expected one per joint (6)'),
    ({'joint_units.offset': [0.0] * 7},
     'joint_units: offset has 7 entries, expected one per joint (6)'),
    ({'camera_transports': ['compressed', 'raw', 'raw']},
     "parameter 'camera_transports' = ['compressed', 'raw', 'raw'] must give one of raw, "
     'compressed for every camera topic (2), or one for all'),
    ({'camera_transports': ['theora']},
     "parameter 'camera_transports' = ['theora'] must give one of raw, compressed for every "
     'camera topic (2), or one for all'),
    ({'chunking.rtc_guidance': 'kinetix'},
     "parameter 'chunking.rtc_guidance' = 'kinetix' must be a string (one of paper, lerobot)"),
])
def test_bad_values_are_refused_with_a_reason(change, message):
    with pytest.raises(ParameterError) as error:
        settings_from_values({**VALUES, **change})
    assert str(error.value) == message


def test_int8_is_a_dtype_and_float32_stays_the_default():
    assert settings_from_values(VALUES).dtype == 'float32'
    assert settings_from_values({**VALUES, 'dtype': 'int8'}).dtype == 'int8'


@pytest.mark.parametrize('given, expected', [
    (None, [np.inf] * 6),
    ([0.3], [0.3] * 6),
    ([0.2, 0.2, 0.3, 0.3, 0.5, 0.0], [0.2, 0.2, 0.3, 0.3, 0.5, np.inf]),
])
def test_the_tracking_error_applies_to_every_joint_or_one_each_and_0_leaves_a_joint_unchecked(given, expected):
    settings = settings_from_values({**VALUES, 'limits.max_tracking_error': given})
    np.testing.assert_array_equal(settings.limits.max_tracking_error, expected)


def test_missing_value_is_refused():
    values = dict(VALUES)
    del values['joint_names']
    with pytest.raises(ParameterError, match="'joint_names' is required"):
        settings_from_values(values)


@pytest.fixture
def context():
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=next_domain_id())
    yield ctx
    rclpy.try_shutdown(context=ctx)


def declared(context, tmp_path: Path, overrides: dict):
    """Declare the parameters on a bare node given default.yaml plus an override file."""
    extra = tmp_path / 'override.yaml'
    extra.write_text(yaml.safe_dump({'/**': {'ros__parameters': overrides}}))
    args = ['--ros-args', '--params-file', str(DEFAULT_CONFIG), '--params-file', str(extra),
            *RANDOM_WEIGHTS_ARGS]
    node = rclpy.create_node('vla_policy_node', context=context, cli_args=args)
    try:
        return declare_parameters(node, args)
    finally:
        node.destroy_node()


@pytest.mark.parametrize('override, message', [
    ({'control_rate_hz': 5000.0},
     "parameter 'control_rate_hz' must be a double in [1.0, 1000.0]"),
    ({'control_rate_hz': 20}, "parameter 'control_rate_hz' must be a double in [1.0, 1000.0], "
     "but {path} gives an integer ('20')"),
    ({'num_threads': -1}, "parameter 'num_threads' must be an integer in [0, 256]"),
    ({'limits': {'max_step': 'abc'}},
     "parameter 'limits.max_step' must be a double in [1e-06, 10.0], but {path} gives a "
     "string ('abc')"),
    # rcl keeps default.yaml's 20.0 here: only the check of the files themselves sees it.
    ({'control_rate_hz': 'fast'}, "parameter 'control_rate_hz' must be a double in "
     "[1.0, 1000.0], but {path} gives a string ('fast')"),
    ({'camera_names': [1, 2]}, "parameter 'camera_names' must be a string array, but {path} "
     "gives an integer array ('[...]')"),
    ({'control_rate': 20.0}, "unknown parameters: ['control_rate']"),
])
def test_declare_refuses_wrong_types_ranges_and_unknown_names(context, tmp_path, override,
                                                              message):
    with pytest.raises(ParameterError) as error:
        declared(context, tmp_path, override)
    assert str(error.value) == message.format(path=tmp_path / 'override.yaml')


def test_declare_accepts_default_yaml(context, tmp_path):
    assert declared(context, tmp_path, {}).control_rate_hz == DEFAULTS['control_rate_hz']


def test_a_params_file_dumped_from_the_node_starts_it(context, tmp_path):
    """`ros2 param dump` lists the parameters every node has, as start_type_description_service."""
    settings = declared(context, tmp_path, {'start_type_description_service': True, 'use_sim_time': False})
    assert settings.control_rate_hz == DEFAULTS['control_rate_hz']


def test_every_declared_parameter_has_a_value_so_a_dump_lists_them_all(context):
    """A dump works: rclpy answers a request for several parameters with nothing if one has no value."""
    from vla_policy_node.ros.node import VlaPolicyNode
    node = VlaPolicyNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(DEFAULT_CONFIG), *RANDOM_WEIGHTS_ARGS])
    try:
        names = node.list_parameters([], 0).names
        assert 'limits.max_tracking_error' in names and 'joint_units.scale' not in names    # absent: not declared
        assert len(node.get_parameters(names)) == len(names)
    finally:
        node.stop()
        node.destroy_node()


def test_required_robot_description_has_no_default(context):
    node = rclpy.create_node('vla_policy_node', context=context)
    try:
        with pytest.raises(ParameterError) as error:
            declare_parameters(node)
    finally:
        node.destroy_node()
    assert str(error.value) == "parameter 'camera_topics' is required: it must be a string array"


def test_runtime_changes_are_validated_and_read_only_parameters_refused(context):
    from vla_policy_node.ros.node import VlaPolicyNode
    node = VlaPolicyNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(DEFAULT_CONFIG), *RANDOM_WEIGHTS_ARGS])
    try:
        result = node.set_parameters([Parameter('limits.lower', value=[-1.0] * 5)])[0]
        assert not result.successful
        assert result.reason == (
            "parameter 'limits.lower' has 5 entries, expected one per joint (6)")
        result = node.set_parameters([Parameter('command_topic', value='/elsewhere')])[0]
        assert not result.successful and 'read-only' in result.reason
        assert node.get_parameter('command_topic').value == DEFAULTS['command_topic']
        result = node.set_parameters([Parameter('max_observation_age', value=0.8)])[0]
        assert not result.successful and result.reason == (
            'max_observation_age 0.8 s is looser than the 0.5 s the node started with: loosening it takes a restart')
        result = node.set_parameters([Parameter('max_observation_age', value=0.3)])[0]
        assert result.successful
        assert node._settings.max_observation_age == 0.3
        assert node.set_parameters([Parameter('max_observation_age', value=0.5)])[0].successful, \
            'back up to the start value'
        horizon_s = node._loop.horizon / DEFAULTS['control_rate_hz']     # 0 derives 0.5 s + one horizon
        result = node.set_parameters([Parameter('max_action_age', value=0.5 + horizon_s + 0.1)])[0]
        assert not result.successful and 'loosening it takes a restart' in result.reason
        assert node.set_parameters([Parameter('max_action_age', value=0.5 + horizon_s)])[0].successful
        assert node.set_parameters([Parameter('max_action_age', value=0.4)])[0].successful
        assert node.set_parameters([Parameter('max_action_age', value=0.0)])[0].successful
        result = node.set_parameters([Parameter('use_header_stamps', value=False)])[0]
        assert not result.successful and result.reason.startswith('use_header_stamps false would let frames')
        assert not node.set_parameters([Parameter('policy_deadline', value=0.0)])[0].successful
        assert node.set_parameters([Parameter('policy_deadline', value=0.2)])[0].successful
        assert node._worker.deadline == 0.2
        assert node.set_parameters([Parameter('limits.max_tracking_error', value=[0.3])])[0].successful, \
            'checking a tracking error where none was is a tightening'
        np.testing.assert_array_equal(node._loop.settings.limits.max_tracking_error, [0.3] * 6)
        result = node.set_parameters([Parameter('limits.max_tracking_error', value=[0.3] * 5)])[0]
        assert not result.successful and 'must give one value >= 0 per joint (6)' in result.reason
    finally:
        node.stop()
        node.destroy_node()


@pytest.mark.parametrize('override, message', [
    ({'control_rate_hz': 0.0}, "parameter 'control_rate_hz' must be a double in [1.0, 1000.0]"),
    ({'limits': {'lower': [-1.0] * 5}},
     "parameter 'limits.lower' has 5 entries, expected one per joint (6)"),
    ({'camera_name': ['front']}, "unknown parameters: ['camera_name']"),
])
def test_node_exits_1_with_the_reason_on_a_bad_params_file(tmp_path: Path, override, message):
    bad = tmp_path / 'bad.yaml'
    bad.write_text(yaml.safe_dump({'/**': {'ros__parameters': override}}))
    node = NodeProcess([DEFAULT_CONFIG, bad], next_domain_id())
    try:
        assert node.wait(timeout=60.0) == 1, node.output
    finally:
        node.kill()
    assert f'[vla_policy_node]: cannot start: {message}' in node.output
