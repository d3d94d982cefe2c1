# SPDX-License-Identifier: Apache-2.0
"""Shape buckets: which batch sizes and prompt lengths are built, and padding a call up to one."""

from hypothesis import given, settings, strategies as st
import numpy as np
import pytest
import torch

from vla_policy_node.model.flow import euler_integrate
from vla_policy_node.runtime.shape_buckets import (batch_buckets, prompt_buckets, smallest_holding, with_batch_size,
                                                   with_prompt_length, without_shared_padding)
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.loading import build_tiny_policy


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


def test_prompt_positions_that_are_padding_in_every_row_are_dropped():
    x = inputs(3, 6)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0],
                         [1, 0, 0, 1, 1, 0],
                         [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    x = ModelInputs(x.images, x.image_masks, x.tokens, mask, x.state)
    trimmed = without_shared_padding(x)
    keep = [0, 1, 3, 4]                                   # 2 and 5 are padding in every row
    assert torch.equal(trimmed.tokens, x.tokens[:, keep]) and torch.equal(trimmed.token_mask, mask[:, keep])
    assert trimmed.images is x.images and trimmed.state is x.state and trimmed.image_masks is x.image_masks
    full = inputs(2, 5)
    assert without_shared_padding(full) is full                            # nothing to drop
    empty = ModelInputs(full.images, full.image_masks, full.tokens, torch.zeros(2, 5, dtype=torch.bool), full.state)
    assert without_shared_padding(empty) is empty                          # no prompt at all: left as it is
    on_device = ModelInputs(x.images, x.image_masks, x.tokens.to("meta"), mask.to("meta"), x.state)
    assert without_shared_padding(on_device) is on_device                  # reading it would wait for a GPU


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=12), min_size=1, max_size=5).filter(
    lambda rows: len({len(r) for r in rows}) == 1))
def test_trimming_keeps_exactly_the_positions_some_row_uses_in_order(rows):
    mask = torch.tensor(rows)
    tokens = torch.arange(mask.numel()).view(mask.shape)
    x = ModelInputs([], [], tokens, mask, None)
    trimmed = without_shared_padding(x)
    used = [j for j in range(mask.shape[1]) if mask[:, j].any()]
    if used and len(used) < mask.shape[1]:
        assert torch.equal(trimmed.tokens, tokens[:, used]) and torch.equal(trimmed.token_mask, mask[:, used])
    else:
        assert trimmed is x


def test_eager_sampling_skips_shared_padding_with_the_same_actions():
    """``max_length`` padding: the eager path drops what no row reads, and the actions do not move."""
    policy = build_tiny_policy(("front", "wrist"), chunk_size=8, num_steps=3)
    rng = np.random.default_rng(5)
    obs = {"images": {n: rng.integers(0, 256, (2, 48, 64, 3), dtype=np.uint8) for n in policy.camera_names},
           "state": rng.normal(size=(2, policy.state_dim)), "task": ["wave", "pick the red cube"]}
    x = policy.preprocessor(obs).to(policy.device, policy.dtype)
    padded = with_prompt_length(x, x.tokens.shape[1] + 9)                  # nine positions no row uses
    noise = torch.from_numpy(rng.standard_normal((2, 8, 32)).astype(np.float32))
    rt, model = policy.runtime, policy.model
    with torch.inference_mode():
        rt.cache.reset()
        ctx = model.encode_prefix(padded, rt.cache)                        # every layer over the padding
        rt.cache.freeze(model.num_cache_layers)
        full_length = rt.cache.seq_length()
        reference = euler_integrate(lambda x_t, k: model.velocity(x_t, rt.time_cond[k], ctx), noise, rt.dt,
                                    rt.num_steps)
    actions = rt.sample(padded, noise)
    unused = int((~padded.token_mask.any(0)).sum())                      # max_length padding + the nine
    assert unused >= 9 and rt.cache.seq_length() == full_length - unused
    assert (actions - reference).abs().max() < 1e-6
    assert torch.equal(actions, rt.sample(x, noise))


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
    from vla_policy_node.runtime.compiled import input_signature

    runtime = build_tiny_policy(("front", "wrist"), chunk_size=8, num_steps=2).runtime
    for rows in (1, 2, 4, 8):
        x = inputs(rows, 5)
        runtime._compiled[input_signature(x, torch.zeros(rows, 8, 32))] = f"program of {rows}"
    runtime.keep_batch_sizes((1, 2))
    assert runtime.batch_sizes == (1, 2)
    assert sorted(runtime._compiled.values()) == ["program of 1", "program of 2"]
