# SPDX-License-Identifier: Apache-2.0
"""
Checkpoints from the Hugging Face cache: hub ids resolve offline, snapshot links are followed only into blobs/.

The cache is built here in ``huggingface_hub``'s layout (``models--org--name/blobs/<hash>``,
``snapshots/<rev>/<file>`` -> ``../../blobs/<hash>``, ``refs/main``) from a tiny SmolVLA
checkpoint the test saves; the loaded policy must give the same actions as the folder itself.
"""

from pathlib import Path

import numpy as np
import pytest

from hf_cache import make_cache, REPO_ID
from vla_policy_node.bench.checkpoints import save_random_checkpoint
from vla_policy_node.loading.checkpoint import CheckpointError
from vla_policy_node.loading import load_policy


@pytest.fixture(scope='module')
def source(tmp_path_factory) -> Path:
    """Save a tiny LeRobot SmolVLA checkpoint folder (random weights, 2 cameras, 6 joints)."""
    return save_random_checkpoint(tmp_path_factory.mktemp('ckpt') / 'tiny', 'tiny', 2, seed=1)


def actions(folder) -> np.ndarray:
    policy = load_policy(folder, device='cpu', pack_weights=False)
    observation = policy.dummy_observation()
    noise = np.random.default_rng(0).standard_normal(
        (1, policy.chunk_size, policy.model.max_action_dim)).astype(np.float32)
    return policy.predict_action_chunk(observation, noise=noise)


def test_hub_id_resolves_from_hf_hub_cache_and_acts_like_the_folder(source, tmp_path, monkeypatch):
    snapshot = make_cache(tmp_path / 'hub', source)
    assert (snapshot / 'model.safetensors').is_symlink()
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'hub'))
    np.testing.assert_array_equal(actions(REPO_ID), actions(source))


def test_hub_id_resolves_from_hf_home(source, tmp_path, monkeypatch):
    make_cache(tmp_path / 'home' / 'hub', source)
    monkeypatch.delenv('HF_HUB_CACHE', raising=False)
    monkeypatch.setenv('HF_HOME', str(tmp_path / 'home'))
    assert load_policy(REPO_ID, device='cpu', pack_weights=False).state_dim == 6


def test_snapshot_folder_loads_with_links_into_its_own_blobs(source, tmp_path, monkeypatch):
    monkeypatch.delenv('HF_HUB_CACHE', raising=False)
    monkeypatch.setenv('HF_HOME', str(tmp_path / 'unused'))
    snapshot = make_cache(tmp_path / 'hub', source)
    policy = load_policy(snapshot, device='cpu', pack_weights=False, allowed_roots=[tmp_path / 'hub'])
    assert policy.family == 'smolvla'


def test_snapshot_links_elsewhere_are_still_refused(source, tmp_path):
    snapshot = make_cache(tmp_path / 'hub', source)
    outside = tmp_path / 'outside.json'
    outside.write_text((source / 'config.json').read_text())
    (snapshot / 'config.json').unlink()
    (snapshot / 'config.json').symlink_to(outside)
    with pytest.raises(CheckpointError, match='outside the checkpoint folder'):
        load_policy(snapshot, device='cpu')


def test_snapshot_links_into_another_repos_blobs_are_refused(source, tmp_path):
    snapshot = make_cache(tmp_path / 'hub', source)
    other = make_cache(tmp_path / 'hub', source, repo_id='someone/else')
    (snapshot / 'model.safetensors').unlink()
    (snapshot / 'model.safetensors').symlink_to((other / 'model.safetensors').resolve())
    with pytest.raises(CheckpointError, match='outside the checkpoint folder'):
        load_policy(snapshot, device='cpu')


def test_a_blobs_folder_that_is_a_link_outside_the_root_is_not_followed(source, tmp_path):
    """Every file would otherwise load from wherever ``blobs`` leads, outside ``checkpoint_root``."""
    snapshot = make_cache(tmp_path / 'hub', source)
    blobs = snapshot.parent.parent / 'blobs'
    elsewhere = tmp_path / 'elsewhere'
    blobs.rename(elsewhere)
    blobs.symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match='outside the checkpoint folder'):
        load_policy(snapshot, device='cpu', allowed_roots=[tmp_path / 'hub'])


def test_a_folder_that_only_looks_like_a_snapshot_gets_no_exception(source, tmp_path):
    fake = tmp_path / 'snapshots' / 'x'
    fake.mkdir(parents=True)
    (tmp_path / 'blobs').mkdir()
    blob = tmp_path / 'blobs' / 'config'
    blob.write_text((source / 'config.json').read_text())
    (fake / 'config.json').symlink_to(blob)
    with pytest.raises(CheckpointError, match='outside the checkpoint folder'):
        load_policy(fake, device='cpu')


def test_uncached_hub_id_says_how_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'empty'))
    with pytest.raises(CheckpointError, match='hf download lerobot/smolvla_base'):
        load_policy('lerobot/smolvla_base', device='cpu')


def test_several_snapshots_without_refs_main_are_ambiguous(source, tmp_path, monkeypatch):
    make_cache(tmp_path / 'hub', source)
    make_cache(tmp_path / 'hub', source, revision='b' * 40)
    (tmp_path / 'hub' / 'models--lerobot--tiny_test' / 'refs' / 'main').unlink()
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'hub'))
    with pytest.raises(CheckpointError, match='2 snapshots'):
        load_policy(REPO_ID, device='cpu')
