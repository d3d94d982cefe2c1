# SPDX-License-Identifier: Apache-2.0
"""PolicyRuntime and Policy on the tiny model: prefix once per step, counters, equality with the naive path."""

import threading

import numpy as np
import pytest
import torch

from vla_policy_node.runtime.policy import cpu_threads
from vla_policy_node.loading import build_tiny_policy


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(("front", "wrist"), state_dim=6, action_dim=6, chunk_size=8, num_steps=4)


def obs(policy, task="pick the cube", batch=None):
    rng = np.random.default_rng(0)
    shape = (48, 64, 3) if batch is None else (batch, 48, 64, 3)
    state = rng.normal(size=6 if batch is None else (batch, 6))
    return {"images": {"front": rng.integers(0, 255, shape, dtype=np.uint8),
                       "observation.images.wrist": rng.integers(0, 255, shape, dtype=np.uint8)},
            "state": state, "task": task}


def test_one_prefix_pass_per_control_step(policy):
    s = policy.stats
    before = (s.control_steps, s.prefix_passes, s.denoise_steps)
    for _ in range(3):
        out = policy.predict_action_chunk(obs(policy))
        assert out.shape == (1, 8, 6) and out.dtype == np.float32 and np.all(np.isfinite(out))
    assert s.control_steps - before[0] == 3
    assert s.prefix_passes - before[1] == 3
    assert s.denoise_steps - before[2] == 3 * policy.num_steps


def test_cached_path_equals_naive_recompute(policy):
    rt = policy.runtime
    inputs = policy.preprocessor(obs(policy)).to(policy.device, policy.dtype)
    noise = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(3))
    cached = rt.sample(inputs, noise)
    passes = rt.stats.prefix_passes
    naive = rt.sample_naive(inputs, noise)
    assert rt.stats.prefix_passes - passes == policy.num_steps
    torch.testing.assert_close(cached, naive, atol=1e-6, rtol=0)


def test_noise_makes_result_deterministic(policy):
    noise = np.random.default_rng(1).normal(size=(1, 8, 32)).astype(np.float32)
    a = policy.predict_action_chunk(obs(policy), noise=noise)
    b = policy.predict_action_chunk(obs(policy), noise=noise)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="noise must have shape"):
        policy.predict_action_chunk(obs(policy), noise=noise[:, :4])


def test_batch_with_different_tasks_matches_single_runs(policy):
    noise = np.random.default_rng(2).normal(size=(2, 8, 32)).astype(np.float32)
    o = obs(policy, task=["pick the cube", "open the drawer now"], batch=2)
    passes = policy.stats.prefix_passes
    both = policy.predict_action_chunk(o, noise=noise)
    assert policy.stats.prefix_passes - passes == 1
    for i in range(2):
        single = {"images": {k: v[i] for k, v in o["images"].items()}, "state": o["state"][i], "task": o["task"][i]}
        np.testing.assert_allclose(both[i], policy.predict_action_chunk(single, noise=noise[i:i + 1])[0], atol=1e-5)


def test_missing_camera_is_masked_not_faked(policy):
    o = obs(policy)
    del o["images"]["front"]
    inputs = policy.preprocessor(o)
    assert not inputs.image_masks[0].any() and inputs.image_masks[1].all()
    assert np.all(np.isfinite(policy.predict_action_chunk(o)))


def test_reset_empties_the_cache_and_counts(policy):
    policy.predict_action_chunk(obs(policy))
    assert len(policy.runtime.cache) > 0
    resets = policy.stats.cache_resets
    policy.reset()
    assert len(policy.runtime.cache) == 0 and policy.stats.cache_resets == resets + 1


@pytest.mark.parametrize("bad, message", [
    (lambda o: o.update(state=[np.nan] * 6), "non-finite"),
    (lambda o: o.update(state=[0.0] * 5), "state must be"),
    (lambda o: o.update(task=""), "empty"),
    (lambda o: o.update(task="x" * 10000), "limit"),
    (lambda o: o["images"].update(front=np.zeros((4, 4), np.uint8)), "uint8 (H, W, 3)"),
    (lambda o: o["images"].update(front=np.zeros((4, 4, 3), np.float32)), "uint8 (H, W, 3)"),
    (lambda o: o["images"].update(side=np.zeros((4, 4, 3), np.uint8)), "unknown cameras"),
])
def test_bad_observations_raise_clear_errors(policy, bad, message):
    o = obs(policy)
    bad(o)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        policy.predict_action_chunk(o)


def test_surrogates_in_the_task_are_tolerated(policy):
    assert np.all(np.isfinite(policy.predict_action_chunk(obs(policy, task="pick \ud800 up"))))


def test_latency_percentiles_are_recorded(policy):
    policy.predict_action_chunk(obs(policy))
    for stage in ("preprocess", "prefix", "denoise", "postprocess", "total"):
        p50, p95 = policy.stats.latency(stage)
        assert 0 < p50 <= p95


def test_bfloat16_tiny_policy_runs_close_to_float32():
    f32 = build_tiny_policy(("front",), chunk_size=8, num_steps=4, dtype="float32")
    bf16 = build_tiny_policy(("front",), chunk_size=8, num_steps=4, dtype="bfloat16")
    assert bf16.model.action_out_proj.weight.dtype == torch.float32
    assert bf16.model.vlm_layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    o = {"images": {"front": np.full((32, 32, 3), 90, np.uint8)}, "state": np.zeros(6), "task": "go"}
    noise = np.random.default_rng(0).normal(size=(1, 8, 32)).astype(np.float32)
    np.testing.assert_allclose(bf16.predict_action_chunk(o, noise), f32.predict_action_chunk(o, noise), atol=0.05)


def test_warmup_does_not_count_as_control_steps():
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=3)
    policy.warmup(policy.dummy_observation())
    s = policy.stats
    assert (s.control_steps, s.prefix_passes, s.denoise_steps, s.cache_resets) == (0, 0, 0, 0)
    assert np.isnan(s.latency("total")[0]) and len(policy.runtime.cache) == 0


def thread_sensitive(policy, monkeypatch, clock, seconds_by_threads):
    """Make each chunk take, by ``clock``, a time set by its torch thread count; returns the counts seen."""
    sample, seen = policy.runtime.sample, []

    def timed(*args, **kwargs):
        seen.append(torch.get_num_threads())
        clock.sleep(seconds_by_threads(seen[-1]))
        return sample(*args, **kwargs)
    monkeypatch.setattr(policy.runtime, "sample", timed)
    return seen


@pytest.mark.parametrize("one_thread_s, two_threads_s, kept", [(0.002, 0.03, 1), (0.03, 0.002, 2)])
def test_warmup_keeps_the_faster_cpu_thread_count_for_its_own_chunks_only(monkeypatch, simulated_time,
                                                                          one_thread_s, two_threads_s, kept):
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=3)
    seen = thread_sensitive(policy, monkeypatch, simulated_time,
                            lambda n: one_thread_s if n == 1 else two_threads_s)
    with cpu_threads(2):
        policy.warmup(policy.dummy_observation())
        assert {1, 2} <= set(seen)                                 # both raced
        assert policy.threads == kept and f"CPU threads: {kept} of 2 kept" in policy.threads_report
        assert torch.get_num_threads() == 2                        # the process setting is untouched
        seen.clear()
        worker = threading.Thread(target=policy.predict_action_chunk, args=(policy.dummy_observation(),))
        worker.start()
        worker.join()
        policy.predict_action_chunk(policy.dummy_observation())
        assert seen == [kept, kept] and torch.get_num_threads() == 2     # any calling thread, then restored
    s = policy.stats
    assert (s.control_steps, s.prefix_passes) == (2, 2)            # the race was warm-up, not control steps


def test_no_thread_race_with_one_thread_or_a_compute_bound_chunk(monkeypatch, simulated_time):
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=3)
    with cpu_threads(1):
        policy.warmup(policy.dummy_observation())
    assert policy.threads is None and policy.threads_report == ""
    seen = thread_sensitive(policy, monkeypatch, simulated_time, lambda n: 0.6)   # over 0.5 s: every thread pays
    with cpu_threads(2):
        policy.warmup(policy.dummy_observation(), iterations=1)
    assert policy.threads is None and policy.threads_report == "" and set(seen) == {2}


def test_thread_choice_leaves_the_actions_unchanged(monkeypatch, simulated_time):
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=3)
    o = policy.dummy_observation()
    noise = np.random.default_rng(1).normal(size=(1, 8, 32)).astype(np.float32)
    with cpu_threads(2):
        reference = policy.predict_action_chunk(o, noise)
        thread_sensitive(policy, monkeypatch, simulated_time, lambda n: 0.0 if n == 1 else 0.03)
        policy.warmup(o)
        assert policy.threads == 1
        np.testing.assert_allclose(policy.predict_action_chunk(o, noise), reference, atol=1e-6)
