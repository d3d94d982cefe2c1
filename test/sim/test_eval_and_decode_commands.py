# SPDX-License-Identifier: Apache-2.0
"""The evaluation command without ROS and the frame-decode benchmark, run for real but small."""

from benchmarks import decode
from vla_policy_node.ros.sim import evaluation as sim_eval


def test_sim_eval_runs_the_shipped_policy_without_ros(capsys):
    assert sim_eval.main(['--episodes', '2', '--no-dds', '--max-steps', '20']) == 0
    out = capsys.readouterr().out
    assert 'trained: so101, 2 episodes, seed 100' in out and 'without ROS' in out and 'success' in out


def test_sim_eval_random_weights_baseline_without_ros(capsys):
    assert sim_eval.main(['--episodes', '1', '--no-dds', '--max-steps', '5', '--random-weights']) == 0
    assert 'random weights: so101, 1 episodes' in capsys.readouterr().out


def test_decode_benchmark_measures_raw_jpeg_and_png(tmp_path):
    figures = decode.main(['--width', '64', '--height', '48', '--repeats', '3', '--json', str(tmp_path / 'd.json')])
    assert set(figures) == {'raw rgb8', 'jpeg', 'png'}
    assert all(entry['ms'] > 0 and entry['bytes'] > 0 for entry in figures.values())
    assert figures['raw rgb8']['bytes'] == 64 * 48 * 3
    assert (tmp_path / 'd.json').is_file()


def test_sim_eval_of_a_checkpoint_that_is_not_there_is_one_line(capsys):
    assert sim_eval.main(['--episodes', '1', '--no-dds', '--checkpoint', '/nonexistent/ckpt']) == 1
    err = capsys.readouterr().err
    assert 'vla-policy-sim-eval: checkpoint folder /nonexistent/ckpt does not exist' in err


def test_sim_eval_runs_the_planar_test_arm_too(capsys):
    assert sim_eval.main(['--robot', 'planar', '--episodes', '1', '--no-dds', '--max-steps', '20']) == 0
    assert 'trained: planar, 1 episodes' in capsys.readouterr().out
