# SPDX-License-Identifier: Apache-2.0
"""Training pieces: LeRobot's time sampling and loss, and the checkpoint layout load_policy reads back."""

import json

import numpy as np
import torch
from safetensors import safe_open

from vla_policy_node.model.families.smolvla import SmolVLA, SmolVLAConfig
from vla_policy_node.loading.load import init_weights
from vla_policy_node.model.normalization import Normalizer
from vla_policy_node.model.preprocessing import Preprocessor, newline_prompt, smolvla_image
from vla_policy_node.runtime.engine import PolicyRuntime
from vla_policy_node.model.tokenizer import TextTokenizer
from vla_policy_node.loading import load_policy
from vla_policy_node.sim.planar.env import TouchEnv
from vla_policy_node.train import data_parallel, export
from vla_policy_node.train.cli import main as train_main, mean_std, policy_configs, TrainConfig, VOCABULARY
from vla_policy_node.train.demonstrations import collect
from vla_policy_node.train.flow_matching import flow_matching_loss, sample_noise, sample_time


def small_model(tmp_path, seed=0):
    """Build the shipped architecture with random weights and save it as a checkpoint in tmp_path."""
    env = TouchEnv()
    tokenizer = export.word_tokenizer(VOCABULARY)
    config, vlm = policy_configs(TrainConfig(robot='planar'), env, tokenizer.get_vocab_size())
    model = SmolVLA(SmolVLAConfig.from_lerobot(config, vlm))
    init_weights(model, torch.Generator().manual_seed(seed))
    stats = {'mean': np.array([1.0, 0.5, -0.2], np.float32), 'std': np.array([0.8, 1.1, 0.6], np.float32)}
    export.save_checkpoint(tmp_path, model, config, vlm, tokenizer, stats, stats)
    return env, model, stats


def test_time_follows_lerobots_beta_1_5_1():
    torch.manual_seed(0)
    t = sample_time(20000)
    assert t.dtype == torch.float32 and float(t.min()) >= 0.001 and float(t.max()) <= 1.0
    # Beta(1.5, 1) has mean 0.6 and P(t < 0.5) = 0.5 ** 1.5.
    assert abs(float(t.mean()) - (0.6 * 0.999 + 0.001)) < 0.01
    assert abs(float((t < 0.5).float().mean()) - 0.5 ** 1.5) < 0.015


def test_loss_is_the_velocity_mse_and_training_lowers_it(tmp_path):
    env, model, stats = small_model(tmp_path)
    demos = collect(env, 4, 10, seed=0, progress=False)
    pre = Preprocessor(
        camera_names=('observation.images.top',), image_size=(48, 48), image_transform=smolvla_image(48, 48),
        tokenizer=TextTokenizer(tmp_path / 'vlm' / 'tokenizer.json'), max_length=8, padding='max_length',
        prompt=newline_prompt, state_normalizer=Normalizer('MEAN_STD', stats), state_dim=3, max_state_dim=3)
    idx = np.arange(8)
    inputs = pre({'images': {'top': demos.images[idx]}, 'state': demos.states[idx],
                  'task': [demos.instructions[i] for i in demos.task_index[idx]]})
    actions = torch.from_numpy(Normalizer('MEAN_STD', stats).normalize(demos.actions[idx]))
    torch.manual_seed(1)
    noise, time = sample_noise(tuple(actions.shape)), sample_time(8)
    with torch.no_grad():
        loss = flow_matching_loss(model, inputs, actions, noise, time)
        # The same objective by hand: the velocity at x_t against noise - actions.
        runtime = PolicyRuntime(model, 10, torch.device('cpu'))
        ctx = runtime.encode(inputs)
        x_t = time[:, None, None] * noise + (1 - time[:, None, None]) * actions
        v = model.velocity(x_t, torch.cat(model.time_conditioning(time)), ctx)
    torch.testing.assert_close(loss, ((v - (noise - actions)) ** 2).mean())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(30):
        step_loss = flow_matching_loss(model, inputs, actions, noise, time)
        optimizer.zero_grad()
        step_loss.backward()
        optimizer.step()
    assert step_loss.item() < 0.5 * loss.item()


def test_saved_names_are_lerobots(tmp_path, reference_dir):
    small_model(tmp_path)
    reference = str(reference_dir('smolvla') / 'model.safetensors')
    with safe_open(str(tmp_path / 'model.safetensors'), 'np') as ours, safe_open(reference, 'np') as ref:
        # The reference SmolVLA fixture has the same depths (2 vision, 4 text, 4 expert layers); the
        # export also writes the two tensors inference never reads (LeRobot loads strictly).
        assert set(ours.keys()) == set(ref.keys())


def test_saved_checkpoint_loads_and_acts_like_the_trained_module(tmp_path):
    env, model, stats = small_model(tmp_path, seed=3)
    policy = load_policy(tmp_path, device='cpu')
    assert policy.family == 'smolvla' and policy.camera_names == ('observation.images.top',)
    obs = env.reset(np.random.default_rng(0))
    noise = np.random.default_rng(1).standard_normal((1, 10, 3)).astype(np.float32)
    loaded = policy.predict_action_chunk(obs, noise=noise)
    pre = policy.preprocessor
    direct = PolicyRuntime(model, 10, torch.device('cpu')).sample(pre(obs), torch.from_numpy(noise))
    expected = Normalizer('MEAN_STD', stats).unnormalize(direct.numpy())
    np.testing.assert_allclose(loaded, expected, atol=1e-5)


def test_every_visited_state_is_labelled_toward_each_block():
    """Instruction relabelling: the same image and joints, one sample per block, each toward its own block."""
    env = TouchEnv()
    demos = collect(env, 3, 10, seed=0, progress=False)
    n = env.task.num_blocks
    assert len(demos) % n == 0
    for first in range(0, len(demos), n):
        rows = range(first, first + n)
        assert all(np.array_equal(demos.images[r], demos.images[first]) for r in rows)
        assert all(np.array_equal(demos.states[r], demos.states[first]) for r in rows)
        tasks = {demos.instructions[demos.task_index[r]] for r in rows}
        assert len(tasks) == n                                       # every block named once
        ends = np.stack([demos.actions[r][-1] for r in rows])
        assert len({tuple(np.round(e, 6)) for e in ends}) == n       # and each plan goes elsewhere


def one_step(worker, tmp_path):
    """One AdamW step of the small model on this worker's share of a fixed batch of 8; saves the weights."""
    env, model, stats = small_model(tmp_path / f'rank{worker.rank}')
    demos = collect(env, 2, 10, seed=0, progress=False)
    pre = Preprocessor(
        camera_names=('observation.images.top',), image_size=(48, 48), image_transform=smolvla_image(48, 48),
        tokenizer=TextTokenizer(tmp_path / f'rank{worker.rank}' / 'vlm' / 'tokenizer.json'), max_length=8,
        padding='max_length', prompt=newline_prompt, state_normalizer=Normalizer('MEAN_STD', stats),
        state_dim=3, max_state_dim=3)
    idx = np.array_split(np.arange(8), worker.world)[worker.rank]
    inputs = pre({'images': {'top': demos.images[idx]}, 'state': demos.states[idx],
                  'task': [demos.instructions[i] for i in demos.task_index[idx]]})
    torch.manual_seed(1)
    noise, time = sample_noise((8, 10, 3))[idx], sample_time(8)[idx]
    actions = torch.from_numpy(Normalizer('MEAN_STD', stats).normalize(demos.actions[idx]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = flow_matching_loss(model, inputs, actions, noise, time)
    loss.backward()
    mean_loss = data_parallel.average_gradients(model.parameters(), loss, worker)
    optimizer.step()
    torch.save({'loss': mean_loss, 'weights': model.state_dict()}, tmp_path / f'step{worker.rank}.pt')


def test_two_workers_on_half_batches_take_the_step_of_one_on_the_whole_batch(tmp_path):
    """Data-parallel training: gradients averaged over two processes equal the whole batch's."""
    data_parallel.run(one_step, 2, tmp_path / 'parallel')
    one_step(data_parallel.Worker(), tmp_path / 'single')
    single = torch.load(tmp_path / 'single' / 'step0.pt')
    for rank in (0, 1):
        parallel = torch.load(tmp_path / 'parallel' / f'step{rank}.pt')
        assert abs(parallel['loss'] - single['loss']) < 1e-6
        for name, tensor in single['weights'].items():
            torch.testing.assert_close(parallel['weights'][name], tensor, atol=1e-6, rtol=0, msg=name)


def test_the_training_command_with_two_workers_writes_a_checkpoint_that_loads(tmp_path):
    assert train_main(['--output', str(tmp_path / 'policy'), '--workers', '2', '--steps', '4', '--episodes', '2',
                       '--batch-size', '4', '--warmup-steps', '1', '--eval-episodes', '1']) == 0
    summary = json.loads((tmp_path / 'policy' / 'train_summary.json').read_text())
    assert summary['config']['workers'] == 2 and summary['threads'] == 1
    assert load_policy(tmp_path / 'policy', device='cpu').family == 'smolvla'


def shard_statistics(worker: data_parallel.Worker, folder) -> None:
    """One worker's share: shards of unequal size, as the episodes' lengths make them."""
    shard = np.random.default_rng(worker.rank).normal(size=(50 + 30 * worker.rank, 4))
    stats = mean_std(shard, worker)
    np.save(folder / f'stats{worker.rank}.npy', np.stack([stats['mean'], stats['std']]))


def test_normalization_statistics_pool_every_workers_demonstrations(tmp_path):
    """Each worker records its own share; both normalize with the statistics of all of them."""
    data_parallel.run(shard_statistics, 2, tmp_path)
    whole = np.concatenate([np.random.default_rng(rank).normal(size=(50 + 30 * rank, 4)) for rank in (0, 1)])
    for rank in (0, 1):
        mean, std = np.load(tmp_path / f'stats{rank}.npy')
        np.testing.assert_allclose(mean, whole.mean(0), atol=1e-6)
        np.testing.assert_allclose(std, whole.std(0), atol=1e-6)
