# SPDX-License-Identifier: Apache-2.0
"""Shape buckets: which batch sizes and prompt lengths are built, and padding a call up to one."""

from hypothesis import given, settings, strategies as st
import numpy as np
import pytest
import torch

from vla_policy_node.core.shape_buckets import (
    batch_buckets, prompt_buckets, smallest_holding, with_batch_size, with_prompt_length)
from vla_policy_node.core.types import ModelInputs
from vla_policy_node.models import build_tiny_policy


def test_bucket_sizes():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(16) == (1, 2, 4, 8, 16)
    assert batch_buckets(6) == (1, 2, 4, 6)
    assert prompt_buckets(48) == (16, 24, 48)
    assert prompt_buckets(200) == (56, 104, 200)
    assert prompt_buckets(5) == (5,)
    for bad, name in ((batch_buckets, "max_batch"), (prompt_buckets, "max_length")):
        with pytest.raises(ValueError, match=name):
            bad(0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 256), st.integers(1, 300))
def test_every_batch_up_to_the_maximum_has_a_bucket_of_at_most_twice_its_rows(max_batch, rows):
    sizes = batch_buckets(max_batch)
    size = smallest_holding(sizes, rows)
    if rows > max_batch:
        assert size is None
    else:
        assert rows <= size < 2 * rows and size <= max_batch


def inputs(batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ModelInputs(images=[torch.rand(batch, 3, 8, 8, generator=g)],
                       image_masks=[torch.tensor([True, False, True][:batch] + [True] * max(0, batch - 3))],
                       tokens=torch.randint(1, 100, (batch, length), generator=g),
                       token_mask=torch.ones(batch, length, dtype=torch.bool),
                       state=torch.rand(batch, 4, generator=g))


def test_a_padded_batch_keeps_its_rows_and_repeats_the_last():
    x = inputs(3, 5)
    noise = torch.randn(3, 2, 4)
    padded, padded_noise = with_batch_size(x, noise, 8)
    assert padded.batch_size == 8 and padded_noise.shape == (8, 2, 4)
    for got, want in ((padded.images[0], x.images[0]), (padded.image_masks[0], x.image_masks[0]),
                      (padded.tokens, x.tokens), (padded.token_mask, x.token_mask), (padded.state, x.state),
                      (padded_noise, noise)):
        assert torch.equal(got[:3], want)
        assert all(torch.equal(got[i], want[2]) for i in range(3, 8))
    cut, cut_noise = with_batch_size(x, noise, 2)
    assert cut.batch_size == 2 and torch.equal(cut.tokens, x.tokens[:2]) and torch.equal(cut_noise, noise[:2])


def test_a_padded_prompt_is_masked():
    x = inputs(2, 5)
    longer = with_prompt_length(x, 8)
    assert longer.tokens.shape == (2, 8) and not longer.token_mask[:, 5:].any()
    assert torch.equal(longer.tokens[:, :5], x.tokens) and (longer.tokens[:, 5:] == 0).all()


def test_rows_of_a_padded_batch_come_out_as_they_would_alone():
    """The premise of batch buckets: the extra rows change nothing in the real ones (eager path)."""
    policy = build_tiny_policy(("front", "wrist"), chunk_size=8, num_steps=3)
    rng = np.random.default_rng(3)
    obs = {"images": {n: rng.integers(0, 256, (3, 48, 64, 3), dtype=np.uint8) for n in policy.camera_names},
           "state": rng.normal(size=(3, policy.state_dim)), "task": ["wave", "pick the cube", "stop"]}
    x = policy.preprocessor(obs).to(policy.device, policy.dtype)
    noise = torch.from_numpy(rng.standard_normal((3, 8, 32)).astype(np.float32))
    alone = policy.runtime.sample(x, noise)
    padded, padded_noise = with_batch_size(x, noise, 4)
    assert (policy.runtime.sample(padded, padded_noise)[:3] - alone).abs().max() < 1e-5


def test_dropping_batch_sizes_frees_what_was_built_for_them():
    """A dropped bucket's programs go too: a batch of exactly that size must then run eager, as the log says."""
    from vla_policy_node.core.compiled import input_signature

    runtime = build_tiny_policy(("front", "wrist"), chunk_size=8, num_steps=2).runtime
    for rows in (1, 2, 4, 8):
        x = inputs(rows, 5)
        runtime._compiled[input_signature(x, torch.zeros(rows, 8, 32))] = f"program of {rows}"
    runtime.keep_batch_sizes((1, 2))
    assert runtime.batch_sizes == (1, 2)
    assert sorted(runtime._compiled.values()) == ["program of 1", "program of 2"]
