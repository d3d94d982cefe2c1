# SPDX-License-Identifier: Apache-2.0
"""
A made-up recorded episode for ``vla-policy-replay``'s tests and benchmark.

    python -m benchmarks.synthetic_bag demo.mcap --params-file config/default.yaml
"""

from __future__ import annotations

import os
from pathlib import Path
import sys
from typing import Any

from benchmarks.decode import scene
from vla_policy_node.replay.bag import BagWriter


def write_synthetic_episode(path: str | os.PathLike, settings: Any, seconds: float = 3.0,
                            image_size: tuple[int, int] = (48, 64), camera_hz: float = 15.0,
                            joint_hz: float = 50.0, command_hz: float = 20.0,
                            task: str = 'pick up the red cube', later_tasks: tuple[str, ...] = ()) -> None:
    """
    Record a made-up episode for ``settings`` (the node's): what its topics would carry.

    Joints follow slow sines; the commands lead the measured joints by 0.1 s (a teleoperated
    arm's commands run ahead of its state); cameras are raw or jpeg per
    ``camera_transports``, of a camera-like scene (``benchmarks.decode.scene``) panning slowly. For
    the tests and the replay benchmark. ``later_tasks`` are instructions sent at equal intervals after ``task``
    (a recording of several episodes).
    """
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String
    import numpy as np

    from vla_policy_node.ros.compressed import camera_topic, rgb_to_compressed
    from vla_policy_node.ros.conversions import rgb_to_image
    from vla_policy_node.ros.command_groups import CommandOutputs

    joints = len(settings.joint_names)
    phases = np.arange(joints) * 0.7

    def position(t: float) -> np.ndarray:
        return 0.3 * np.sin(0.8 * t + phases)

    class Sink:         # CommandOutputs' view of a node: its messages go to the bag
        def __init__(self, writer: BagWriter) -> None:
            self.writer, self.now = writer, 0

        def create_publisher(self, kind, topic, qos):
            sink = self

            class Publisher:
                topic_name = topic if topic.startswith('/') else '/' + topic

                def publish(self, msg):
                    sink.writer.write(self.topic_name, msg, sink.now)
            return Publisher()

    height, width = image_size
    base = scene(height, width)
    with BagWriter(path) as writer:
        sink = Sink(writer)
        outputs = CommandOutputs(sink, settings.command_groups, qos=None, watch=False)
        switches = [(seconds * (i + 1) / (len(later_tasks) + 1), 'task', text) for i, text in enumerate(later_tasks)]
        events = sorted(switches + [(t, 'joints') for t in np.arange(0.0, seconds, 1.0 / joint_hz)]
                        + [(t, 'camera') for t in np.arange(0.0, seconds, 1.0 / camera_hz)]
                        + [(t, 'command') for t in np.arange(0.0, seconds, 1.0 / command_hz)])
        start = 1_700_000_000 * 10**9
        writer.write('/' + settings.instruction_topic.lstrip('/'), String(data=task), start)
        for t, kind, *text in events:
            sink.now = start + int(round(t * 1e9)) + 1
            if kind == 'task':
                writer.write('/' + settings.instruction_topic.lstrip('/'), String(data=text[0]), sink.now)
            elif kind == 'joints':
                writer.write('/' + settings.joint_states_topic.lstrip('/'),
                             JointState(name=list(settings.joint_names),
                                        position=position(t).tolist()), sink.now)
            elif kind == 'command':
                outputs.publish(position(t + 0.1)[None, :], 1.0 / command_hz)
            else:
                rgb = np.roll(base, int(40 * t), axis=1)        # the scene pans slowly
                for topic, transport in zip(settings.camera_topics, settings.camera_transports):
                    msg = rgb_to_compressed(rgb, 'jpeg') if transport == 'compressed' else rgb_to_image(rgb)
                    writer.write('/' + camera_topic(topic, transport).lstrip('/'), msg, sink.now)


def main(argv: list[str] | None = None) -> int:
    """Write a synthetic episode for the node's parameter files."""
    import argparse

    from vla_policy_node.replay.bag_replay import settings_from_files

    parser = argparse.ArgumentParser(description='Write a synthetic MCAP episode for vla-policy-replay.')
    parser.add_argument('output', help='the .mcap file to write')
    parser.add_argument('--params-file', action='append', default=[], required=True)
    parser.add_argument('-p', '--param', action='append', default=[], metavar='NAME:=VALUE')
    parser.add_argument('--seconds', type=float, default=10.0)
    parser.add_argument('--width', type=int, default=640)
    parser.add_argument('--height', type=int, default=480)
    parser.add_argument('--camera-hz', type=float, default=30.0)
    parser.add_argument('--later-task', action='append', default=[], help='an instruction sent later (repeatable)')
    args = parser.parse_args(argv)
    settings = settings_from_files(args.params_file, args.param)
    write_synthetic_episode(args.output, settings, args.seconds, (args.height, args.width),
                            camera_hz=args.camera_hz, command_hz=settings.control_rate_hz,
                            later_tasks=tuple(args.later_task))
    print(f'wrote {args.output}: {args.seconds:g} s, {Path(args.output).stat().st_size / 2**20:.1f} MiB')
    return 0


if __name__ == '__main__':
    sys.exit(main())
