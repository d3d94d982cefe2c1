# SPDX-License-Identifier: Apache-2.0
"""Traced eager chunks (``runtime/traced.py``): eager's bits, checked before use, Python wherever there is no trace."""

from cache_checks import assert_frozen_prefix_unchanged
import numpy as np
import pytest
from test_int8_linear import INT8_ACTION_ATOL, LEROBOT061, observation_061, relative_error
import torch

from vla_policy_node.control.chunking import RTCGuidance
from vla_policy_node.loading import build_tiny_policy, load_policy
from vla_policy_node.runtime import traced
from vla_policy_node.runtime.engine import RuntimeConfig
from vla_policy_node.runtime.shape_buckets import without_shared_padding


def observation(policy, seed: int, task: str) -> dict:
    rng = np.random.default_rng(seed)
    h, w = policy.preprocessor.image_size
    return {"images": {n: rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for n in policy.camera_names},
            "state": rng.normal(size=policy.state_dim).astype(np.float32), "task": task}


def noise_for(policy, seed: int) -> np.ndarray:
    shape = (1, policy.chunk_size, policy.model.max_action_dim)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def traced_policy(policy):
    policy.runtime.configure(RuntimeConfig(trace=True))
    policy.warmup(policy.dummy_observation())
    return policy


def python_chunk(policy, obs: dict, noise: np.ndarray, bucket: bool = True) -> np.ndarray:
    """Return eager Python's chunk on the prompt padded to its bucket (as traced), or stripped (as untraced)."""
    runtime = policy.runtime
    inputs = without_shared_padding(policy.preprocessor(obs).to(policy.device, policy.dtype))
    if bucket:
        inputs = runtime.traces.shaped(inputs)
    actions = runtime._sample_eager(inputs, torch.as_tensor(noise))
    return policy.action_normalizer.unnormalize(actions[..., :policy.action_dim].float().numpy())


@pytest.fixture(scope="module")
def tiny():
    return traced_policy(build_tiny_policy(("front", "wrist"), chunk_size=8, num_steps=3))


def test_the_warm_up_traces_every_prompt_bucket_and_replays_them_with_eagers_bits(tiny):
    runtime = tiny.runtime
    assert runtime.tracing and runtime.traces.report == ""
    assert sorted(sig[-4][0][1] for sig in runtime.traces.signatures) == list(runtime.traces.prompt_lengths)
    for seed, task in enumerate(("go", "pick up the red cube and put it in the box on the left")):
        obs, noise = observation(tiny, seed, task), noise_for(tiny, seed)
        tiny.stats.clear()
        got = tiny.predict_action_chunk(obs, noise)
        assert (tiny.stats.prefix_passes, tiny.stats.denoise_steps) == (1, tiny.num_steps)
        assert np.array_equal(got, python_chunk(tiny, obs, noise))


def test_a_traced_chunk_leaves_the_cache_frozen_with_eagers_prefix(tiny):
    obs, noise = observation(tiny, 3, "stack the blocks"), noise_for(tiny, 3)
    tiny.predict_action_chunk(obs, noise)
    traced_kv = [tuple(t.clone() for t in kv) for kv in tiny.runtime.cache.layers]
    assert tiny.runtime.cache.read_only
    assert_frozen_prefix_unchanged(tiny.runtime.cache)
    python_chunk(tiny, obs, noise)
    for (k, v), (k2, v2) in zip(traced_kv, tiny.runtime.cache.layers):
        assert torch.equal(k, k2) and torch.equal(v, v2)


def test_shapes_the_warm_up_did_not_trace_run_in_python(tiny):
    obs = [observation(tiny, s, "push the button") for s in (4, 5)]
    noise = np.concatenate([noise_for(tiny, 4), noise_for(tiny, 5)])
    batch = tiny.predict_action_chunks(obs, [None, None], noise)         # batch 2: never traced
    for row in range(2):
        alone = tiny.predict_action_chunk(obs[row], noise[row:row + 1])
        np.testing.assert_allclose(batch[row], alone[0], atol=1e-5)


def test_guided_chunks_run_in_python_with_autograd(tiny):
    obs, noise = observation(tiny, 6, "wipe the table"), noise_for(tiny, 6)
    committed = tiny.predict_action_chunk(obs, noise)[0, :4]
    guided = tiny.predict_action_chunk(obs, noise, rtc=RTCGuidance(committed, delay_steps=2, max_guidance_weight=5.0))
    assert not np.array_equal(guided, tiny.predict_action_chunk(obs, noise))


def test_a_trace_that_bakes_an_input_value_is_refused_and_python_runs(monkeypatch):
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=2)
    model = policy.model
    velocity = type(model).velocity

    def baking(self, x_t, time_cond, ctx):
        # a Python number read off the input: a trace keeps the example's value as a constant
        return velocity(self, x_t, time_cond, ctx) + float(x_t.abs().max())
    monkeypatch.setattr(type(model), "velocity", baking)
    traced_policy(policy)
    assert policy.runtime.traces.signatures == ()
    assert "differ from eager" in policy.runtime.traces.report
    obs, noise = observation(policy, 7, "open the drawer"), noise_for(policy, 7)
    assert np.array_equal(policy.predict_action_chunk(obs, noise), python_chunk(policy, obs, noise, bucket=False))


def test_a_tracer_that_fails_leaves_the_policy_in_python(monkeypatch):
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=2)

    def broken(*args, **kwargs):
        raise RuntimeError("tracer exploded\nsecond line")
    monkeypatch.setattr(torch.jit, "trace", broken)
    traced_policy(policy)
    assert policy.runtime.traces.signatures == ()
    assert policy.runtime.traces.report.endswith("tracing failed: RuntimeError: tracer exploded")
    obs, noise = observation(policy, 8, "fold the towel"), noise_for(policy, 8)
    assert np.array_equal(policy.predict_action_chunk(obs, noise), python_chunk(policy, obs, noise, bucket=False))


def test_traces_are_off_by_default_in_the_library():
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=2)
    policy.warmup(policy.dummy_observation())
    assert not policy.runtime.tracing and policy.runtime.traces.signatures == ()
    assert traced.available()


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("family", ["smolvla", "pi0", "pi05"])
def test_traced_reference_policies_give_eagers_bits(family, dtype):
    policy = load_policy(LEROBOT061 / family, device="cpu", dtype=dtype)
    traced_policy(policy)
    assert len(policy.runtime.traces.signatures) == len(policy.runtime.traces.prompt_lengths), \
        policy.runtime.traces.report
    obs, noise = observation(policy, 9, "put the cup on the plate"), noise_for(policy, 9)
    assert np.array_equal(policy.predict_action_chunk(obs, noise), python_chunk(policy, obs, noise))


@pytest.mark.parametrize("name", ["smolvla", "pi0", "pi05", "pi0_relative", "pi05_relative"])
def test_traced_int8_stays_within_its_bound_of_float32(name):
    """The traced prompt is padded to its bucket, which int8's per-tensor activation scales see: still in bound."""
    obs, noise = observation_061(LEROBOT061 / name)
    f32 = load_policy(LEROBOT061 / name, device="cpu").predict_action_chunk(obs, noise=noise)
    int8 = traced_policy(load_policy(LEROBOT061 / name, device="cpu", dtype="int8"))
    assert int8.runtime.traces.signatures
    assert 0.0 < relative_error(int8.predict_action_chunk(obs, noise=noise), f32) < INT8_ACTION_ATOL
