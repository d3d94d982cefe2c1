# SPDX-License-Identifier: Apache-2.0
"""
The planar test arm's trained policy that ships in the package.

Its files, load_policy, and closed-loop episodes without ROS and through the installed node
over DDS.
"""

import json

import numpy as np
import pytest
from ros_harness import DEFAULT_CONFIG, sim_episodes

from vla_policy_node.loading import load_policy
from vla_policy_node.ros.sim.robot import EpisodeReport, format_report
from vla_policy_node.sim import PLANAR_CHECKPOINT
from vla_policy_node.sim.planar.env import TouchEnv
from vla_policy_node.sim.rollout import evaluate, policy_chunk_fn, success_rate

PLANAR_CONFIG = DEFAULT_CONFIG.parent / 'planar.yaml'
LEROBOT_FILES = ('config.json', 'model.safetensors', 'policy_preprocessor.json', 'policy_postprocessor.json',
                 'policy_preprocessor_step_5_normalizer_processor.safetensors',
                 'policy_postprocessor_step_0_unnormalizer_processor.safetensors',
                 'vlm/config.json', 'vlm/tokenizer.json', 'vlm/special_tokens_map.json')


def test_shipped_checkpoint_has_lerobots_layout_and_is_small():
    for name in LEROBOT_FILES:
        assert (PLANAR_CHECKPOINT / name).is_file(), name
    size = sum(p.stat().st_size for p in PLANAR_CHECKPOINT.rglob('*') if p.is_file())
    assert size <= 10 * 2**20
    config = json.loads((PLANAR_CHECKPOINT / 'config.json').read_text())
    settings = json.loads((PLANAR_CHECKPOINT / 'vla_policy_node.json').read_text())
    assert config['type'] == 'smolvla' and 'joint_names' not in config       # LeRobot refuses unknown fields
    assert settings['joint_names'] == ['shoulder', 'elbow', 'wrist']


def test_shipped_checkpoint_loads_through_load_policy():
    policy = load_policy(PLANAR_CHECKPOINT, device='cpu')
    assert policy.family == 'smolvla'
    assert policy.camera_names == ('observation.images.top',)
    assert (policy.state_dim, policy.action_dim, policy.chunk_size) == (3, 3, 10)
    chunk = policy.predict_action_chunk(TouchEnv().reset(np.random.default_rng(0)))
    assert chunk.shape == (1, 10, 3) and np.all(np.isfinite(chunk))


def test_shipped_policy_succeeds_without_ros():
    policy = load_policy(PLANAR_CHECKPOINT, device='cpu')
    results = evaluate(TouchEnv(), policy_chunk_fn(policy), episodes=10, seed=7, execute=5)
    # 50/50 over seed 100's layouts (BENCHMARKS.md, the planar test arm); random weights reach 14%.
    assert success_rate(results) >= 0.8, results


@pytest.mark.dds
def test_closed_loop_episodes_through_the_node_succeed(monkeypatch):
    """The installed node (planar.yaml, shipped checkpoint) drives the simulated robot over DDS."""
    robot, _ = sim_episodes(monkeypatch, [DEFAULT_CONFIG, PLANAR_CONFIG], PLANAR_CHECKPOINT, PLANAR_CONFIG,
                            {'episodes': 6, 'seed': 11})
    assert sum(r.success for r in robot.reports) >= 4, robot.reports     # 50/50 in BENCHMARKS.md
    assert all(r.first_command_ms == r.first_command_ms for r in robot.reports)   # commands came each time


def test_episode_line_says_what_was_not_measured_instead_of_nan():
    report = EpisodeReport(instruction='touch the red block', sent='touch the red block', success=True,
                           steps=10, first_command_ms=49.04, policy_p50_ms=float('nan'))
    line = format_report(1, 10, report)
    assert 'nan' not in line and 'first command   49.0 ms' in line and 'policy p50 not reported yet' in line
    silent = EpisodeReport(instruction='touch the red block', sent='touch the blue block', success=False,
                           steps=100, first_command_ms=float('nan'), policy_p50_ms=17.61)
    line = format_report(2, 10, silent)
    assert "(sent 'touch the blue block') failure" in line
    assert 'first command   none' in line and 'policy p50 17.6 ms' in line
