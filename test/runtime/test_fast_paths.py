# SPDX-License-Identifier: Apache-2.0
"""The fast paths keep the reference path's outputs: fused kernels, no per-step prefix copy, CUDA graphs, bfloat16."""

import copy

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from vla_policy_node.runtime.engine import EAGER, RuntimeConfig
from vla_policy_node.model import packed_linear
from vla_policy_node.model.blocks import AttentionProjections, GatedMLP, RMSNorm
from vla_policy_node.model.families.smolvla import SmolVLA
from vla_policy_node.loading.load import init_weights, tiny_smolvla_config
from vla_policy_node.model.packed_linear import PackedLinear
from vla_policy_node.model.rope import apply_rope, rope_cos_sin
from vla_policy_node.runtime.engine import PolicyRuntime
from vla_policy_node.loading import build_tiny_policy

# bfloat16 weights and activations (norms, time MLP and action projections in float32) against
# float32, same weights and noise; measured 0.012 (tiny) and 0.02 (SmolVLA size, random weights)
# on actions of magnitude ~3, see BENCHMARKS.md.
BF16_ATOL = 0.05


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(("front", "wrist"), chunk_size=16, num_steps=5)


def inputs_and_noise(policy, seed=0):
    obs = policy.dummy_observation()
    obs["state"] = np.random.default_rng(seed).normal(size=policy.state_dim)
    inputs = policy.preprocessor(obs).to(policy.device, policy.dtype)
    noise = torch.randn(1, policy.chunk_size, 32, generator=torch.Generator().manual_seed(seed))
    return inputs, noise


def reference_rope(x, positions, head_dim, base):
    """Apply the textbook split-half rotation, slice by slice."""
    half = head_dim // 2
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = positions.float()[..., None] * inv
    cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def test_rope_is_bit_exact():
    x = torch.randn(2, 3, 7, 16)
    positions = torch.arange(14).view(2, 7) * 37
    got = apply_rope(x, *rope_cos_sin(positions, 16, 10000.0))
    assert torch.equal(got, reference_rope(x, positions, 16, 10000.0))
    got_bf16 = apply_rope(x.bfloat16(), *rope_cos_sin(positions, 16, 10000.0))
    assert got_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(got_bf16.float(), got, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_formula(offset, dtype):
    norm = RMSNorm(24, 1e-6, offset)
    with torch.no_grad():
        norm.weight.normal_()
    x = (torch.randn(2, 5, 24) * 4).to(dtype)
    xf = x.float()
    want = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (offset + norm.weight)).to(dtype)
    got, gate = norm(x)
    assert gate is None and got.dtype == dtype
    torch.testing.assert_close(got, want, atol=1e-6 if dtype == torch.float32 else 1e-2, rtol=1e-6)


def test_fused_projections_equal_unfused_and_keep_the_state_dict():
    torch.manual_seed(0)
    attn, mlp = AttentionProjections(32, 4, 2, 8), GatedMLP(32, 64, "silu")
    cross = AttentionProjections(32, 4, 2, 8, kv_in_dim=16)
    x = torch.randn(2, 5, 32)
    want_qkv, want_mlp = (attn.q(x), *attn.kv(x)), mlp(x)
    keys = {m: copy.deepcopy(m.state_dict()) for m in (attn, mlp, cross)}
    for m in (attn, mlp, cross):
        m.fuse()
    assert cross.qkv_weight is None                      # k/v read another input: not fused
    for got, want in zip(attn.qkv(x), want_qkv):
        assert torch.equal(got, want)
    assert torch.equal(mlp(x), want_mlp)
    for m, before in keys.items():
        after = m.state_dict()
        assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    with torch.no_grad():                                # loading into the views writes the fused matrix
        attn.k_proj.weight.copy_(torch.ones_like(attn.k_proj.weight))
    assert torch.equal(attn.qkv_weight[32:48], torch.ones(16, 32))


def plain_tiny_model(policy):
    """Rebuild the tiny policy's model from its seed: no fused projections, no packed weights."""
    cfg = tiny_smolvla_config(("front", "wrist"), 6, 6, policy.chunk_size, policy.num_steps)
    model = SmolVLA(cfg)
    init_weights(model, torch.Generator().manual_seed(0))
    return model.eval()


@pytest.mark.parametrize("pack_all", [False, True])
def test_fast_policy_equals_plain_model(policy, pack_all, monkeypatch):
    """The policy (fused projections, oneDNN-packed weights) against the plain modules, naive path."""
    if pack_all:                   # the tiny weights are below the packing threshold: pack them anyway
        monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 0)
        policy = build_tiny_policy(("front", "wrist"), chunk_size=16, num_steps=5)
    fc1 = policy.model.vision.encoder.layers[0].mlp.fc1
    assert isinstance(fc1, PackedLinear) == (pack_all and packed_linear.available())
    inputs, noise = inputs_and_noise(policy)
    fast = policy.runtime.sample(inputs, noise)
    ref = PolicyRuntime(plain_tiny_model(policy), policy.num_steps, policy.device).sample_naive(inputs, noise)
    torch.testing.assert_close(fast, ref, atol=2e-5, rtol=0)


def test_packed_linear_matches_float64():
    """Check oneDNN's packed float32 matmul is as accurate as MKL's (both against float64), and grads still flow."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(1024, 96)
    x = torch.randn(3, 50, 1024)
    exact = (x.double() @ lin.weight.double().t() + lin.bias.double())
    plain_err = (lin(x).double() - exact).abs().max()
    packed = packed_linear.pack(lin.weight)
    assert (packed is not None) == packed_linear.available()
    got = packed_linear.linear(x, lin.weight, lin.bias, packed)
    assert (got.double() - exact).abs().max() < 4 * plain_err + 1e-6
    xg = x.clone().requires_grad_()
    packed_linear.linear(xg, lin.weight, lin.bias, packed).sum().backward()     # autograd: the plain path
    assert xg.grad is not None


def allocations(runtime, inputs, noise):
    runtime.sample(inputs, noise)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        runtime.sample(inputs, noise)
    return [e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0]


def test_no_allocation_grows_with_the_number_of_steps(policy):
    """The prefix is copied once per control step; each denoising step allocates the same bytes."""
    inputs, noise = inputs_and_noise(policy)
    runs = {n: PolicyRuntime(policy.model, n, policy.device) for n in (5, 10, 20)}
    allocs = {n: allocations(rt, inputs, noise) for n, rt in runs.items()}
    k = runs[5].cache.layer(0)[0]                                  # (B, H_kv, Lp, D)
    scratch = k.numel() // k.shape[2] * (k.shape[2] + policy.chunk_size) * k.element_size()
    copies = {n: sum(1 for a in allocs[n] if a == scratch) for n in allocs}
    assert copies[5] == copies[10] == copies[20] > 0       # k and v of each self-attention layer
    per_step = [(sum(allocs[b]) - sum(allocs[a])) / (b - a) for a, b in ((5, 10), (10, 20))]
    assert per_step[0] == per_step[1]
    assert max(allocs[5]) == max(allocs[20])


def test_cuda_graph_flag_falls_back_to_eager_on_cpu(policy):
    inputs, noise = inputs_and_noise(policy)
    rt = PolicyRuntime(policy.model, policy.num_steps, torch.device("cpu"), config=RuntimeConfig(cuda_graphs=True))
    assert rt.config.cuda_graphs and not rt.cuda_graphs_active
    torch.testing.assert_close(rt.sample(inputs, noise), policy.runtime.sample(inputs, noise), atol=0, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_replay_equals_eager():
    gpu = build_tiny_policy(("front", "wrist"), chunk_size=16, num_steps=5, device="cuda")
    eager = PolicyRuntime(gpu.model, gpu.num_steps, gpu.device)
    graphed = PolicyRuntime(gpu.model, gpu.num_steps, gpu.device, RuntimeConfig(cuda_graphs=True))
    for seed in range(3):                                   # capture, then replays with new inputs
        inputs, noise = inputs_and_noise(gpu, seed)
        torch.testing.assert_close(graphed.sample(inputs, noise), eager.sample(inputs, noise), atol=1e-5, rtol=0)
    assert len(graphed._graphs) == 1
    assert graphed.stats.prefix_passes == 3 and graphed.stats.denoise_steps == 3 * gpu.num_steps


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_serve_longest_padding_and_batches_from_the_warm_up_buckets():
    """Graphs are captured for every prompt length and batch bucket in the warm-up; none after it."""
    gpu = build_tiny_policy(("front",), chunk_size=8, num_steps=2, device="cuda", padding="longest")
    runtime = gpu.runtime
    runtime.configure(RuntimeConfig(cuda_graphs=True, batch_sizes=(1, 2, 4)))
    gpu.warmup(gpu.dummy_observation(), iterations=1)
    assert len(runtime.graphed_signatures) == 3 * 3         # prompt lengths (8, 16, 32) times batch sizes
    rng = np.random.default_rng(5)
    obs = {"images": {"front": rng.integers(0, 256, (3, 48, 64, 3), dtype=np.uint8)},
           "state": rng.normal(size=(3, gpu.state_dim)), "task": ["wave", "pick the cube up", "x" * 40]}
    noise = rng.standard_normal((3, 8, 32)).astype(np.float32)
    replayed = []
    replay = runtime._sample_graphed
    runtime._sample_graphed = lambda inputs, noise, key: replayed.append(tuple(inputs.tokens.shape)) or replay(
        inputs, noise, key)
    graphed = gpu.predict_action_chunk(obs, noise)          # batch 3, prompts cut to 32 tokens: the (4, 32) graphs
    assert replayed == [(4, 32)] and len(runtime.graphed_signatures) == 9
    runtime.path = EAGER
    assert np.abs(graphed - gpu.predict_action_chunk(obs, noise)).max() < 1e-5


def test_bfloat16_within_documented_tolerance(policy):
    bf16 = build_tiny_policy(("front", "wrist"), chunk_size=16, num_steps=5, dtype="bfloat16")
    obs = policy.dummy_observation()
    noise = np.random.default_rng(0).standard_normal((1, 16, 32)).astype(np.float32)
    diff = np.abs(bf16.predict_action_chunk(obs, noise) - policy.predict_action_chunk(obs, noise)).max()
    assert 0 < diff < BF16_ATOL
