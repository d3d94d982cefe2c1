# SPDX-License-Identifier: Apache-2.0
r"""
vla-policy-replay: run the policy open-loop on a recorded episode and compare with its commands.

    vla-policy-replay BAG --params-file config/so101.yaml [-p checkpoint:=/path] \\
        --plot replay.png --json replay.json
    vla-policy-replay --dataset DIR_OR_REPO_ID [--episodes 0 3] --params-file config/so101.yaml ...
    vla-policy-replay BAG --export-dataset OUT --params-file config/so101.yaml

A bag (an MCAP or sqlite3 ``.db3`` file, or a rosbag2 folder) is replayed as ``replay/bag_replay.py``
says; ``--dataset`` replays a LeRobotDataset's episodes instead (``replay/dataset_replay.py``);
``--export-dataset`` writes the bag as a LeRobotDataset (``replay/bag_export.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import json
from pathlib import Path
import sys
from typing import Any

from vla_policy_node.replay.bag import end_unfinished
from vla_policy_node.replay.bag_replay import check_bag, NODE_NAME, plot, replay, settings_from_files
from vla_policy_node.ros.params import ParameterError


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (``vla-policy-replay``)."""
    parser = argparse.ArgumentParser(prog='vla-policy-replay', description=__doc__.split('\n\n')[0])
    parser.add_argument('bag', nargs='?', help='the bag: an .mcap or .db3 file, or a rosbag2 folder')
    parser.add_argument('--dataset', metavar='DIR_OR_REPO_ID',
                        help='replay a LeRobotDataset (v3.0) instead: a folder, or a repo id in the local cache')
    parser.add_argument('--episodes', type=int, nargs='+', help="with --dataset: these episodes (default: all)")
    parser.add_argument('--params-file', action='append', default=[], required=True,
                        help="the node's parameter file(s), later ones win")
    parser.add_argument('-p', '--param', action='append', default=[], metavar='NAME:=VALUE',
                        help='one parameter, as with ros2 run (e.g. checkpoint:=/path)')
    parser.add_argument('--period', type=float, default=None,
                        help='seconds between observations (default: one horizon)')
    parser.add_argument('--namespace', default='', help="the node's namespace when the bag was recorded")
    parser.add_argument('--node', default=NODE_NAME, help="the node's name, for its ~/episode and ~/command_goals")
    parser.add_argument('--export-dataset', metavar='OUT',
                        help='export the bag as a LeRobotDataset v3.0 in the new folder OUT instead (no policy runs)')
    parser.add_argument('--fps', type=float, help='with --export-dataset: frames per second (default: control_rate_hz)')
    parser.add_argument('--leader', metavar='TOPIC',
                        help="with --export-dataset: the action is this leader arm's joint states, not the commands")
    parser.add_argument('--gap', type=float, default=1.0,
                        help='with --export-dataset: seconds without joint states that end an episode')
    parser.add_argument('--codec', default='av1', choices=('av1', 'h264'), help='with --export-dataset: video codec')
    parser.add_argument('--robot-type', help='with --export-dataset: the robot type recorded (e.g. so101_follower)')
    parser.add_argument('--plot', help='write the PNG plot here')
    parser.add_argument('--json', help='write the summary here')
    args = parser.parse_args(argv)
    if (args.bag is None) == (args.dataset is None):
        parser.error('give a bag or --dataset (one of them)')
    if args.export_dataset is not None:
        return _main_export(args)
    from vla_policy_node.ros.policy_loader import make_policy, PolicyLoadError   # torch: only now
    if args.dataset is not None:
        return _main_dataset(args, make_policy, PolicyLoadError)
    try:
        settings = settings_from_files(args.params_file, args.param)
        for recovered in end_unfinished(args.bag):
            print(f'note: {recovered.path} was never closed (its recorder was killed?): ended after its last '
                  f'complete chunk, {recovered.messages} messages kept, {recovered.cut_bytes} bytes cut',
                  file=sys.stderr)
        check_bag(args.bag, settings, args.namespace, args.node)   # before the policy loads: a broken bag fails fast
        policy = make_policy(settings, lambda text: print(text, file=sys.stderr),
                             lambda text: print(f'warning: {text}', file=sys.stderr), (), settings.horizon,
                             settings.guided)
        result = replay(args.bag, settings, policy, args.period, args.namespace, args.node)
    except (ParameterError, PolicyLoadError, ValueError, OSError) as error:
        print(f'vla-policy-replay: {error}', file=sys.stderr)
        return 1
    summary = result.summary()
    width = max(len(name) for name in result.joint_names)
    print(f"{summary['chunks']} chunks, {summary['predicted_points']} predicted points, "
          f"{summary['recorded_commands']} recorded commands, inference p50 "
          f"{summary['inference_ms_p50']:.1f} ms")
    print(f"{'joint':<{width}}  {'MAE':>10}  {'RMSE':>10}  {'max':>10}  points")
    for name, row in summary['joints'].items():
        print(f"{name:<{width}}  {row['mae']:>10.5f}  {row['rmse']:>10.5f}  {row['max_abs']:>10.5f}  "
              f"{row['points']}")
    for group, events in summary['goals'].items():
        print(f"goals of {group}: " + ', '.join(f'{count} {event}' for event, count in events.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    if args.plot:
        plot(result, args.plot)
    return 0


def _main_dataset(args: argparse.Namespace, make_policy: Any, load_error: type) -> int:
    """``--dataset``: check the dataset against the settings, load the policy, replay, report."""
    from vla_policy_node.dataset.reader import Dataset
    from vla_policy_node.replay.dataset_replay import check_episodes, check_fit, replay_dataset, report
    try:
        settings = settings_from_files(args.params_file, args.param)
        dataset = Dataset(args.dataset)
        check_fit(dataset, settings)                 # before the policy loads: a mismatch fails fast
        episodes = check_episodes(dataset, args.episodes)
        policy = make_policy(settings, lambda text: print(text, file=sys.stderr),
                             lambda text: print(f'warning: {text}', file=sys.stderr), (), settings.horizon,
                             settings.guided)
        result = replay_dataset(dataset, settings, policy, episodes,
                                None if args.period is None else max(1, round(args.period * dataset.fps)))
    except (ParameterError, load_error, ValueError, OSError) as error:
        print(f'vla-policy-replay: {error}', file=sys.stderr)
        return 1
    report(result, args.json, args.plot)
    return 0


def _main_export(args: argparse.Namespace) -> int:
    """``--export-dataset``: the bag as a LeRobotDataset; one line and nothing written if refused."""
    from vla_policy_node.replay.bag_export import export_bag
    if args.bag is None:
        print('vla-policy-replay: --export-dataset exports a bag: name it', file=sys.stderr)
        return 1
    try:
        # No policy runs: an empty checkpoint is no reason to refuse (it would build random weights).
        settings = settings_from_files(args.params_file, ['allow_random_weights:=true', *args.param])
        episodes = export_bag(args.bag, settings, args.export_dataset, args.fps, args.leader, args.gap, args.codec,
                              args.robot_type, args.namespace, args.node)
    except (ParameterError, ValueError, OSError) as error:
        print(f'vla-policy-replay: {error}', file=sys.stderr)
        return 1
    print(f'{args.export_dataset}: {len(episodes)} episodes, {sum(n for _, n in episodes)} frames')
    for number, (task, frames) in enumerate(episodes):
        print(f'episode {number}: {frames} frames, {task!r}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
