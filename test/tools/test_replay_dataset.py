# SPDX-License-Identifier: Apache-2.0
"""
vla-policy-replay --dataset on LeRobotDatasets written by LeRobot 0.6.1 (test/fixtures/lerobot061/datasets).

The expected states, actions, tasks and frame checksums are LeRobot 0.6.1's own reading of those datasets
(``<name>.expected.json``, written by tools/lerobot/make_dataset_fixtures.py): the replay must hand the
policy exactly what LeRobot would and compare with exactly LeRobot's actions.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
import shutil

import numpy as np
import pytest
from ros_harness import DEFAULT_CONFIG
import yaml

from vla_policy_node.dataset.reader import Dataset, DatasetError
from vla_policy_node.replay.bag_replay import settings_from_files
from vla_policy_node.replay.cli import main
from vla_policy_node.replay.dataset_replay import replay_dataset

REPO = Path(__file__).resolve().parents[2]
DATASETS = REPO / 'test' / 'fixtures' / 'lerobot061' / 'datasets'
SO101 = REPO / 'config' / 'so101.yaml'
CAMERAS = {'camera_names': ['top', 'wrist', 'side'],
           'camera_topics': ['camera/top/image_raw', 'camera/wrist/image_raw', 'camera/side/image_raw'],
           'control_rate_hz': 10.0, 'allow_random_weights': True, 'num_threads': 1}


@pytest.fixture
def params(tmp_path):
    def write(**values):
        path = tmp_path / 'override.yaml'
        path.write_text(yaml.safe_dump({'/**': {'ros__parameters': {**CAMERAS, **values}}}))
        return [str(DEFAULT_CONFIG), str(SO101), str(path)]
    return write


class StatePolicy:
    """Answers every observation with its state repeated (so the error is the recorded action's lead)."""

    chunk_size = 4

    def __init__(self):
        self.observations = []
        self.resets = 0

    def reset(self):
        self.resets += 1

    def predict_action_chunk(self, observation):
        self.observations.append(observation)
        return np.tile(observation['state'], (1, self.chunk_size, 1))


def test_the_policy_sees_lerobots_items_and_is_compared_with_lerobots_actions(params):
    settings = settings_from_files(params(**{'chunking.horizon': 3}))
    lerobot = json.loads((DATASETS / 'video_av1.expected.json').read_text())
    items = {(i['episode_index'], i['frame_index']): i for i in lerobot['items']}
    policy = StatePolicy()
    result = replay_dataset(Dataset(DATASETS / 'video_av1'), settings, policy, episodes=[1, 3])
    assert policy.resets == 2 and [e.index for e in result.episodes] == [1, 3]
    lengths = {1: 9, 3: 10}
    asked = [(e, t) for e in (1, 3) for t in range(0, lengths[e], 3)]
    assert len(policy.observations) == len(asked)
    for observation, (episode, frame) in zip(policy.observations, asked):
        item = items[(episode, frame)]
        assert observation['state'].tolist() == item['observation.state'] and observation['task'] == item['task']
        assert {f'observation.images.{c}': hashlib.sha256(image.tobytes()).hexdigest()
                for c, image in observation['images'].items()} == item['frames']
    scale = np.asarray(settings.joint_map.scale)
    for episode in result.episodes:
        rows = episode.rows_frame
        assert rows.tolist() == list(range(lengths[episode.index]))
        start = rows - rows % 3
        want = np.array([np.subtract(items[(episode.index, s)]['observation.state'],
                                     items[(episode.index, r)]['action']) for r, s in zip(rows, start)])
        np.testing.assert_allclose(episode.errors, want, rtol=1e-6, atol=1e-5)
    summary = result.summary()
    every = np.concatenate([e.errors for e in result.episodes])
    joint = summary['joints']['gripper']
    assert joint['points'] == 19 and joint['mae'] == pytest.approx(np.abs(every[:, 5]).mean())
    assert joint['mae_ros'] == pytest.approx(np.abs(every[:, 5] / scale[5]).mean())
    assert summary['episodes']['3']['task'] == 'push the blue block to the left'


def test_the_command_line_replays_with_the_tiny_policy(params, tmp_path, capsys):
    args = [f'--params-file={p}' for p in params()]
    code = main(['--dataset', str(DATASETS / 'video_h264'), *args, '--episodes', '0', '2',
                 '--json', str(tmp_path / 'r.json'), '--plot', str(tmp_path / 'r.png')])
    out = capsys.readouterr().out
    assert code == 0 and 'episode 2' in out and 'all episodes' in out and 'MAE rad' in out
    summary = json.loads((tmp_path / 'r.json').read_text())
    assert sorted(summary['episodes']) == ['0', '2'] and summary['fps'] == 10.0
    assert summary['joints']['shoulder_pan']['points'] == 12 + 14
    assert (tmp_path / 'r.png').stat().st_size > 1000


@pytest.mark.parametrize('dataset, values, message', [
    ('images', {}, "camera_names ['side']: no feature ['observation.images.side'] in the dataset"),
    ('video_av1', {'control_rate_hz': 30.0}, 'the dataset is at 10 fps but control_rate_hz is 30'),
    ('seven_actions', {}, "action has 7 values per frame (['action[0]',"),
    ('video_av1', {'joint_names': ['shoulder_lift', 'shoulder_pan', 'elbow_flex', 'wrist_flex', 'wrist_roll',
                                   'gripper']}, 'names the joints in the order'),
])
def test_mismatches_are_one_line_before_the_policy_loads(params, capsys, tmp_path, dataset, values, message):
    if dataset == 'seven_actions':           # its info.json says 7 values per action
        shutil.copytree(DATASETS / 'images', tmp_path / dataset)
        info = json.loads((tmp_path / dataset / 'meta/info.json').read_text())
        info['features']['action'].update(shape=[7], names=None)
        info['features'].pop('observation.images.wrist')
        (tmp_path / dataset / 'meta/info.json').write_text(json.dumps(info))
        values = {'camera_names': ['top'], 'camera_topics': ['camera/top/image_raw']}
    folder = DATASETS / dataset if (DATASETS / dataset).is_dir() else tmp_path / dataset
    code = main(['--dataset', str(folder), *[f'--params-file={p}' for p in params(**values)],
                 '-p', 'checkpoint:=/nonexistent'])
    err = capsys.readouterr().err.strip()
    assert code == 1 and message in err and len(err.splitlines()) == 1


def test_unknown_episodes_and_broken_datasets_are_refused(params, capsys, tmp_path):
    args = [f'--params-file={p}' for p in params()]
    assert main(['--dataset', str(DATASETS / 'video_av1'), *args, '--episodes', '9']) == 1
    assert 'no episode(s) [9]' in capsys.readouterr().err
    assert main(['--dataset', str(tmp_path), *args]) == 1
    assert 'not a LeRobotDataset (no meta/info.json)' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / 'x.mcap'), '--dataset', str(tmp_path), *args])
    with pytest.raises(DatasetError):
        Dataset(tmp_path / 'nothing' / 'here')


def test_a_lerobot_saved_tiny_smolvla_replays_a_lerobot_written_dataset(params, tmp_path, capsys):
    """The fixture checkpoint (LeRobot 0.6.1's save_pretrained; cameras top, wrist, side, 6 joints, chunk 8)."""
    args = [f'--params-file={p}' for p in params()]
    checkpoint = REPO / 'test' / 'fixtures' / 'lerobot061' / 'smolvla'
    assert main(['--dataset', str(DATASETS / 'video_av1'), *args, '-p', f'checkpoint:={checkpoint}',
                 '--episodes', '1', '--json', str(tmp_path / 'r.json')]) == 0
    summary = json.loads((tmp_path / 'r.json').read_text())
    assert summary['episodes']['1']['frames'] == 9 and summary['chunks'] == 2       # horizon 8: frames 0 and 8
    assert all(np.isfinite(row['mae_ros']) and row['points'] == 9 for row in summary['joints'].values())
