# SPDX-License-Identifier: Apache-2.0
"""The compiled path (prefix pass and denoising loop compiled ahead of time) keeps the eager path's actions."""

from cache_checks import assert_frozen_prefix_unchanged
from conftest import fixture_model_inputs, max_diff
import numpy as np
import pytest
from safetensors.torch import load_file
import torch

from vla_policy_node.runtime.engine import COMPILED, EAGER, RuntimeConfig
from vla_policy_node.model.attention import additive_mask, attention, attention_split
from vla_policy_node.control.chunking import RTCGuidance
from vla_policy_node.runtime.compiled import aot_compile, attention_backend
from vla_policy_node.loading.load import load_policy
from vla_policy_node.model.prefix_cache import ReadOnlyCacheError, VLAPrefixCache
from vla_policy_node.loading import build_tiny_policy

TOL = 1e-4      # as the reference tests: the compiler reorders float32 reductions


def random_qkv(heads, kv_heads, lq, lp, ls, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype)
    return (rand(2, heads, lq, 16), (rand(2, kv_heads, lp, 16), rand(2, kv_heads, lp, 16)),
            (rand(2, kv_heads, ls, 16), rand(2, kv_heads, ls, 16)))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (8, 1)])
def test_split_attention_equals_attention_over_the_concatenation(dtype, tol, heads, kv_heads):
    q, (kp, vp), (ks, vs) = random_qkv(heads, kv_heads, lq=5, lp=7, ls=5, dtype=dtype)
    allowed = torch.rand(2, 5, 12, generator=torch.Generator().manual_seed(1)) > 0.3
    allowed[..., 0] = True
    mask = additive_mask(allowed, dtype)
    want = attention(q, torch.cat([kp, ks], -2), torch.cat([vp, vs], -2), mask, "eager")
    got = attention_split(q, (kp, vp), (ks, vs), mask)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert max_diff(got, want) < tol


def test_frozen_view_attends_like_the_cache_and_copies_nothing():
    cache = VLAPrefixCache()
    q, (kp, vp), (ks, vs) = random_qkv(4, 2, lq=3, lp=6, ls=3, dtype=torch.float32)
    with pytest.raises(ReadOnlyCacheError):
        cache.frozen_view()
    for i in range(2):
        cache.update(kp + i, vp - i, i)
    cache.freeze(2)
    view = cache.frozen_view()
    mask = torch.zeros(2, 1, 3, 9)
    for i in range(2):
        assert view.layer(i)[0].data_ptr() == cache.layer(i)[0].data_ptr()
        assert max_diff(view.attend(q, ks, vs, mask, i, "sdpa"), cache.attend(q, ks, vs, mask, i, "sdpa")) < 1e-6
    assert_frozen_prefix_unchanged(cache)


def test_a_program_that_writes_its_inputs_is_refused_before_compiling(tmp_path):
    class WritesItsInput(torch.nn.Module):
        def forward(self, x):
            x.add_(1.0)
            return x * 2.0
    with torch.no_grad(), pytest.raises(RuntimeError, match="writes its inputs"):
        aot_compile(WritesItsInput(), (torch.zeros(3),), tmp_path / "program.pt2")


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_policy(("front",), chunk_size=8, num_steps=2)


def test_compiled_tiny_policy_equals_eager_and_compiles_once(tiny):
    obs = tiny.dummy_observation()
    obs["state"] = np.random.default_rng(0).normal(size=tiny.state_dim)
    noise = np.random.default_rng(1).standard_normal((1, tiny.chunk_size, 32)).astype(np.float32)
    eager = tiny.predict_action_chunk(obs, noise)
    tiny.runtime.path = COMPILED
    tiny.stats.clear()
    try:
        first = tiny.predict_action_chunk(obs, noise)                  # compiles
        obs["state"] = obs["state"] + 0.5
        second = tiny.predict_action_chunk(obs, noise)                 # same shapes: the compiled code again
        assert len(tiny.runtime.compiled_signatures) == 1
        obs["state"] = obs["state"] - 0.5
        tiny.runtime.path = EAGER
        assert np.abs(second - tiny.predict_action_chunk({**obs, "state": obs["state"] + 0.5}, noise)).max() < TOL
    finally:
        tiny.runtime.path = EAGER
    assert np.abs(first - eager).max() < TOL
    assert tiny.model.backend == "sdpa", "the CPU loop was traced with eager attention; the eager path keeps SDPA"
    stats = tiny.stats
    assert stats.prefix_passes == stats.control_steps == 3
    assert stats.denoise_steps == 3 * tiny.num_steps


def test_the_loop_is_traced_with_another_backend_and_the_model_gets_its_own_back():
    model = torch.nn.Linear(1, 1)
    model.backend = "sdpa"
    with attention_backend(model, "eager"):
        assert model.backend == "eager"
    assert model.backend == "sdpa"
    with pytest.raises(RuntimeError, match="export failed"):
        with attention_backend(model, "eager"):
            raise RuntimeError("export failed")
    assert model.backend == "sdpa"
    plain = torch.nn.Linear(1, 1)                    # a model without backends is traced as it is
    with attention_backend(plain, "eager"):
        assert not hasattr(plain, "backend")


def test_two_compiled_policies_keep_their_own_weights(tiny):
    """Same shapes, other weights: each runtime's compiled code (weights built in) is its own."""
    policies = [tiny, build_tiny_policy(("front",), chunk_size=8, num_steps=2, seed=1)]
    obs = tiny.dummy_observation()
    noise = np.random.default_rng(3).standard_normal((1, 8, 32)).astype(np.float32)
    eager = [p.predict_action_chunk(obs, noise) for p in policies]
    assert np.abs(eager[0] - eager[1]).max() > 1e-3
    try:
        for policy, want in zip(policies, eager):
            policy.runtime.path = COMPILED
            assert np.abs(policy.predict_action_chunk(obs, noise) - want).max() < TOL
    finally:
        tiny.runtime.path = EAGER


def test_a_new_input_shape_compiles_again_instead_of_reusing(tiny):
    """A compiled library checks nothing about its inputs: a batch of two must not run the batch-1 code."""
    obs = tiny.dummy_observation()
    batch = {"images": {k: np.stack([v, v]) for k, v in obs["images"].items()},
             "state": np.stack([obs["state"], obs["state"] + 1.0]), "task": [obs["task"]] * 2}
    noise = np.random.default_rng(4).standard_normal((2, 8, 32)).astype(np.float32)
    eager = tiny.predict_action_chunk(batch, noise)
    tiny.runtime.path = COMPILED
    try:
        tiny.predict_action_chunk(obs, noise[:1])
        compiled = tiny.predict_action_chunk(batch, noise)
    finally:
        tiny.runtime.path = EAGER
    assert compiled.shape == eager.shape and np.abs(compiled - eager).max() < TOL
    assert len(tiny.runtime.compiled_signatures) == 2


def test_compiled_runtime_leaves_guided_sampling_eager(tiny):
    obs = tiny.dummy_observation()
    noise = np.random.default_rng(2).standard_normal((1, tiny.chunk_size, 32)).astype(np.float32)
    rtc = RTCGuidance(prefix=np.full((3, tiny.action_dim), 0.1, np.float32), delay_steps=2, max_guidance_weight=5.0)
    eager = tiny.predict_action_chunk(obs, noise, rtc=rtc)
    tiny.runtime.path = COMPILED
    try:
        compiled = tiny.predict_action_chunk(obs, noise, rtc=rtc)      # autograd: the eager loop
    finally:
        tiny.runtime.path = EAGER
    np.testing.assert_array_equal(compiled, eager)


def test_after_the_warm_up_a_new_shape_runs_eager_instead_of_compiling(tiny):
    """The node never compiles mid-control: a shape the warm-up did not see takes the eager path."""
    tiny.runtime.path = COMPILED
    try:
        tiny.warmup(tiny.dummy_observation(), iterations=1)
        seen = len(tiny.runtime.compiled_signatures)
        frame = np.random.default_rng(6).integers(0, 256, (48, 64, 3), dtype=np.uint8)   # a camera's own size
        obs = {"images": {"front": frame}, "state": np.zeros(tiny.state_dim), "task": "wave"}
        noise = np.random.default_rng(7).standard_normal((1, 8, 32)).astype(np.float32)
        compiled = tiny.predict_action_chunk(obs, noise)
        batch = {"images": {"front": np.stack([frame] * 3)}, "state": np.zeros((3, tiny.state_dim)),
                 "task": ["wave"] * 3}
        three = tiny.predict_action_chunk(batch, np.concatenate([noise] * 3))
        assert len(tiny.runtime.compiled_signatures) == seen     # nothing compiled after the warm-up
    finally:
        tiny.runtime.path = EAGER
        tiny.runtime.build_new_signatures = True
    np.testing.assert_allclose(compiled, tiny.predict_action_chunk(obs, noise), atol=TOL)
    np.testing.assert_allclose(three, tiny.predict_action_chunk(batch, np.concatenate([noise] * 3)), atol=TOL)


@pytest.mark.parametrize("family", ["pi0", "pi05"])
def test_compiled_pi_policies_match_lerobot(reference_dir, family):
    """The compiled prefix pass and loop of pi0 / pi0.5 give LeRobot's chunk (the fixture's expected output)."""
    folder = reference_dir(family)
    policy = load_policy(folder)
    policy.runtime.path = COMPILED
    inputs, raw = fixture_model_inputs(folder, with_state=family == "pi0")
    actions = policy.runtime.sample(inputs, raw["noise"])
    expected = load_file(folder / "expected.safetensors")["x_final_padded"]
    assert max_diff(actions, expected) < TOL
    assert policy.stats.prefix_passes == policy.stats.control_steps == 1


def batch_observation(policy, tasks, seed):
    rng = np.random.default_rng(seed)
    b = len(tasks)
    obs = {"images": {n: rng.integers(0, 256, (b, 48, 64, 3), dtype=np.uint8) for n in policy.camera_names},
           "state": rng.normal(size=(b, policy.state_dim)), "task": list(tasks)}
    noise = rng.standard_normal((b, policy.chunk_size, 32)).astype(np.float32)
    return obs, noise


@pytest.mark.parametrize("padding", ["longest", "max_length"])
@pytest.mark.parametrize("tasks", [("wave",), ("wave", "pick up the cube and place it")])
def test_compiled_equals_eager_for_each_padding_and_batch(padding, tasks):
    """Longest padding runs the compiled program of the smallest prompt bucket that holds the prompt."""
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=2, padding=padding)
    assert policy.runtime.prompt_lengths == ((8, 16, 32) if padding == "longest" else ())
    obs, noise = batch_observation(policy, tasks, seed=len(tasks))
    eager = policy.predict_action_chunk(obs, noise)
    policy.runtime.path = COMPILED
    compiled = policy.predict_action_chunk(obs, noise)
    (signature,) = policy.runtime.compiled_signatures
    tokens = signature[2][0]                        # (B, L) of the prompt the program was built for
    assert tokens == (len(tasks), 8 if padding == "longest" and len(tasks) == 1 else 32)   # "wave\n": 5 tokens
    assert compiled.shape == eager.shape
    assert np.abs(compiled - eager).max() < 1e-5


def test_warm_up_compiles_every_prompt_bucket_and_a_restart_loads_them():
    """'longest' padding: the warm-up builds one program pair per bucket; a second start loads all of them."""
    from vla_policy_node.runtime.program_cache import ProgramCache

    stats = []
    for _ in range(2):                              # two starts on one cache folder (the tests' own)
        policy = build_tiny_policy(("front",), chunk_size=8, num_steps=2, padding="longest")
        policy.runtime.path = COMPILED
        policy.runtime.program_cache = ProgramCache()
        policy.warmup(policy.dummy_observation(), iterations=1, race_rounds=1)
        assert sorted(s[2][0][1] for s in policy.runtime.compiled_signatures) == [8, 16, 32]
        stats.append(policy.runtime.program_cache.stats)
    assert stats[0].built + stats[0].loaded == 6
    assert (stats[1].built, stats[1].loaded, stats[1].rebuilt) == (0, 6, 0)
    obs, noise = batch_observation(policy, ["a task of twelve"], seed=9)      # 17 tokens: the 32 bucket
    policy.runtime.path = COMPILED
    compiled = policy.predict_action_chunk(obs, noise)
    policy.runtime.path = EAGER
    assert np.abs(compiled - policy.predict_action_chunk(obs, noise)).max() < 1e-5


def test_a_batch_runs_the_program_of_the_smallest_built_batch_size_that_holds_it():
    """
    A server's batch is padded up to a built size: one row runs the batch-2 program, three run eager.

    The warm-up builds only the listed size (a copy of its row added); nothing is built after it.
    """
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=2)
    runtime = policy.runtime
    runtime.configure(RuntimeConfig(torch_compile=True, batch_sizes=(2,)))
    policy.warmup(policy.dummy_observation(), iterations=1, race_rounds=0)
    (signature,) = runtime.compiled_signatures
    assert signature[2][0] == (2, 32)               # (B, L) of the prompt the program was built for
    ran = []
    compiled_sample = runtime._sample_compiled
    runtime._sample_compiled = lambda inputs, noise, key: ran.append(inputs.batch_size) or compiled_sample(
        inputs, noise, key)
    one, one_noise = batch_observation(policy, ["wave"], seed=11)
    three, three_noise = batch_observation(policy, ["wave", "pick", "place it"], seed=12)
    compiled_one = policy.predict_action_chunk(one, one_noise)
    compiled_three = policy.predict_action_chunk(three, three_noise)
    assert ran == [2] and runtime.compiled_signatures == (signature,)
    runtime.path = EAGER
    assert compiled_one.shape == (1, 8, policy.action_dim)
    assert np.abs(compiled_one - policy.predict_action_chunk(one, one_noise)).max() < 1e-5
    np.testing.assert_array_equal(compiled_three, policy.predict_action_chunk(three, three_noise))
