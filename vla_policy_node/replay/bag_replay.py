# SPDX-License-Identifier: Apache-2.0
"""
A recorded bag replayed open loop through the policy, as the node would have run it (``vla-policy-replay BAG``).

The bag (an MCAP or sqlite3 ``.db3`` file, or a rosbag2 folder) holds the node's inputs (cameras raw or compressed,
joint states, the instruction) and the commands that were sent (the command groups' topics),
e.g. a teleoperated demonstration recorded with ``ros2 bag record -s mcap``. The parameter
files are the node's: they name the topics, the joints, the units of the training data and the
groups, so the replay sees exactly what the node would.

Every ``period`` seconds of recorded time (default: one chunk horizon), from the first moment
every input has arrived, the policy gets the newest recorded observation, as the node would
hand it over (cameras decoded, state mapped to training units); its chunk, mapped back to
ROS units, predicts the commands from then on: row i for ``t + i / control_rate_hz``, the
first ``horizon`` rows. Each predicted row is compared with the recorded command in force at
its time (the newest one sent at or before it; a trajectory's first point). Open loop: the
predictions never move the recorded robot, and they are the policy's raw output (no clamp).
The report gives, per joint in ROS units, the mean absolute, RMS and largest error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
import math
import time
from typing import Any

import numpy as np
import yaml

from vla_policy_node.replay.bag import read_messages, topic_types
from vla_policy_node.ros.command_groups import ACTION_INTERFACES
from vla_policy_node.ros.compressed import camera_topic, compressed_to_rgb
from vla_policy_node.ros.conversions import image_to_rgb
from vla_policy_node.ros.params import (NodeSettings, PARAMETERS, ParameterError, read_params_file,
                                        settings_from_values)

NODE = '/vla_policy_node'     # the node whose sections of the parameter files apply (no namespace)
NODE_NAME = 'vla_policy_node'    # its ~/episode and ~/command_goals, in the namespace


def absolute(topic: str, namespace: str = '') -> str:
    """Resolve a topic as the node in ``namespace`` does (``camera/x`` -> ``/arm/camera/x``)."""
    namespace = namespace.strip('/')
    return topic if topic.startswith('/') else '/' + '/'.join(filter(None, [namespace, topic.lstrip('~/')]))


def settings_from_files(params_files: Sequence[str], overrides: Sequence[str] = ()) -> NodeSettings:
    """
    Read the node's parameter files (the sections rcl applies to ``/vla_policy_node``) and ``-p`` values.

    Later sources win, as on the command line; parameters given nowhere take their defaults.
    """
    values = {spec.name: spec.default for spec in PARAMETERS
              if not spec.required and not spec.optional}
    for path in params_files:
        values.update(_typed(read_params_file(path, NODE)))
    for assignment in overrides:
        name, sep, text = assignment.partition(':=')
        if not sep:
            raise ParameterError(f"-p {assignment!r}: write name:=value")
        try:
            values.update(_typed({name: yaml.safe_load(text)}))
        except yaml.YAMLError as error:
            raise ParameterError(f'-p {assignment!r}: not a YAML value ({error})'.splitlines()[0]) from None
    return settings_from_values(values)


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    """Refuse a declared parameter's value of another type, as rcl would at the node's start (ParameterError)."""
    from rclpy.parameter import Parameter
    specs = {spec.name: spec for spec in PARAMETERS}
    for name, value in values.items():
        if name not in specs or value == []:
            continue
        expected = specs[name].type
        try:
            kind = Parameter.Type.from_parameter_value(value)
        except TypeError:
            kind = None
        if kind != expected and (kind, expected) not in ((Parameter.Type.INTEGER, Parameter.Type.DOUBLE),
                                                         (Parameter.Type.INTEGER_ARRAY, Parameter.Type.DOUBLE_ARRAY)):
            raise ParameterError(f"parameter '{name}' {specs[name].requirement()}, not {value!r}")
    return values


@dataclass
class Replay:
    """What a replay produced: predictions, recorded commands, per-joint errors."""

    joint_names: tuple[str, ...]
    predicted_times: np.ndarray                 # (N,) s from the first message
    predicted: np.ndarray                       # (N, J) ROS units
    recorded_times: np.ndarray                  # (M,)
    recorded: np.ndarray                        # (M, J), NaN where a group had no command yet
    errors: np.ndarray                          # (N, J) predicted - recorded in force, NaN: none
    chunks: int
    inference_seconds: list[float] = field(default_factory=list)
    goals: dict[str, dict[str, int]] = field(default_factory=dict)     # action group -> CommandGoal events

    def summary(self) -> dict[str, Any]:
        """Per joint: mean absolute, RMS and largest error, and the number of compared points."""
        joints = {}
        for j, name in enumerate(self.joint_names):
            error = self.errors[:, j][np.isfinite(self.errors[:, j])]
            joints[name] = {
                'mae': float(np.mean(np.abs(error))) if error.size else math.nan,
                'rmse': float(np.sqrt(np.mean(error ** 2))) if error.size else math.nan,
                'max_abs': float(np.max(np.abs(error))) if error.size else math.nan,
                'points': int(error.size)}
        latency = np.array(self.inference_seconds) * 1e3
        return {'joints': joints, 'chunks': self.chunks, 'predicted_points': int(len(self.predicted)),
                'recorded_commands': int(len(self.recorded)), 'goals': self.goals,
                'inference_ms_p50': float(np.median(latency)) if latency.size else math.nan}


GOAL_EVENTS = ('sent', 'accepted', 'rejected', 'succeeded', 'aborted', 'canceled', 'no_response')   # CommandGoal


class RecordedInputs:
    """The newest inputs as the node keeps them, the commands recorded so far, the episodes and goals."""

    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.joints = {name: i for i, name in enumerate(settings.joint_names)}
        self.positions = np.full(len(settings.joint_names), np.nan)
        self.frames: dict[str, tuple[str, Any]] = {}
        self.instruction: str | None = None
        self.command = np.full(len(settings.joint_names), np.nan)
        self.command_times: list[float] = []
        self.commands: list[np.ndarray] = []
        self.episodes: list[tuple[int, str | None]] = []        # (number, instruction) of each STARTED
        self.instructions = 0                                    # instructions seen (topic or episode)
        self.goals = {group.name: dict.fromkeys(GOAL_EVENTS, 0) for group in settings.command_groups
                      if group.interface in ACTION_INTERFACES}

    def ready(self) -> bool:
        return (self.instruction is not None and len(self.frames) == len(self.settings.camera_names)
                and bool(np.all(np.isfinite(self.positions))))

    def observation(self) -> dict[str, Any]:
        images = {}
        for camera, (kind, msg) in self.frames.items():
            images[camera] = compressed_to_rgb(msg) if kind == 'compressed' else image_to_rgb(msg)
        state = self.settings.joint_map.state_to_policy(self.positions).astype(np.float32)
        return {'images': images, 'state': state, 'task': self.instruction}

    def on_joint_state(self, msg: Any) -> None:
        for name, value in zip(msg.name, msg.position):
            if name in self.joints:
                self.positions[self.joints[name]] = value

    def on_instruction(self, text: str) -> None:
        self.instruction = text.strip() or None
        if self.instruction is not None:
            self.instructions += 1
            if self.episodes and self.episodes[-1][1] is None:
                self.episodes[-1] = (self.episodes[-1][0], self.instruction)

    def on_episode(self, msg: Any) -> None:
        """Take an Episode: STARTED, its instruction applies; ENDED, the robot holds (nothing to compare)."""
        if msg.event == 0:
            self.episodes.append((msg.episode, None))
            self.on_instruction(msg.instruction)
        else:
            self.instruction = None

    def on_goal(self, msg: Any, t: float) -> None:
        """Count a CommandGoal event; a SENT goal's trajectory is its group's command."""
        group = next((g for g in self.settings.command_groups if g.name == msg.group), None)
        if group is None or group.name not in self.goals or msg.event >= len(GOAL_EVENTS):
            return
        self.goals[group.name][GOAL_EVENTS[msg.event]] += 1
        if msg.event == 0:
            self.on_command(group, msg.trajectory, t)

    def on_command(self, group: Any, msg: Any, t: float) -> None:
        if isinstance(getattr(msg, 'points', None), list):
            if not msg.points:
                return
            names = list(msg.joint_names) or list(group.joints)      # a gripper_command goal names no joint
            values = dict(zip(names, msg.points[0].positions))
            row = [values.get(joint, math.nan) for joint in group.joints]
        else:
            row = list(msg.data)
        if len(row) != len(group.joints):
            return
        self.command[list(group.indices)] = row
        self.command_times.append(t)
        self.commands.append(self.command.copy())

    def check(self, names: dict[str, str]) -> None:
        """Refuse (ValueError) a bag whose episodes, or which, have no instruction: the policy would have no task."""
        missing = [number for number, instruction in self.episodes if instruction is None]
        if missing:
            raise ValueError(f'episode(s) {missing} of {names["episode"]} have no instruction (none in the episode '
                             f'and none on {names["instruction"]}): the policy would have no task')
        if not self.instructions:
            raise ValueError(f'the bag holds no instruction (none on {names["instruction"]} or {names["episode"]}): '
                             'the policy would have no task')


@dataclass(frozen=True)
class NodeTopics:
    """The bag's topic names of what the node reads and commands, resolved in its namespace."""

    cameras: dict[str, tuple[str, str]]     # topic -> (camera name, transport)
    groups: dict[str, Any]                  # topic -> topic command group
    joints: str
    instruction: str
    episode: str
    goals: str
    actions: bool                           # some group commands through an action (CommandGoal)

    @staticmethod
    def of(settings: NodeSettings, namespace: str = '', node: str = NODE_NAME) -> NodeTopics:
        """Resolve the node's topics (its ~/episode and ~/command_goals under ``node``)."""
        return NodeTopics(
            cameras={absolute(camera_topic(topic, transport), namespace): (name, transport) for topic, name, transport
                     in zip(settings.camera_topics, settings.camera_names, settings.camera_transports)},
            groups={absolute(group.topic, namespace): group for group in settings.command_groups
                    if group.interface not in ACTION_INTERFACES},
            joints=absolute(settings.joint_states_topic, namespace),
            instruction=absolute(settings.instruction_topic, namespace),
            episode=absolute(f'{node}/episode', namespace), goals=absolute(f'{node}/command_goals', namespace),
            actions=any(group.interface in ACTION_INTERFACES for group in settings.command_groups))

    def all(self) -> set[str]:
        """Every topic replay reads."""
        return {*self.cameras, *self.groups, self.joints, self.instruction, self.episode, self.goals}

    def latched(self) -> set[str]:
        """Return the transient-local topics, read by publish time (``latched``): a late reader receives them late."""
        return {self.instruction, self.episode}

    def expected(self) -> dict[str, str]:
        """Topic -> the type the node uses, for every topic replay reads."""
        return {self.joints: 'sensor_msgs/msg/JointState', self.instruction: 'std_msgs/msg/String',
                self.episode: 'vla_policy_interfaces/msg/Episode', self.goals: 'vla_policy_interfaces/msg/CommandGoal',
                **{topic: 'sensor_msgs/msg/CompressedImage' if transport == 'compressed' else 'sensor_msgs/msg/Image'
                   for topic, (_, transport) in self.cameras.items()},
                **{topic: 'trajectory_msgs/msg/JointTrajectory' if group.interface == 'joint_trajectory'
                   else 'std_msgs/msg/Float64MultiArray' for topic, group in self.groups.items()}}

    def dispatch(self, inputs: RecordedInputs, topic: str, msg: Any, t: float) -> None:
        """Hand one recorded message to the inputs as the node would take it."""
        if topic in self.cameras:
            name, transport = self.cameras[topic]
            inputs.frames[name] = (transport, msg)
        elif topic == self.joints:
            inputs.on_joint_state(msg)
        elif topic == self.instruction:
            inputs.on_instruction(msg.data)
        elif topic == self.episode:
            inputs.on_episode(msg)
        elif topic == self.goals:
            inputs.on_goal(msg, t)
        elif topic in self.groups:
            inputs.on_command(self.groups[topic], msg, t)


def check_bag(bag: str, settings: NodeSettings, namespace: str = '', node: str = NODE_NAME) -> None:
    """Raise ValueError (BagError for an unreadable file) unless ``bag`` holds every topic the node reads, typed."""
    topics = NodeTopics.of(settings, namespace, node)
    present = topic_types(bag)
    needed = [*topics.cameras, topics.joints, *topics.groups] + ([topics.goals] if topics.actions else [])
    missing = [t for t in needed if t not in present]
    if topics.instruction not in present and topics.episode not in present:
        missing.append(f'{topics.instruction} or {topics.episode}')
    if missing:
        raise ValueError(f'the bag has no topics {missing} (it has {sorted(present)})')
    wrong = [f'{topic} carries {present[topic]}, not {kind}' for topic, kind in topics.expected().items()
             if topic in present and present[topic] != kind]
    if wrong:
        raise ValueError(f"the bag's topics do not carry what the node reads: {'; '.join(wrong)}")


def replay(bag: str, settings: NodeSettings, policy: Any, period: float | None = None,
           namespace: str = '', node: str = NODE_NAME) -> Replay:
    """
    Run ``policy`` open-loop over ``bag``'s recorded observations; compare with its commands.

    ValueError if an episode (or the whole bag) has no instruction, or no observation was ever complete.
    """
    dt = 1.0 / settings.control_rate_hz
    horizon = settings.horizon or policy.chunk_size
    period = period or horizon * dt
    topics = NodeTopics.of(settings, namespace, node)
    check_bag(bag, settings, namespace, node)
    inputs = RecordedInputs(settings)
    start, next_observation = None, None
    predicted_times, predicted, latencies = [], [], []

    def infer(at: float) -> None:
        started = time.perf_counter()
        chunk = np.asarray(policy.predict_action_chunk(inputs.observation()), dtype=np.float64)[0]
        latencies.append(time.perf_counter() - started)
        rows = settings.joint_map.action_to_ros(chunk[:horizon])
        predicted_times.extend(at + dt * np.arange(len(rows)))
        predicted.extend(rows)

    for topic, _, msg, stamp in read_messages(bag, topics.all(), topics.latched()):
        start = stamp if start is None else start
        t = (stamp - start) * 1e-9
        while next_observation is not None and t > next_observation:
            if inputs.ready():
                infer(next_observation)
            next_observation += period
        topics.dispatch(inputs, topic, msg, t)
        if next_observation is None and inputs.ready():
            next_observation = t
    inputs.check({'instruction': topics.instruction, 'episode': topics.episode})
    if not latencies:
        raise ValueError('no moment of the bag holds every input the node reads (an instruction, a frame of every '
                         'camera, every joint): nothing to replay')
    recorded_times = np.array(inputs.command_times)
    recorded = np.array(inputs.commands).reshape(-1, len(settings.joint_names))
    times = np.array(predicted_times)
    predictions = np.array(predicted).reshape(-1, len(settings.joint_names))
    errors = np.full_like(predictions, np.nan)
    if len(recorded) and len(times):
        index = np.searchsorted(recorded_times, times, side='right') - 1
        valid = index >= 0
        errors[valid] = predictions[valid] - recorded[index[valid]]
    return Replay(settings.joint_names, times, predictions, recorded_times, recorded, errors,
                  chunks=len(latencies), inference_seconds=latencies, goals=inputs.goals)


def plot(result: Replay, path: str) -> None:
    """Write a PNG: per joint, the recorded commands and the predicted chunks over time."""
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot

    joints = len(result.joint_names)
    figure, axes = pyplot.subplots(joints, 1, figsize=(10, 1.9 * joints), sharex=True, squeeze=False)
    summary = result.summary()['joints']
    for j, (axis, name) in enumerate(zip(axes[:, 0], result.joint_names)):
        axis.step(result.recorded_times, result.recorded[:, j], where='post', color='black',
                  linewidth=1.2, label='recorded command')
        axis.plot(result.predicted_times, result.predicted[:, j], '.', color='tab:orange',
                  markersize=3, label='predicted (open loop)')
        axis.set_ylabel(name, fontsize=8)
        axis.set_title(f"{name}: MAE {summary[name]['mae']:.4g}, max {summary[name]['max_abs']:.4g} "
                       '(ROS units)', fontsize=8, loc='left')
    axes[0, 0].legend(fontsize=7, loc='upper right')
    axes[-1, 0].set_xlabel('time in the bag (s)')
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    pyplot.close(figure)
