# SPDX-License-Identifier: Apache-2.0
"""
Declared parameters of the policy node: descriptors with ranges, validation, typed settings.

Every tunable is declared here with a description, a type and a range, so that
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
from dataclasses import dataclass
import re
from typing import Any

import numpy as np
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import ParameterException, ParameterUninitializedException
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.validate_topic_name import validate_topic_name
import yaml

from vla_policy_node.control.chunking import BLEND_MODES, RTC_GUIDANCE
from vla_policy_node.control.joint_map import JointMap
from vla_policy_node.model.preprocessing import MAX_TASK_CHARS
from vla_policy_node.control.safety import MotionLimits, SafetyError
from vla_policy_node.ros.command_groups import (check_group_names, COMMAND_INTERFACES, command_groups_from_values,
                                                CommandGroup, group_parameter)

CAMERA_TRANSPORTS = ('raw', 'compressed')
DTYPES = ('float32', 'bfloat16', 'float16')
INFERENCE = ('local', 'remote')


class ParameterError(ValueError):
    """A parameter value, or a combination of values, that the node refuses to run with."""


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter: its default (or required type), description and bounds."""

    name: str
    default: Any
    description: str
    read_only: bool = True
    bounds: tuple[float, float] | None = None
    choices: tuple[str, ...] = ()
    # No default, and none needed: absent means "not used". Read-only, and declared only when
    # given: rclpy answers a request for several parameters with nothing when one is declared
    # without a value, so `ros2 param dump` would print no parameter at all.
    optional: bool = False

    @property
    def required(self) -> bool:
        """Tell whether the parameter has no default (it describes the robot: from YAML)."""
        return isinstance(self.default, Parameter.Type) and not self.optional

    @property
    def type(self) -> Parameter.Type:
        """Return the ROS type every value of this parameter must have."""
        if isinstance(self.default, Parameter.Type):
            return self.default
        return Parameter.Type.from_parameter_value(self.default)

    def requirement(self) -> str:
        """Say in words what a valid value looks like, for error messages."""
        kind = _type_name(self.type)
        text = f"must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}"
        if self.bounds is not None:
            text += f' in [{self.bounds[0]}, {self.bounds[1]}]'
        if self.choices:
            text += f" (one of {', '.join(self.choices)})"
        return text

    def descriptor(self) -> ParameterDescriptor:
        """Build the ROS descriptor, with a range where the parameter has one."""
        descriptor = ParameterDescriptor(
            name=self.name, description=self.description, read_only=self.read_only)
        if self.choices:
            descriptor.additional_constraints = f"one of: {', '.join(self.choices)}"
        if self.bounds is not None:
            low, high = self.bounds
            if isinstance(self.default, int) and not isinstance(self.default, bool):
                descriptor.integer_range = [IntegerRange(from_value=int(low), to_value=int(high))]
            else:
                descriptor.floating_point_range = [
                    FloatingPointRange(from_value=float(low), to_value=float(high))]
        return descriptor


def _type_name(kind: Parameter.Type) -> str:
    return kind.name.lower().replace('_', ' ')


PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec('inference', 'local', 'local runs the policy in this node; remote sends chunk '
              'requests to a vla_policy_server (remote.server) and keeps every safety decision '
              'here. Remote needs chunking.horizon > 0; the policy parameters are then the '
              'server\'s.', choices=INFERENCE),
    ParamSpec('remote.server', '/vla_policy_server', 'Fully qualified name of the '
              'vla_policy_server node for inference remote (topics <server>/requests, '
              '<server>/chunks).'),
    ParamSpec('checkpoint', '', 'Checkpoint folder to load; empty builds the tiny model with '
              'RANDOM weights, which starts only with allow_random_weights.'),
    ParamSpec('allow_random_weights', False, 'Let the tiny model with random weights (empty '
              'checkpoint) command the robot: for plumbing and timing tests only. Without it an '
              'empty checkpoint stops the node at start-up.'),
    ParamSpec('checkpoint_root', '', 'Folder the checkpoint must lie in (resolved, symlinks '
              'followed); empty allows any folder.'),
    ParamSpec('device', 'auto', 'Torch device: auto, cpu, cuda or cuda:N. CUDA falls back to '
              'the CPU, with a log line, where no GPU exists.'),
    ParamSpec('dtype', 'float32', 'Weights and activation dtype.', choices=DTYPES),
    ParamSpec('cuda_graphs', True, 'On CUDA, capture the prefix pass and the denoising loop as '
              'CUDA graphs during the warm-up, before the node reports ready (rtc stays eager). For '
              'checkpoints padding to the longest, one capture per prompt length bucket.'),
    ParamSpec('compile', False, 'Compile the prefix pass and the denoising loop ahead of time '
              '(torch.export + AOTInductor) during the warm-up, before the node reports ready. '
              'Pays off on the CPU for small models; needs a C++ compiler and Python headers (on CUDA, '
              'cuda_graphs wins) and '
              'off with chunking.blend rtc (guided sampling is eager). Kept only where the warm-up '
              'measures it at least as fast as eager. Falls back to eager, with a warning, when '
              'compiling fails.'),
    ParamSpec('compile_cache_dir', '', 'Folder of the compiled programs kept across starts '
              '(with compile); empty: $VLA_POLICY_NODE_CACHE_DIR, else '
              '$XDG_CACHE_HOME/vla_policy_node, else ~/.cache/vla_policy_node.'),
    ParamSpec('num_threads', 0, 'Torch CPU threads at most (the warm-up may keep fewer for an '
              'eager policy, if faster); 0 keeps torch\'s default.',
              bounds=(0, 256)),
    ParamSpec('tiny_model.chunk_size', 16, 'Actions per chunk of the tiny random model.',
              bounds=(1, 256)),
    ParamSpec('tiny_model.num_steps', 5, 'Flow-matching Euler steps of the tiny random model.',
              bounds=(1, 100)),
    ParamSpec('tiny_model.seed', 0, 'Seed of the tiny random model\'s weights.',
              bounds=(0, 2**31 - 1)),
    ParamSpec('camera_topics', Parameter.Type.STRING_ARRAY,
              'sensor_msgs/Image topics, one per camera the policy sees.'),
    ParamSpec('camera_names', Parameter.Type.STRING_ARRAY,
              'Policy camera feature for each topic, in the same order ("front" means '
              '"observation.images.front").'),
    ParamSpec('camera_transports', ['raw'],
              'Per camera topic: raw (sensor_msgs/Image on the topic) or compressed '
              '(sensor_msgs/CompressedImage, jpeg or png as image_transport publishes it, on '
              '<topic>/compressed; a topic already ending in /compressed is used as it is). '
              'One entry applies to every camera.'),
    ParamSpec('instruction_topic', 'instruction',
              'std_msgs/String topic carrying the task (reliable, transient local).'),
    ParamSpec('joint_states_topic', 'joint_states', 'sensor_msgs/JointState topic; relative names '
              'follow the node\'s namespace and remaps.'),
    ParamSpec('joint_names', Parameter.Type.STRING_ARRAY,
              'Joints in the order of the policy\'s state and action vectors.'),
    ParamSpec('joint_units.scale', Parameter.Type.DOUBLE_ARRAY,
              'Per joint: policy units = (ROS units - offset) * scale, for the state; the '
              'inverse for actions (e.g. 57.29578 for a policy trained in degrees). Absent: 1. '
              'Limits stay in ROS units.', optional=True),
    ParamSpec('joint_units.offset', Parameter.Type.DOUBLE_ARRAY,
              'Per joint, in ROS units: the ROS position that is 0 for the policy. Absent: 0.',
              optional=True),
    ParamSpec('commands.groups', Parameter.Type.STRING_ARRAY,
              'Names of command groups, one per controller; each has commands.<name>.joints, '
              '.interface and .topic. Absent: one group of every joint on command_interface / '
              'command_topic.', optional=True),
    ParamSpec('trajectory_velocities', False, 'joint_trajectory groups: give each point '
              'velocities (finite differences of the safe points, 0 at the last one), so '
              'joint_trajectory_controller interpolates with splines instead of linearly.'),
    ParamSpec('command_interface', 'joint_trajectory',
              'joint_trajectory (trajectory_msgs/JointTrajectory, joint_trajectory_controller) '
              'or forward_command (std_msgs/Float64MultiArray, forward_command_controller).',
              choices=COMMAND_INTERFACES),
    ParamSpec('command_topic', 'joint_trajectory_controller/joint_trajectory',
              'Topic the joint commands are published on.'),
    ParamSpec('trajectory_points', 0, 'For command_interface joint_trajectory: planned actions '
              'sent as timed points each control tick, this tick\'s first; 0 sends all queued.',
              read_only=False, bounds=(0, 256)),
    ParamSpec('control_rate_hz', 20.0, 'Rate at which actions are executed from the chunk '
              'queue.', bounds=(1.0, 1000.0)),
    ParamSpec('chunking.horizon', 0, 'Actions executed from each chunk before it is replaced; '
              '0 uses the whole chunk.', bounds=(0, 256)),
    ParamSpec('chunking.refill_threshold', 0.5, 'Request the next chunk when this fraction of '
              'the horizon is left.', bounds=(0.0, 1.0)),
    ParamSpec('chunking.blend', 'latest', 'How a new chunk joins the queued actions.',
              choices=BLEND_MODES),
    ParamSpec('chunking.blend_weight', 0.5, 'Weight of the new chunk for blend=weighted.',
              bounds=(0.0, 1.0)),
    ParamSpec('chunking.ensemble_decay', 0.1, 'Exponential decay for blend=temporal_ensemble.',
              bounds=(0.0, 10.0)),
    ParamSpec('chunking.rtc_max_guidance_weight', 10.0, 'Clip of the real-time chunking '
              'guidance weight for blend=rtc.', bounds=(0.01, 100.0)),
    ParamSpec('chunking.rtc_guidance', 'paper', 'Real-time chunking guidance for blend=rtc: '
              'paper (vector-Jacobian product) or lerobot (LeRobot\'s RTCProcessor: no Jacobian, '
              'linear prefix weights, padded action dims pulled to 0).', choices=RTC_GUIDANCE),
    ParamSpec('chunking.execution_horizon', 10, 'With rtc_guidance lerobot: how many of the committed '
              'actions guide the new chunk (LeRobot\'s rtc_config.execution_horizon, default 10); the '
              'paper\'s guidance uses all of them.', bounds=(1, 1024)),
    ParamSpec('max_observation_age', 0.5, 'Seconds after which an input counts as stale; no '
              'command is computed or sent from stale inputs.', read_only=False,
              bounds=(0.01, 10.0)),
    ParamSpec('max_action_age', 0.0, 'Seconds an action\'s observation may be old when the '
              'action executes; older plans are dropped and the robot holds. 0 derives it: '
              'max_observation_age + horizon / control_rate_hz. Chunks that arrive more than '
              'max_observation_age after their observation are refused in any case.',
              read_only=False, bounds=(0.0, 60.0)),
    ParamSpec('use_header_stamps', True, 'Also judge camera frames and joint states by their '
              'header stamps: refuse messages whose stamp goes backwards or is older than '
              'max_observation_age on the node\'s clock (zero stamps are judged by arrival '
              'only). Set false for sources whose clock is not synchronised with this '
              'node\'s. Run time: may be switched on, not off.', read_only=False),
    ParamSpec('policy_deadline', 5.0, 'Seconds one inference may take; a later chunk is '
              'discarded (the robot holds) and the next control step tries again. With inference '
              'remote, the server\'s answer is awaited at most min(policy_deadline, max_observation_age) '
              '(policy_deadline alone with use_sim_time).',
              read_only=False, bounds=(0.001, 60.0)),
    ParamSpec('reset_on_instruction_change', True, 'Start a new episode (reset cache and '
              'queue) when the instruction changes.', read_only=False),
    ParamSpec('max_instruction_length', 2000, 'Longer instructions are refused (the policy '
              'preprocessing accepts at most MAX_TASK_CHARS).',
              read_only=False, bounds=(1, MAX_TASK_CHARS)),
    ParamSpec('limits.lower', Parameter.Type.DOUBLE_ARRAY,
              'Lower position limit per joint (same order as joint_names).', read_only=False),
    ParamSpec('limits.upper', Parameter.Type.DOUBLE_ARRAY,
              'Upper position limit per joint (same order as joint_names).', read_only=False),
    ParamSpec('limits.max_velocity', Parameter.Type.DOUBLE_ARRAY,
              'Maximum speed per joint (units per second).', read_only=False),
    ParamSpec('limits.max_step', 0.1, 'Maximum change of any joint between two commands.',
              read_only=False, bounds=(1e-6, 10.0)),
    ParamSpec('limits.max_tracking_error', [0.0],
              'How far each joint may be measured from the point its controller executes while '
              'the node commands; further, the node holds (a controller switched off, a joint '
              'blocked or pushed) until it is back. One entry applies to every joint; 0: not '
              'checked (a gripper that squeezes what it holds).',
              read_only=False),
    ParamSpec('diagnostics_period', 1.0, 'Seconds between /diagnostics messages.',
              bounds=(0.1, 60.0)),
)

SPECS = {spec.name: spec for spec in PARAMETERS}
# Parameters every ROS 2 node has (rclpy declares them): a `ros2 param dump` of the node lists
# them, so a params file made from one must start the node.
ROS_NODE_PARAMETERS = frozenset({'use_sim_time', 'start_type_description_service'})


def command_group_specs(names: Iterable[str]) -> tuple[ParamSpec, ...]:
    """Return the parameters of the command groups ``names`` (declared once the names are known)."""
    specs = []
    for name in names:
        specs += [
            ParamSpec(group_parameter(name, 'joints'), Parameter.Type.STRING_ARRAY,
                      f'Joints of command group {name}, in its controller\'s joint order.'),
            ParamSpec(group_parameter(name, 'interface'), 'joint_trajectory',
                      f'Message of command group {name}: joint_trajectory or forward_command.',
                      choices=COMMAND_INTERFACES),
            ParamSpec(group_parameter(name, 'topic'), Parameter.Type.STRING,
                      f'Topic of command group {name} (e.g. arm_controller/joint_trajectory).'),
        ]
    return tuple(specs)


def all_specs(values: Mapping[str, Any]) -> tuple[ParamSpec, ...]:
    """Every parameter ``values`` calls for: the fixed ones and its command groups'."""
    return PARAMETERS + command_group_specs(values.get('commands.groups') or ())


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


@dataclass(frozen=True)
class NodeSettings:
    """Validated parameter values, the only form in which the node reads its configuration."""

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
    camera_topics: tuple[str, ...]
    camera_names: tuple[str, ...]
    instruction_topic: str
    joint_states_topic: str
    joint_names: tuple[str, ...]
    camera_transports: tuple[str, ...]      # one per camera topic
    joint_map: JointMap
    command_groups: tuple[CommandGroup, ...]
    trajectory_velocities: bool
    command_interface: str
    command_topic: str
    trajectory_points: int
    control_rate_hz: float
    chunking: ChunkingSettings
    max_observation_age: float
    max_action_age: float
    use_header_stamps: bool
    policy_deadline: float
    reset_on_instruction_change: bool
    max_instruction_length: int
    limits: MotionLimits
    diagnostics_period: float
    inference: str = 'local'
    remote_server: str = '/vla_policy_server'


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
    if remote and not values['remote.server'].startswith('/'):
        raise ParameterError(f"parameter 'remote.server' = '{values['remote.server']}' must be a "
                             "fully qualified node name, e.g. '/vla_policy_server'")
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
    for key in ('instruction_topic', 'joint_states_topic', 'command_topic'):
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
        joint_states_topic=values['joint_states_topic'],
        joint_names=joints,
        camera_transports=transports,
        joint_map=joint_map,
        command_groups=groups,
        trajectory_velocities=values['trajectory_velocities'],
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
        remote_server=values['remote.server'],
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
