# SPDX-License-Identifier: Apache-2.0
"""
Parameters of the policy node: declaration, validation, typed settings (the file reader: ros.params_file).

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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rclpy.exceptions import ParameterException, ParameterUninitializedException
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.validate_topic_name import validate_topic_name

from vla_policy_node.control.chunking import SchedulerConfig
from vla_policy_node.control.joint_map import JointMap
from vla_policy_node.control.safety import MotionLimits, SafetyError
from vla_policy_node.ros.command_groups import check_group_names, command_groups_from_values, CommandGroup
from vla_policy_node.ros.param_specs import (  # noqa: F401 (re-exported: the names of ros.params)
    _type_name, all_specs, CAMERA_TRANSPORTS, command_group_specs, DTYPES, INFERENCE, ParameterError, PARAMETERS,
    ParamSpec, ROS_NODE_PARAMETERS, SPECS)
from vla_policy_node.ros.params_file import check_override_sources, read_params_file  # noqa: F401 (re-exported)
from vla_policy_node.runtime.devices import DEVICES, is_device_name
from vla_policy_node.server.fleet_key import FleetKeyError, load_fleet_key


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
    trace: bool
    num_threads: int
    tiny_chunk_size: int
    tiny_num_steps: int
    tiny_seed: int
    camera_names: tuple[str, ...]
    joint_names: tuple[str, ...]


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
    horizon: int                            # chunking.horizon: actions used per chunk (0: the policy's chunk size)
    scheduler: SchedulerConfig              # chunking.*; ros.node.scheduler_config sets its horizon
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

    @property
    def guided(self) -> bool:
        """Tell whether chunks after an episode's first follow real-time chunking guidance (eager code)."""
        return self.scheduler.blend == 'rtc'


def _check_device(device: str) -> None:
    if not is_device_name(device):
        raise ParameterError(f"parameter 'device' = '{device}' must be {DEVICES}")


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
    decides, and can be unit-tested without a node. Each cross-rule is one named function in
    :data:`CROSS_RULES`, checked in that order.
    """
    values = _checked_values(values)
    for rule in CROSS_RULES:
        rule(values)
    cameras = tuple(values['camera_topics'])
    return NodeSettings(
        **policy_settings_fields(values),
        camera_topics=cameras,
        instruction_topic=values['instruction_topic'],
        task_success_topic=values['task_success_topic'],
        joint_states_topic=values['joint_states_topic'],
        camera_transports=_camera_transports(values),
        joint_map=_joint_map(values),
        command_groups=_command_groups(values),
        trajectory_velocities=values['trajectory_velocities'],
        gripper_max_effort=values['gripper_max_effort'],
        command_interface=values['command_interface'],
        command_topic=values['command_topic'],
        trajectory_points=values['trajectory_points'],
        control_rate_hz=values['control_rate_hz'],
        horizon=values['chunking.horizon'],
        scheduler=_scheduler(values),
        max_observation_age=values['max_observation_age'],
        max_action_age=values['max_action_age'],
        use_header_stamps=values['use_header_stamps'],
        policy_deadline=values['policy_deadline'],
        reset_on_instruction_change=values['reset_on_instruction_change'],
        max_instruction_length=values['max_instruction_length'],
        limits=_motion_limits(values),
        diagnostics_period=values['diagnostics_period'],
        inference=values['inference'],
        remote_servers=_remote_servers(values),
        remote_server_timeout=values['remote.server_timeout'],
        remote_fleet_key=_fleet_key(values['remote.fleet_key_file']) if _remote(values) else None,
    )


def policy_settings_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """Return the :class:`PolicySettings` fields from parameter values: the node and the server build them here."""
    return dict(
        checkpoint=values['checkpoint'],
        allow_random_weights=values['allow_random_weights'],
        checkpoint_root=values['checkpoint_root'],
        device=values['device'],
        dtype=values['dtype'],
        cuda_graphs=values['cuda_graphs'],
        torch_compile=values['compile'],
        compile_cache_dir=values['compile_cache_dir'],
        trace=values['trace'],
        num_threads=values['num_threads'],
        tiny_chunk_size=values['tiny_model.chunk_size'],
        tiny_num_steps=values['tiny_model.num_steps'],
        tiny_seed=values['tiny_model.seed'],
        camera_names=tuple(values['camera_names']),
        joint_names=tuple(values['joint_names']))


def check_random_weights(values: Mapping[str, Any]) -> None:
    """Refuse an empty checkpoint (a model with random weights) unless allow_random_weights says so."""
    if not values['checkpoint'] and not values['allow_random_weights']:
        raise ParameterError(
            "parameter 'checkpoint' is empty, which builds a model with RANDOM weights; set "
            "'checkpoint' to your policy's folder (or allow_random_weights: true for plumbing "
            'tests without a robot that can be hurt)')


def _checked_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every spec's value present, in its choices and bounds (the optional ones default to None)."""
    try:
        check_group_names(values.get('commands.groups') or ())
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
    return values


def _remote(values: Mapping[str, Any]) -> bool:
    return values['inference'] == 'remote'


def _remote_servers(values: Mapping[str, Any]) -> tuple[str, ...]:
    """remote.server, then the other remote.servers."""
    return (values['remote.server'], *[s for s in values['remote.servers'] or () if s != values['remote.server']])


def _device_rule(values: Mapping[str, Any]) -> None:
    _check_device(values['device'])


def _remote_horizon_rule(values: Mapping[str, Any]) -> None:
    if _remote(values) and values['chunking.horizon'] == 0:
        raise ParameterError(
            "inference 'remote' needs chunking.horizon > 0 (at most the server policy's chunk "
            'size): the node does not load the policy, so it cannot read the chunk size')


def _remote_servers_rule(values: Mapping[str, Any]) -> None:
    """Each server a fully qualified node name, none listed twice."""
    if not _remote(values):
        return
    servers = _remote_servers(values)
    for server in servers:
        if not server.startswith('/'):
            name = 'remote.server' if server == values['remote.server'] else 'remote.servers'
            raise ParameterError(f"parameter '{name}' = '{server}' must be a "
                                 "fully qualified node name, e.g. '/vla_policy_server'")
    if len(set(servers)) != len(servers):
        raise ParameterError(f"parameter 'remote.servers' lists a server twice: {list(servers)}")


def _random_weights_rule(values: Mapping[str, Any]) -> None:
    if not _remote(values):
        check_random_weights(values)


def _names_rule(values: Mapping[str, Any]) -> None:
    """Cameras, their names and the joints: non-empty, distinct, one camera name per topic."""
    cameras, names = tuple(values['camera_topics']), tuple(values['camera_names'])
    _check_names('camera_topics', cameras)
    _check_names('camera_names', names)
    _check_names('joint_names', tuple(values['joint_names']))
    if len(cameras) != len(names):
        raise ParameterError(
            f'camera_topics has {len(cameras)} entries but camera_names has {len(names)}; '
            'give one name per topic')


def _topics_rule(values: Mapping[str, Any]) -> None:
    for key in ('instruction_topic', 'joint_states_topic', 'task_success_topic', 'command_topic'):
        if not values[key].strip():
            raise ParameterError(f"parameter '{key}' must not be empty")
        _check_topic(key, values[key])
    for topic in values['camera_topics']:
        _check_topic('camera_topics', topic)


def _limits_per_joint_rule(values: Mapping[str, Any]) -> None:
    joints = len(values['joint_names'])
    for key in ('limits.lower', 'limits.upper', 'limits.max_velocity'):
        if len(values[key]) != joints:
            raise ParameterError(
                f"parameter '{key}' has {len(values[key])} entries, expected one per joint ({joints})")


# The cross-parameter rules, in the order they are checked (the first broken one is reported).
CROSS_RULES = (_device_rule, _remote_horizon_rule, _remote_servers_rule, _random_weights_rule, _names_rule,
               _topics_rule, _limits_per_joint_rule)


def _fleet_key(path: str) -> bytes | None:
    if not path:
        return None
    try:
        return load_fleet_key(path)
    except FleetKeyError as error:
        raise ParameterError(f"parameter 'remote.fleet_key_file': {error}") from error


def _camera_transports(values: Mapping[str, Any]) -> tuple[str, ...]:
    """One transport per camera topic (one given: for all)."""
    cameras = values['camera_topics']
    transports = tuple(values['camera_transports'])
    if len(transports) == 1:
        transports *= len(cameras)
    if len(transports) != len(cameras) or not set(transports) <= set(CAMERA_TRANSPORTS):
        raise ParameterError(
            f"parameter 'camera_transports' = {list(values['camera_transports'])} must give one "
            f"of {', '.join(CAMERA_TRANSPORTS)} for every camera topic ({len(cameras)}), or one "
            'for all')
    return transports


def _joint_map(values: Mapping[str, Any]) -> JointMap:
    try:
        return JointMap.for_joints(len(values['joint_names']), values['joint_units.scale'],
                                   values['joint_units.offset'])
    except ValueError as error:
        raise ParameterError(f'joint_units: {error}') from error


def _command_groups(values: Mapping[str, Any]) -> tuple[CommandGroup, ...]:
    try:
        return command_groups_from_values(values, tuple(values['joint_names']))
    except ValueError as error:
        raise ParameterError(str(error)) from error


def _scheduler(values: Mapping[str, Any]) -> SchedulerConfig:
    """Return the chunking.* values as the scheduler's config; horizon 1 stands for 0 (the policy's) until known."""
    return SchedulerConfig(
        control_rate_hz=values['control_rate_hz'], horizon=values['chunking.horizon'] or 1,
        refill_threshold=values['chunking.refill_threshold'],
        refill_from_latency=values['chunking.refill_from_latency'], blend=values['chunking.blend'],
        blend_weight=values['chunking.blend_weight'], ensemble_decay=values['chunking.ensemble_decay'],
        rtc_max_guidance_weight=values['chunking.rtc_max_guidance_weight'],
        rtc_guidance=values['chunking.rtc_guidance'], execution_horizon=values['chunking.execution_horizon'])


def _motion_limits(values: Mapping[str, Any]) -> MotionLimits:
    """Return the joint limits; max_tracking_error one value >= 0 per joint or one for all (0: not checked)."""
    joints = len(values['joint_names'])
    tracking = values['limits.max_tracking_error']
    if tracking is not None and (len(tracking) not in (1, joints) or not all(v >= 0.0 for v in tracking)):
        raise ParameterError(
            f"parameter 'limits.max_tracking_error' = {list(tracking)} must give one value >= 0 per joint "
            f'({joints}), or one for all (0: not checked)')
    try:
        return MotionLimits(
            lower=np.array(values['limits.lower'], dtype=np.float64),
            upper=np.array(values['limits.upper'], dtype=np.float64),
            max_velocity=np.array(values['limits.max_velocity'], dtype=np.float64),
            max_step=float(values['limits.max_step']),
            max_tracking_error=None if tracking is None else np.broadcast_to(
                np.where(np.array(tracking, dtype=np.float64) > 0.0, tracking, np.inf), joints))
    except SafetyError as error:
        raise ParameterError(f'invalid limits: {error}') from error


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
