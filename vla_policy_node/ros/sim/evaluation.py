# SPDX-License-Identifier: Apache-2.0
"""
vla-policy-sim-eval: success rate of a policy on the simulated table-top task, through the node and without ROS.

    vla-policy-sim-eval --episodes 50 --seed 100                # the shipped SO-101 checkpoint, both ways
    vla-policy-sim-eval --episodes 50 --instruction "touch the red block"   # instruction-blind baseline
    vla-policy-sim-eval --episodes 50 --random-weights          # same architecture, untrained weights
    vla-policy-sim-eval --robot planar                          # the planar test arm and its policy
    vla-policy-sim-eval --real-time                             # physics on the wall clock, not in lockstep

Through the node: the installed ``vla_policy_node`` runs as a subprocess (config/default.yaml,
config/so101.yaml and config/demo.yaml, or default.yaml and planar.yaml, then the checkpoint)
and this process runs the simulated robot (``ros.sim.robot``, the robot's file) on the same
ROS_DOMAIN_ID, localhost only, in lockstep (the node with ``use_sim_time``, the robot publishing
``/clock``) unless ``--real-time``. Without ROS: the same checkpoint through ``load_policy``,
driving the simulation in a loop (``sim.rollout``), the joints converted to the policy's
units as the node's joint_units do. The same seed gives both the same block layouts.
"""

from __future__ import annotations

import argparse
from pathlib import Path
import shutil
import sys
import subprocess
import tempfile
import time

import numpy as np

from vla_policy_node.ament_registration import installed_executable
from vla_policy_node.sim import PLANAR_CHECKPOINT
from vla_policy_node.sim.robots import make_env, ROBOTS
from vla_policy_node.sim.rollout import evaluate, policy_chunk_fn, success_rate
from vla_policy_node.sim.so101 import SHIPPED_CHECKPOINT as SO101_CHECKPOINT

# Per robot: its shipped checkpoint, the node's parameter files in order (the last one also the robot's).
SETUPS = {'so101': (SO101_CHECKPOINT, ('default.yaml', 'so101.yaml', 'demo.yaml')),
          'planar': (PLANAR_CHECKPOINT, ('default.yaml', 'planar.yaml'))}
MAX_STEPS = {'so101': 90, 'planar': 100}


def package_config(name: str) -> Path:
    """``config/<name>`` of the source tree, else of the installed share folder."""
    source = Path(__file__).resolve().parents[2] / 'config' / name
    if source.is_file():
        return source
    from ament_index_python.packages import get_package_share_directory
    return Path(get_package_share_directory('vla_policy_node')) / 'config' / name


def random_weights_copy(checkpoint: Path, folder: Path, seed: int) -> Path:
    """Copy ``checkpoint`` with its weights re-initialised (same architecture, statistics, tokenizer)."""
    import torch

    from vla_policy_node.loading.checkpoint import read_json
    from vla_policy_node.model.families.smolvla import SmolVLA, SmolVLAConfig
    from vla_policy_node.loading.load import init_weights
    from vla_policy_node.train.export import VLM_FOLDER, save_weights

    target = folder / 'random_weights'
    shutil.copytree(checkpoint, target)
    config = SmolVLAConfig.from_lerobot(read_json(target / 'config.json'),
                                        read_json(target / VLM_FOLDER / 'config.json'))
    model = SmolVLA(config)
    init_weights(model, torch.Generator().manual_seed(seed))
    save_weights(target, model)
    return target


def run_direct(robot: str, checkpoint: Path, episodes: int, seed: int, max_steps: int, instruction: str) -> list:
    """Episodes with the policy called directly (no ROS)."""
    from vla_policy_node.loading import load_policy

    policy = load_policy(checkpoint, device='cpu')
    env = make_env(robot, max_steps=max_steps)
    try:
        return evaluate(env, policy_chunk_fn(policy, env), episodes, seed, execute=max(1, policy.chunk_size // 2),
                        instruction=instruction or None)
    finally:
        env.close()


def run_dds(robot: str, checkpoint: Path, episodes: int, seed: int, max_steps: int, instruction: str,
            ready_timeout: float = 120.0, lockstep: bool = True) -> list:
    """Episodes through the installed node over DDS; the robot runs in this process."""
    import rclpy
    from rclpy.parameter import Parameter

    from vla_policy_node.ros.sim.robot import SimRobot

    files = [str(package_config(name)) for name in SETUPS[robot][1]]
    node = subprocess.Popen(
        [str(installed_executable()), '--ros-args', *(a for f in files for a in ('--params-file', f)),
         '-p', f'checkpoint:={checkpoint}', '-p', f'use_sim_time:={str(lockstep).lower()}', '--log-level', 'ERROR'])
    rclpy.init()
    sim = None
    try:
        sim = SimRobot(cli_args=['--ros-args', '--params-file', files[-1]], parameter_overrides=[
            Parameter('episodes', value=episodes), Parameter('seed', value=seed),
            Parameter('max_steps', value=max_steps), Parameter('instruction', value=instruction),
            Parameter('lockstep', value=lockstep)])
        deadline = time.monotonic() + ready_timeout + episodes * (max_steps * 0.05 + 5.0)
        while rclpy.ok() and not sim.finished and node.poll() is None and time.monotonic() < deadline:
            rclpy.spin_once(sim, timeout_sec=0.02)
        if not sim.finished:
            raise RuntimeError(f'the DDS run did not finish: {len(sim.reports)} of {episodes} episodes, '
                               f'node exit code {node.poll()}')
        return list(sim.reports)
    finally:
        if sim is not None:
            sim.destroy_node()
        rclpy.try_shutdown()
        node.terminate()
        node.wait(30)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the requested evaluations and print the success rates."""
    parser = argparse.ArgumentParser(prog='vla-policy-sim-eval', description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--robot', choices=ROBOTS, default='so101',
                        help='the simulated robot: so101 (MuJoCo) or planar (the numpy test arm)')
    parser.add_argument('--checkpoint', type=Path, default=None,
                        help="the policy to evaluate; none: the robot's shipped one")
    parser.add_argument('--episodes', type=int, default=20, help='episodes per mode, each a new layout')
    parser.add_argument('--seed', type=int, default=100, help='layouts (training recorded seeds 0 and 7919)')
    parser.add_argument('--max-steps', type=int, default=None,
                        help='control ticks per episode; none: 90 for so101 (3 s), 100 for planar (5 s)')
    parser.add_argument('--instruction', default='', help='send this instead of each episode\'s instruction')
    parser.add_argument('--random-weights', action='store_true', help='re-initialise the weights (baseline)')
    parser.add_argument('--no-dds', action='store_true', help='only the run without ROS')
    parser.add_argument('--no-direct', action='store_true', help='only the run through the node')
    parser.add_argument('--threads', type=int, default=1, help='torch threads of the run without ROS')
    parser.add_argument('--real-time', action='store_true',
                        help='through the node: physics on the wall clock instead of in lockstep with the node')
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error('--episodes must be >= 1')
    args.checkpoint = args.checkpoint or SETUPS[args.robot][0]
    args.max_steps = args.max_steps or MAX_STEPS[args.robot]
    import torch
    from vla_policy_node.loading.checkpoint import CheckpointError
    torch.set_num_threads(args.threads)
    try:
        rates = evaluate_modes(args)
    except CheckpointError as error:
        print(f'vla-policy-sim-eval: {error}', file=sys.stderr)
        return 1
    label = ('random weights' if args.random_weights else 'trained') + (
        f', instruction fixed to {args.instruction!r}' if args.instruction else '')
    print(f'{label}: {args.robot}, {args.episodes} episodes, seed {args.seed}, checkpoint {args.checkpoint}')
    for where, (wins, total, steps) in rates.items():
        print(f'  {where:<24} success {wins}/{total} = {100.0 * wins / total:5.1f}%'
              + (f'   mean steps of successes {steps:.1f}' if wins else ''))
    return 0


def evaluate_modes(args: argparse.Namespace) -> dict[str, tuple[int, int, float]]:
    """Run the episodes through the node and/or without ROS; (successes, episodes, mean steps) per mode."""
    from vla_policy_node.loading.checkpoint import checkpoint_dir
    checkpoint_dir(args.checkpoint)         # a missing folder is one line, before any node starts
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint.resolve()
        if args.random_weights:
            checkpoint = random_weights_copy(checkpoint, Path(tmp), seed=1)
        rates = {}
        if not args.no_dds:
            reports = run_dds(args.robot, checkpoint, args.episodes, args.seed, args.max_steps, args.instruction,
                              lockstep=not args.real_time)
            rates['through the node (DDS)'] = (sum(r.success for r in reports), len(reports),
                                               np.mean([r.steps for r in reports if r.success] or [np.nan]))
        if not args.no_direct:
            results = run_direct(args.robot, checkpoint, args.episodes, args.seed, args.max_steps, args.instruction)
            rates['without ROS'] = (round(success_rate(results) * len(results)), len(results),
                                    np.mean([r.steps for r in results if r.success] or [np.nan]))
    return rates


if __name__ == '__main__':
    raise SystemExit(main())
