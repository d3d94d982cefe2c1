# SPDX-License-Identifier: Apache-2.0
"""
The declared parameters of the policy node: one ``ParamSpec`` per parameter, with its descriptor.

Every tunable is declared here with a description, a type and a range, so that
``ros2 param describe`` explains it and out-of-range values are refused by rclpy itself.
The validation and typed settings built from the values are ``ros.params``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.parameter import Parameter

from vla_policy_node.control.chunking import BLEND_MODES, RTC_GUIDANCE
from vla_policy_node.model.preprocessing import MAX_TASK_CHARS
from vla_policy_node.ros.command_groups import COMMAND_INTERFACES, group_parameter
from vla_policy_node.runtime.devices import DTYPES

CAMERA_TRANSPORTS = ('raw', 'compressed')
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
              '<server>/chunks, <server>/heartbeat).'),
    ParamSpec('remote.servers', Parameter.Type.STRING_ARRAY, 'More vla_policy_server nodes '
              '(fully qualified names, e.g. one per GPU) that share the fleet with remote.server: '
              'each request goes to the live server of the pool ranking highest for this robot '
              '(rendezvous hashing: robots split evenly and move only when their server is lost).',
              optional=True),
    ParamSpec('remote.server_timeout', 0.5, 'Seconds without a heartbeat after which a policy '
              'server counts as lost: its request in flight fails at once and the next goes to '
              'another live server. Above the servers\' heartbeat_period (0.1 s).', bounds=(0.05, 10.0)),
    ParamSpec('remote.fleet_key_file', '', 'File holding the fleet key shared with the policy servers '
              '(at least 16 bytes, not readable by every user; e.g. openssl rand -hex 32): requests are '
              'signed with it (HMAC-SHA256) and only signed answers and heartbeats are taken. Empty: no '
              'key (answers are bound to the server\'s publisher and to the request\'s digest).'),
    ParamSpec('checkpoint', '', 'Checkpoint folder to load; empty builds the tiny model with '
              'RANDOM weights, which starts only with allow_random_weights.'),
    ParamSpec('allow_random_weights', False, 'Let the tiny model with random weights (empty '
              'checkpoint) command the robot: for plumbing and timing tests only. Without it an '
              'empty checkpoint stops the node at start-up.'),
    ParamSpec('checkpoint_root', '', 'Folder the checkpoint must lie in (resolved, symlinks '
              'followed); empty allows any folder.'),
    ParamSpec('device', 'auto', 'Torch device: auto, cpu, cuda or cuda:N. CUDA falls back to '
              'the CPU, with a log line, where no GPU exists.'),
    ParamSpec('dtype', 'float32', 'Weights and activation dtype; int8: int8 linear weights, float32 '
              'activations (CPU only).', choices=DTYPES),
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
    ParamSpec('trace', True, 'On the CPU, trace the eager chunk (TorchScript) in the warm-up, '
              'one trace per prompt length bucket, and replay it: the same ops without Python between them '
              'and with the GIL released. A trace is kept only where it gives eager\'s bits on other inputs.'),
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
    ParamSpec('task_success_topic', 'task_success', 'vla_policy_interfaces/TaskSuccess topic on which the '
              'robot (or a success detector) says the task of an episode succeeded: it ends the running '
              'RunInstruction goal as SUCCEEDED only when it names the goal\'s episode (~/episode) and is '
              'stamped at or after the goal\'s acceptance.'),
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
              'joint_trajectory (trajectory_msgs/JointTrajectory, joint_trajectory_controller), '
              'forward_command (std_msgs/Float64MultiArray, forward_command_controller), '
              'follow_joint_trajectory (the control_msgs/FollowJointTrajectory action of '
              'joint_trajectory_controller) or gripper_command (the control_msgs/GripperCommand '
              'action of gripper_action_controller, one joint); command_topic is then the action name.',
              choices=COMMAND_INTERFACES),
    ParamSpec('gripper_max_effort', 0.0, 'max_effort of each gripper_command goal, sent as is: an '
              'effort-controlled gripper is limited to it (0 squeezes with no force), a '
              'position-controlled one reads it for stall detection.', bounds=(0.0, 1e6)),
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
    ParamSpec('chunking.refill_from_latency', True, 'Ask for the next chunk no later than when the '
              'actions left just cover the measured chunk latency (plus a tick), whatever refill_threshold: '
              'a slow policy then keeps the robot fed where any threshold could. Never asks later.'),
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
    ParamSpec('limits.max_tracking_error', [0.5],
              'How far each joint may be measured from the point its controller executes while '
              'the node commands; further (a controller switched off or silently not following, a joint '
              'blocked or pushed), a latched protective stop holds until ~/restart_from_measured. One entry '
              'applies to every joint; 0: not checked (a gripper that squeezes what it holds).',
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
                      f'Interface of command group {name}: joint_trajectory, forward_command, '
                      'follow_joint_trajectory or gripper_command (see command_interface).',
                      choices=COMMAND_INTERFACES),
            ParamSpec(group_parameter(name, 'topic'), Parameter.Type.STRING,
                      f'Topic (or action name) of command group {name} (e.g. '
                      'arm_controller/joint_trajectory, gripper_controller/gripper_cmd).'),
        ]
    return tuple(specs)


def all_specs(values: Mapping[str, Any]) -> tuple[ParamSpec, ...]:
    """Every parameter ``values`` calls for: the fixed ones and its command groups'."""
    return PARAMETERS + command_group_specs(values.get('commands.groups') or ())
