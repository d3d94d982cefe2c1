# SPDX-License-Identifier: Apache-2.0
r"""
A recorded bag exported as a LeRobotDataset v3.0: ``vla-policy-replay BAG --export-dataset OUT``.

    vla-policy-replay run.mcap --params-file config/so101.yaml --export-dataset ~/datasets/so101_runs \\
        [--fps 30] [--leader /leader/joint_states] [--gap 1.0] [--codec av1]

The bag is read as the node reads it (its parameter files name the topics, joints, groups and
``joint_units``), so ``vla-policy-record`` output and ``ros2 bag`` recordings of the same topics
export alike. Every ``1 / fps`` seconds (default: ``control_rate_hz``) from the first moment every
input is there, one frame is taken: each camera's newest image, ``observation.state`` (the joint
states) and ``action`` in the dataset units of ``joint_units`` (an SO-101 export is in LeRobot's
degrees and gripper 0-100), the action being the command in force (the command groups' topics or
their ``~/command_goals`` trajectories) or, for teleoperation, the named leader's joint states.
A new episode starts at each ``~/episode`` STARTED (a task goal, an instruction, ``~/reset_episode``),
at an instruction change, and after a gap of ``--gap`` seconds without joint states; ``~/episode``
ENDED ends one. Refused, with the reason and nothing written: no instruction, no commands (and no
leader), a camera whose newest frame is older than two frames at a tick (rates that cannot be
aligned), a camera changing size, nothing complete to export.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from vla_policy_node.dataset.writer import CODECS, DatasetWriter
from vla_policy_node.replay.bag import read_messages, topic_types
from vla_policy_node.replay.bag_replay import NODE_NAME, NodeTopics, RecordedInputs


class ExportError(ValueError):
    """A bag that cannot be exported as a dataset, with the reason."""


class _Sampler:
    """The inputs as the node keeps them, sampled every 1 / fps into the writer's episodes."""

    def __init__(self, settings: Any, topics: NodeTopics, fps: int, gap: float, leader: str | None,
                 writer: DatasetWriter) -> None:
        self.settings, self.topics, self.fps, self.gap, self.leader = settings, topics, fps, gap, leader
        self.writer = writer
        self.inputs = RecordedInputs(settings)
        self.joints = {name: i for i, name in enumerate(settings.joint_names)}
        self.leader_positions = np.full(len(settings.joint_names), np.nan)
        self.frame_times: dict[str, float] = {}
        self.joint_time = -math.inf
        self.episodes: list[tuple[str, int]] = []         # (task, frames) of each episode written
        self.task: str | None = None                        # the episode being written's, None: none is
        self.start: float | None = None           # the first tick; tick k is at start + k / fps
        self.ticks = 0

    def action(self) -> np.ndarray:
        ros = self.leader_positions if self.leader else self.inputs.command
        return self.settings.joint_map.action_to_policy(ros)

    def ready(self) -> bool:
        return self.inputs.ready() and bool(np.all(np.isfinite(self.action())))

    def close(self) -> None:
        self.writer.end_episode()
        self.task = None

    def take(self, topic: str, msg: Any, t: float) -> None:
        """Sample the ticks before ``t``, then hand the message over."""
        while self.start is not None and t > self.start + self.ticks / self.fps:
            self.tick(self.start + self.ticks / self.fps)
            self.ticks += 1
        if topic == self.leader:
            for name, value in zip(msg.name, msg.position):
                if name in self.joints:
                    self.leader_positions[self.joints[name]] = value
            return
        if topic == self.topics.episode:
            self.close()
        elif topic == self.topics.joints:
            self.joint_time = t
        elif topic in self.topics.cameras:
            self.frame_times[self.topics.cameras[topic][0]] = t
        self.topics.dispatch(self.inputs, topic, msg, t)
        if self.start is None and self.ready():
            self.start = t

    def tick(self, t: float) -> None:
        if t - self.joint_time > self.gap or not self.ready():
            self.close()
            return
        task = self.inputs.instruction
        if self.task is not None and self.task != task:
            self.close()
        for camera, stamp in self.frame_times.items():
            if t - stamp > 2.0 / self.fps:
                raise ExportError(f'camera {camera!r}: its newest frame is {t - stamp:.3f} s old at {t:.3f} s into '
                                  f'the bag, more than two frames at {self.fps} fps: its rate cannot be aligned '
                                  '(export at a lower --fps)')
        if self.task is None:
            self.writer.start_episode(task)
            self.task = task
            self.episodes.append((task, 0))
        observation = self.inputs.observation()
        try:
            self.writer.add_frame(observation['state'], self.action(), observation['images'])
        except ValueError as error:
            raise ExportError(f'{error} (at {t:.3f} s into the bag)') from None
        self.episodes[-1] = (task, self.episodes[-1][1] + 1)


def export_bag(bag: str, settings: Any, output: str | Path, fps: float | None = None, leader: str | None = None,
               gap: float = 1.0, codec: str = 'av1', robot_type: str | None = None, namespace: str = '',
               node: str = NODE_NAME) -> list[tuple[str, int]]:
    """Export ``bag`` to a LeRobotDataset at ``output``; return (task, frames) per episode. ExportError if refused."""
    fps = settings.control_rate_hz if fps is None else fps
    if fps <= 0 or not float(fps).is_integer():
        raise ExportError(f'fps {fps:g}: a LeRobotDataset has a whole number of frames per second (--fps)')
    if codec not in CODECS:
        raise ExportError(f'codec {codec!r}: one of {sorted(CODECS)}')
    if Path(output).exists():
        raise ExportError(f'{output} exists: give a new folder')
    topics = NodeTopics.of(settings, namespace, node)
    _check_topics(bag, topics, leader)
    names = [f'{joint}.pos' for joint in settings.joint_names]
    with DatasetWriter(output, int(fps), names, names, robot_type, codec) as writer:
        sampler = _Sampler(settings, topics, int(fps), gap, leader, writer)
        start = None
        read = topics.all() | ({leader} if leader else set())
        for topic, _, msg, stamp in read_messages(bag, read, topics.latched()):
            start = stamp if start is None else start
            sampler.take(topic, msg, (stamp - start) * 1e-9)
        sampler.close()
        try:
            sampler.inputs.check({'instruction': topics.instruction, 'episode': topics.episode})
        except ValueError as error:
            raise ExportError(str(error)) from None
        if not sampler.episodes:
            raise ExportError('no moment of the bag holds every input and an action (an instruction, a frame of '
                              'every camera, every joint, a command of every group or the leader): nothing to export')
        writer.finish()
    return sampler.episodes


def _check_topics(bag: str, topics: NodeTopics, leader: str | None) -> None:
    present = topic_types(bag)
    missing = [t for t in [*topics.cameras, topics.joints] if t not in present]
    if leader is not None and leader not in present:
        missing.append(leader)
    if missing:
        raise ExportError(f'the bag has no topics {missing} (it has {sorted(present)})')
    if leader is None and not any(t in present for t in topics.groups) and topics.goals not in present:
        raise ExportError(f'the bag holds no commands (none of {sorted(topics.groups)} or {topics.goals}): there is '
                          'no action to export; for a teleoperated demonstration name the leader (--leader TOPIC)')
    if topics.instruction not in present and topics.episode not in present:
        raise ExportError(f'the bag holds no instruction (no {topics.instruction} or {topics.episode}): a dataset '
                          'episode needs its task')
