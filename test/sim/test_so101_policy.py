# SPDX-License-Identifier: Apache-2.0
"""
The SO-101 policy that ships in the package (the demo's): its files, and closed-loop episodes.

Without ROS (``sim.rollout``, units converted as the node's joint_units do) and through the
installed node over DDS, with config/so101.yaml's joint map and controllers: the arm's
trajectory on one topic, the gripper's forward command on another, joint states in radians.
"""

import json

import pytest
from PIL import Image
from ros_harness import DEFAULT_CONFIG, sim_episodes

from vla_policy_node.loading import load_policy
from vla_policy_node.sim.rollout import evaluate, policy_chunk_fn, success_rate
from vla_policy_node.sim.so101 import SHIPPED_CHECKPOINT
from vla_policy_node.sim.so101.env import So101TouchEnv
from vla_policy_node.sim.so101.units import JOINT_NAMES

SO101_CONFIG = DEFAULT_CONFIG.parent / 'so101.yaml'
DEMO_CONFIG = DEFAULT_CONFIG.parent / 'demo.yaml'


def test_shipped_checkpoint_is_a_lerobot_so101_policy():
    config = json.loads((SHIPPED_CHECKPOINT / 'config.json').read_text())
    settings = json.loads((SHIPPED_CHECKPOINT / 'vla_policy_node.json').read_text())
    assert config['type'] == 'smolvla' and 'joint_names' not in config
    assert config['input_features']['observation.images.front']['shape'] == [3, 64, 64]
    assert settings['joint_names'] == list(JOINT_NAMES)
    summary = json.loads((SHIPPED_CHECKPOINT / 'train_summary.json').read_text())
    assert summary['config']['robot'] == 'so101' and summary['eval_success_rate'] >= 0.8


def test_shipped_policy_succeeds_without_ros():
    policy = load_policy(SHIPPED_CHECKPOINT, device='cpu')
    assert (policy.state_dim, policy.action_dim, policy.chunk_size) == (6, 6, 10)
    env = So101TouchEnv()
    results = evaluate(env, policy_chunk_fn(policy, env), episodes=10, seed=7, execute=5)
    env.close()
    assert success_rate(results) >= 0.8, results


@pytest.mark.dds
def test_closed_loop_episodes_through_the_node_with_so101_yaml(monkeypatch, tmp_path):
    """The installed node (default, so101, demo yaml) drives the simulated SO-101; the first episode is saved."""
    prefix = str(tmp_path / 'episode')
    robot, _ = sim_episodes(monkeypatch, [DEFAULT_CONFIG, SO101_CONFIG, DEMO_CONFIG], SHIPPED_CHECKPOINT, DEMO_CONFIG,
                            {'episodes': 5, 'seed': 11, 'record_prefix': prefix})
    assert sum(r.success for r in robot.reports) >= 4, robot.reports
    assert all(r.first_command_ms == r.first_command_ms for r in robot.reports)   # commands came each time
    # Both controllers were commanded: the arm's trajectory and the gripper's forward command.
    assert set(robot._controllers.followers) == {(0, 1, 2, 3, 4), (5,)}
    gif, png = Image.open(prefix + '.gif'), Image.open(prefix + '.png')
    assert gif.n_frames > 5 and gif.size[0] == 256 and gif.size[1] > 256     # the caption under the frame
    assert png.size[1] > 64 * 3
