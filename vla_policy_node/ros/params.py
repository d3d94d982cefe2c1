# SPDX-License-Identifier: Apache-2.0
"""
Parameters of the policy node: declaration, validation, typed settings, the parameter-file reader.

Every tunable is described (type, range, description) in ``ros.param_specs``, so that
``ros2 param describe`` explains it and out-of-range values are refused by rclpy itself.
Cross-parameter rules (one limit per joint, one camera name per topic, known enum values)
live in :func:`settings_from_values`, a pure function over a name -> value mapping that the
node uses at start-up (raising :class:`ParameterError`, like joy_teleop) and in its on-set
callback (returning the same message as the rejection reason, changing nothing).

Parameters that decide what is loaded or where commands go are read-only: changing them
under a running controller would silently redirect or replace the policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
import re
from typing import Any

import numpy as np
from rclpy.exceptions import ParameterException, ParameterUninitializedException
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.validate_topic_name import validate_topic_name
import yaml

from vla_policy_node.control.joint_map import JointMap
from vla_policy_node.control.safety import MotionLimits, SafetyError
from vla_policy_node.ros.command_groups import check_group_names, command_groups_from_values, CommandGroup
from vla_policy_node.ros.param_specs import (  # noqa: F401 (re-exported: the names of ros.params)
    _type_name, all_specs, CAMERA_TRANSPORTS, command_group_specs, DTYPES, INFERENCE, ParameterError, PARAMETERS,
    ParamSpec, ROS_NODE_PARAMETERS, SPECS)
from vla_policy_node.server.fleet_key import FleetKeyError, load_fleet_key


@dataclass(frozen=True)
class ChunkingSettings:
    """What the node passes to the ChunkScheduler (horizon 0 = the policy's chunk size)."""

    horizon: int
    refill_threshold: float
    blend: str
    blend_weight: float
    ensemble_decay: float
    rtc_max_guidance_weight: float
    rtc_guidance: str
    execution_horizon: int = 10


@dataclass(frozen=True, kw_only=True)
class PolicySettings:
    """What ``make_policy`` reads: the node's and the server's settings are both built on it."""

    checkpoint: str
    allow_random_weights: bool
    checkpoint_root: str
    device: str
    dtype: str
    cuda_graphs: bool
    torch_compile: bool
    compile_cache_dir: str
    num_threads: int
    tiny_chunk_size: int
    tiny_num_steps: int
    tiny_seed: int
    camera_names: tuple[str, ...]
    joint_names: tuple[str, ...]
    chunking: ChunkingSettings


@dataclass(frozen=True, kw_only=True)
class NodeSettings(PolicySettings):
    """Validated parameter values, the only form in which the node reads its configuration."""

    camera_topics: tuple[str, ...]
    instruction_topic: str
    task_success_topic: str
    joint_states_topic: str
    camera_transports: tuple[str, ...]      # one per camera topic
    joint_map: JointMap
    command_groups: tuple[CommandGroup, ...]
    trajectory_velocities: bool
    gripper_max_effort: float
    command_interface: str
    command_topic: str
    trajectory_points: int
    control_rate_hz: float
    max_observation_age: float
    max_action_age: float
    use_header_stamps: bool
    policy_deadline: float
    reset_on_instruction_change: bool
    max_instruction_length: int
    limits: MotionLimits
    diagnostics_period: float
    inference: str = 'local'
    remote_servers: tuple[str, ...] = ('/vla_policy_server',)   # remote.server, then remote.servers
    remote_server_timeout: float = 0.5
    remote_fleet_key: bytes | None = field(default=None, repr=False)     # read from remote.fleet_key_file


def _check_device(device: str) -> None:
    if device in ('auto', 'cpu', 'cuda'):
        return
    if device.startswith('cuda:') and device[5:].isdigit():
        return
    raise ParameterError(f"parameter 'device' = '{device}' must be auto, cpu, cuda or cuda:N")


def _check_topic(key: str, topic: str) -> None:
    """Refuse a name no topic can have (a space, a leading digit): found at start, not by a failed subscription."""
    try:
        validate_topic_name(topic)
    except Exception as error:  # noqa: B902 - rclpy's InvalidTopicNameException
        reason = str(error).splitlines()[0]
        raise ParameterError(f"parameter '{key}' has {topic!r}, which is not a topic name ({reason})") from None


def _check_names(name: str, values: tuple[str, ...]) -> None:
    if not values:
        raise ParameterError(f"parameter '{name}' must not be empty")
    if any(not value.strip() for value in values):
        raise ParameterError(f"parameter '{name}' has an empty entry")
    if len(set(values)) != len(values):
        raise ParameterError(f"parameter '{name}' has duplicated entries: {list(values)}")


def settings_from_values(values: Mapping[str, Any]) -> NodeSettings:
    """
    Check every value and every cross-parameter rule; return settings or raise ParameterError.

    ``values`` maps each name in :data:`PARAMETERS` to its value. The rules checked by rclpy
    through the descriptors (type, range) are checked again here so that this function alone
    decides, and can be unit-tested without a node.
    """
    names = values.get('commands.groups') or ()
    try:
        check_group_names(names)
    except ValueError as error:
        raise ParameterError(str(error)) from error
    values = {**{spec.name: None for spec in PARAMETERS if spec.optional}, **values}
    for spec in all_specs(values):
        if spec.name not in values:
            raise ParameterError(f"parameter '{spec.name}' is required: it {spec.requirement()}")
        value = values[spec.name]
        if value is None and spec.optional:
            continue
        if spec.choices and value not in spec.choices:
            raise ParameterError(
                f"parameter '{spec.name}' = '{value}' {spec.requirement()}")
        if spec.bounds is not None and not spec.bounds[0] <= value <= spec.bounds[1]:
            raise ParameterError(f"parameter '{spec.name}' = {value} {spec.requirement()}")
    _check_device(values['device'])
    remote = values['inference'] == 'remote'
    if remote and values['chunking.horizon'] == 0:
        raise ParameterError(
            "inference 'remote' needs chunking.horizon > 0 (at most the server policy's chunk "
            'size): the node does not load the policy, so it cannot read the chunk size')
    servers = (values['remote.server'], *[s for s in values['remote.servers'] or ()
                                          if s != values['remote.server']])
    for server in servers if remote else ():
        if not server.startswith('/'):
            name = 'remote.server' if server == values['remote.server'] else 'remote.servers'
            raise ParameterError(f"parameter '{name}' = '{server}' must be a "
                                 "fully qualified node name, e.g. '/vla_policy_server'")
    if remote and len(set(servers)) != len(servers):
        raise ParameterError(f"parameter 'remote.servers' lists a server twice: {list(servers)}")
    fleet_key = None
    if remote and values['remote.fleet_key_file']:
        try:
            fleet_key = load_fleet_key(values['remote.fleet_key_file'])
        except FleetKeyError as error:
            raise ParameterError(f"parameter 'remote.fleet_key_file': {error}") from error
    if not remote and not values['checkpoint'] and not values['allow_random_weights']:
        raise ParameterError(
            "parameter 'checkpoint' is empty, which builds a model with RANDOM weights; set "
            "'checkpoint' to your policy's folder (or allow_random_weights: true for plumbing "
            'tests without a robot that can be hurt)')
    cameras = tuple(values['camera_topics'])
    names = tuple(values['camera_names'])
    joints = tuple(values['joint_names'])
    _check_names('camera_topics', cameras)
    _check_names('camera_names', names)
    _check_names('joint_names', joints)
    if len(cameras) != len(names):
        raise ParameterError(
            f'camera_topics has {len(cameras)} entries but camera_names has {len(names)}; '
            'give one name per topic')
    for key in ('instruction_topic', 'joint_states_topic', 'task_success_topic', 'command_topic'):
        if not values[key].strip():
            raise ParameterError(f"parameter '{key}' must not be empty")
        _check_topic(key, values[key])
    for topic in cameras:
        _check_topic('camera_topics', topic)
    for key in ('limits.lower', 'limits.upper', 'limits.max_velocity'):
        if len(values[key]) != len(joints):
            raise ParameterError(
                f"parameter '{key}' has {len(values[key])} entries, expected one per joint "
                f'({len(joints)})')
    transports = tuple(values['camera_transports'])
    if len(transports) == 1:
        transports *= len(cameras)
    if len(transports) != len(cameras) or not set(transports) <= set(CAMERA_TRANSPORTS):
        raise ParameterError(
            f"parameter 'camera_transports' = {list(values['camera_transports'])} must give one "
            f"of {', '.join(CAMERA_TRANSPORTS)} for every camera topic ({len(cameras)}), or one "
            'for all')
    try:
        joint_map = JointMap.for_joints(len(joints), values['joint_units.scale'],
                                        values['joint_units.offset'])
    except ValueError as error:
        raise ParameterError(f'joint_units: {error}') from error
    try:
        groups = command_groups_from_values(values, joints)
    except ValueError as error:
        raise ParameterError(str(error)) from error
    tracking = values['limits.max_tracking_error']
    if tracking is not None and (len(tracking) not in (1, len(joints)) or not all(v >= 0.0 for v in tracking)):
        raise ParameterError(
            f"parameter 'limits.max_tracking_error' = {list(tracking)} must give one value >= 0 per joint "
            f'({len(joints)}), or one for all (0: not checked)')
    try:
        limits = MotionLimits(
            lower=np.array(values['limits.lower'], dtype=np.float64),
            upper=np.array(values['limits.upper'], dtype=np.float64),
            max_velocity=np.array(values['limits.max_velocity'], dtype=np.float64),
            max_step=float(values['limits.max_step']),
            max_tracking_error=None if tracking is None else np.broadcast_to(
                np.where(np.array(tracking, dtype=np.float64) > 0.0, tracking, np.inf), len(joints)))
    except SafetyError as error:
        raise ParameterError(f'invalid limits: {error}') from error
    return NodeSettings(
        checkpoint=values['checkpoint'],
        allow_random_weights=values['allow_random_weights'],
        checkpoint_root=values['checkpoint_root'],
        device=values['device'],
        dtype=values['dtype'],
        cuda_graphs=values['cuda_graphs'],
        torch_compile=values['compile'],
        compile_cache_dir=values['compile_cache_dir'],
        num_threads=values['num_threads'],
        tiny_chunk_size=values['tiny_model.chunk_size'],
        tiny_num_steps=values['tiny_model.num_steps'],
        tiny_seed=values['tiny_model.seed'],
        camera_topics=cameras,
        camera_names=names,
        instruction_topic=values['instruction_topic'],
        task_success_topic=values['task_success_topic'],
        joint_states_topic=values['joint_states_topic'],
        joint_names=joints,
        camera_transports=transports,
        joint_map=joint_map,
        command_groups=groups,
        trajectory_velocities=values['trajectory_velocities'],
        gripper_max_effort=values['gripper_max_effort'],
        command_interface=values['command_interface'],
        command_topic=values['command_topic'],
        trajectory_points=values['trajectory_points'],
        control_rate_hz=values['control_rate_hz'],
        chunking=ChunkingSettings(
            horizon=values['chunking.horizon'],
            refill_threshold=values['chunking.refill_threshold'],
            blend=values['chunking.blend'],
            blend_weight=values['chunking.blend_weight'],
            ensemble_decay=values['chunking.ensemble_decay'],
            rtc_max_guidance_weight=values['chunking.rtc_max_guidance_weight'],
            rtc_guidance=values['chunking.rtc_guidance'],
            execution_horizon=values['chunking.execution_horizon']),
        max_observation_age=values['max_observation_age'],
        max_action_age=values['max_action_age'],
        use_header_stamps=values['use_header_stamps'],
        policy_deadline=values['policy_deadline'],
        reset_on_instruction_change=values['reset_on_instruction_change'],
        max_instruction_length=values['max_instruction_length'],
        limits=limits,
        diagnostics_period=values['diagnostics_period'],
        inference=values['inference'],
        remote_servers=servers,
        remote_server_timeout=values['remote.server_timeout'],
        remote_fleet_key=fleet_key,
    )


def declare_parameters(node: Node, arguments: Sequence[str] = ()) -> NodeSettings:
    """
    Declare every parameter on ``node`` and return the validated settings.

    Raises :class:`ParameterError` for a value of the wrong type or out of range, a missing
    required value, an override naming no declared parameter (a typo would otherwise be
    ignored silently), or a failed cross-parameter rule. ``arguments`` are the command-line
    arguments the node was started with: their parameter files and ``-p`` values are
    type-checked first, see :func:`check_override_sources`.
    """
    check_override_sources(arguments, node.get_fully_qualified_name())
    values: dict[str, Any] = {}
    _declare(node, PARAMETERS, values)
    try:
        check_group_names(values['commands.groups'] or ())
    except ValueError as error:
        raise ParameterError(str(error)) from error
    groups = command_group_specs(values['commands.groups'] or ())
    check_override_sources(arguments, node.get_fully_qualified_name(), groups)
    _declare(node, groups, values)
    known = set(SPECS) | {spec.name for spec in groups}
    unknown = sorted(set(_override_names(node)) - known - ROS_NODE_PARAMETERS)
    if unknown:
        raise ParameterError(f'unknown parameters: {unknown}')
    return settings_from_values(values)


def _declare(node: Node, specs: Iterable[ParamSpec], values: dict[str, Any]) -> None:
    """Declare ``specs`` on ``node`` and put their values in ``values`` (None: optional, unset)."""
    given = set(_override_names(node))
    for spec in specs:
        if spec.optional and spec.name not in given:
            values[spec.name] = None
            continue
        try:
            node.declare_parameter(spec.name, spec.default, spec.descriptor())
            values[spec.name] = node.get_parameter(spec.name).value
        except ParameterUninitializedException as error:
            if spec.optional:
                values[spec.name] = None
                continue
            raise ParameterError(
                f"parameter '{spec.name}' is required: it {spec.requirement()}") from error
        except ParameterException as error:
            raise ParameterError(f"parameter '{spec.name}' {spec.requirement()}") from error


def _override_names(node: Node) -> Iterable[str]:
    """Names given in parameter files and -p flags (rclpy keeps them on the node)."""
    return getattr(node, '_parameter_overrides', {}).keys()


def validate_change(current: Mapping[str, Any],
                    changes: Iterable[Parameter]) -> tuple[NodeSettings | None, str | None]:
    """
    Return the settings ``changes`` on top of ``current`` would give, or why they are invalid.

    Used by the on-set callback: it only decides; the node changes state in its post-set
    callback. ``use_sim_time`` is refused: switching clocks under a running control loop
    would make every age and stamp check meaningless.
    """
    merged = dict(current)
    for parameter in changes:
        if parameter.name == 'use_sim_time':
            return None, 'use_sim_time is read-only once the node runs'
        if parameter.name in SPECS:
            merged[parameter.name] = parameter.value
    try:
        return settings_from_values(merged), None
    except ParameterError as error:
        return None, str(error)


def current_values(node: Node) -> dict[str, Any]:
    """Return the declared parameters' current values, by name (None: optional and unset)."""
    values = {spec.name: node.get_parameter_or(spec.name, Parameter(spec.name, value=None)).value
              for spec in PARAMETERS}
    for spec in command_group_specs(values['commands.groups'] or ()):
        values[spec.name] = node.get_parameter(spec.name).value
    return values


# rcl's YAML rules for an unquoted scalar (rcl_yaml_param_parser get_value): these words are
# booleans, then whatever strtol or strtod reads completely is an integer or a double.
_YAML_BOOLS = {'y', 'yes', 'true', 'on', 'n', 'no', 'false', 'off'}
_YAML_SPECIAL_DOUBLES = {'.nan', '.inf', '-.inf', '+.inf'}
_ARRAY_TYPES = {
    Parameter.Type.BOOL: Parameter.Type.BOOL_ARRAY,
    Parameter.Type.INTEGER: Parameter.Type.INTEGER_ARRAY,
    Parameter.Type.DOUBLE: Parameter.Type.DOUBLE_ARRAY,
    Parameter.Type.STRING: Parameter.Type.STRING_ARRAY,
}


def check_override_sources(arguments: Sequence[str], node_name: str,
                           specs: Sequence[ParamSpec] = PARAMETERS) -> None:
    """
    Type-check every value the parameter files and ``-p`` flags in ``arguments`` give.

    rcl merges all sources before the node sees them, and when two sources give one name
    values of different types it silently keeps the first (``control_rate_hz: "fast"`` in a
    second file leaves the 20.0 of the first): the declared descriptors never see the bad
    value. So the sources are read again here and any value whose YAML type is not the
    declared one stops the start with the file and the value in the message. Names that are
    not declared are left to the unknown-parameter check.
    """
    by_name = {spec.name: spec for spec in specs}
    for source, name, node in _override_values(arguments, node_name):
        spec = by_name.get(name)
        if spec is None:
            continue
        kind = _yaml_type(node)
        if kind != spec.type:
            raise ParameterError(
                f"parameter '{name}' {spec.requirement()}, but {source} gives "
                f'{_describe_yaml(kind, node)}')


def _override_values(arguments: Sequence[str],
                     node_name: str) -> Iterator[tuple[str, str, yaml.Node]]:
    """(source, parameter name, YAML value) of every override in the ROS arguments."""
    ros_args = False
    tokens = iter(arguments)
    for token in tokens:
        if token == '--ros-args':
            ros_args = True
        elif token == '--':
            ros_args = False
        elif ros_args and token == '--params-file':
            path = next(tokens, '')
            yield from _params_file_values(path, node_name)
        elif ros_args and token in ('-p', '--param'):
            assignment = next(tokens, '')
            name, _, text = assignment.partition(':=')
            target, _, name = name.rpartition(':')
            if not target or _node_matches(target, node_name):
                yield f'-p {assignment}', name, yaml.compose(text or "''")


def read_params_file(path: str, node_name: str) -> dict[str, Any]:
    """
    Return the values a parameter file gives the node ``node_name`` (fully qualified).

    Sections are matched as rcl matches them (``/**``, ``/ns/node``, ``node``, wildcards) and
    applied in file order, later values winning; values are read as YAML, names flattened
    (``limits: {max_step: 0.1}`` -> ``limits.max_step``). The one reader of parameter files
    beside rcl: the type check of the start-up and ``vla_policy_replay`` both use it.
    """
    return {name: yaml.safe_load(yaml.serialize(node)) for _, name, node in _params_file_values(path, node_name)}


def _params_file_values(path: str, node_name: str) -> Iterator[tuple[str, str, yaml.Node]]:
    try:
        with open(path, encoding='utf-8') as stream:
            root = yaml.compose(stream)
    except (OSError, yaml.YAMLError) as error:
        raise ParameterError(f'cannot read parameter file {path}: {error}') from error
    if not isinstance(root, yaml.MappingNode):
        return
    for key, section in root.value:
        if not _node_matches(key.value, node_name) or not isinstance(section, yaml.MappingNode):
            continue
        for inner_key, tree in section.value:
            if inner_key.value == 'ros__parameters':
                for name, value in _flatten(tree, ''):
                    yield path, name, value


def _flatten(node: yaml.Node, prefix: str) -> Iterator[tuple[str, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        yield prefix[:-1], node
        return
    for key, value in node.value:
        yield from _flatten(value, f'{prefix}{key.value}.')


def _node_matches(pattern: str, node_name: str) -> bool:
    """Match rcl's node-name wildcards: ``**`` any number of name tokens, ``*`` exactly one."""
    pattern = pattern if pattern.startswith('/') else '/' + pattern
    regex = re.escape(pattern).replace(r'/\*\*', '(/[^/]+)*').replace(r'\*', '[^/]+')
    return re.fullmatch(regex, node_name) is not None


def _yaml_type(node: yaml.Node) -> Parameter.Type:
    if isinstance(node, yaml.SequenceNode):
        kinds = {_yaml_type(item) for item in node.value}
        if len(kinds) == 1 and next(iter(kinds)) in _ARRAY_TYPES:
            return _ARRAY_TYPES[kinds.pop()]
        return Parameter.Type.NOT_SET
    if not isinstance(node, yaml.ScalarNode):
        return Parameter.Type.NOT_SET
    text = node.value
    if node.style is not None:
        return Parameter.Type.STRING
    if text.lower() in _YAML_BOOLS:
        return Parameter.Type.BOOL
    if re.fullmatch(r'[-+]?[0-9]+', text.strip()):
        return Parameter.Type.INTEGER
    if text.lower() in _YAML_SPECIAL_DOUBLES:
        return Parameter.Type.DOUBLE
    try:
        float(text)
    except ValueError:
        return Parameter.Type.STRING
    return Parameter.Type.DOUBLE


def _describe_yaml(kind: Parameter.Type, node: yaml.Node) -> str:
    if kind == Parameter.Type.NOT_SET:
        return 'a value of no single parameter type'
    text = node.value if isinstance(node, yaml.ScalarNode) else '[...]'
    article = 'an' if _type_name(kind)[0] in 'aeiou' else 'a'
    return f'{article} {_type_name(kind)} ({text!r})'
