# SPDX-License-Identifier: Apache-2.0
"""The prefix cache: fill semantics, enforced read-only mode, windows, batch slicing."""

import pytest
import torch

from cache_checks import assert_frozen_prefix_unchanged
from vla_policy_node.model.prefix_cache import ReadOnlyCacheError, VLAPrefixCache


def kv(b=2, h=2, L=5, d=4, dtype=torch.float32):
    return torch.randn(b, h, L, d, dtype=dtype), torch.randn(b, h, L, d, dtype=dtype)


def filled(layers=3, L=5):
    cache = VLAPrefixCache()
    for i in range(layers):
        cache.update(*kv(L=L), i)
    return cache


def test_append_returns_the_new_layer():
    cache = VLAPrefixCache()
    k, v = kv()
    out_k, out_v = cache.update(k, v, 0)
    assert out_k is k and out_v is v
    assert len(cache) == 1 and cache.layer(0)[0] is k


def test_existing_layer_concatenates_on_sequence_dim():
    cache = VLAPrefixCache()
    k1, v1 = kv(L=3)
    k2, v2 = kv(L=4)
    cache.update(k1, v1, 0)
    out_k, out_v = cache.update(k2, v2, 0)
    assert out_k.shape[-2] == 7
    torch.testing.assert_close(out_k, torch.cat([k1, k2], -2))
    torch.testing.assert_close(out_v, torch.cat([v1, v2], -2))
    assert cache.seq_length(0) == 7 and len(cache) == 1


def test_skipping_a_layer_raises_with_the_documented_message():
    cache = filled(layers=2)
    with pytest.raises(IndexError) as err:
        cache.update(*kv(), 5)
    msg = str(err.value)
    assert msg.startswith("Invalid VLA prefix cache layer: 5")
    assert "2 layers are cached" in msg and "must be 2" in msg


def test_read_only_update_returns_concatenation_and_leaves_cache_alone():
    cache = filled(layers=2, L=5)
    before = [(k.clone(), v.clone()) for k, v in cache.layers]
    cache.freeze(num_layers=2)
    sk, sv = kv(L=3)
    out_k, out_v = cache.update(sk, sv, 1)
    torch.testing.assert_close(out_k, torch.cat([before[1][0], sk], -2))
    torch.testing.assert_close(out_v, torch.cat([before[1][1], sv], -2))
    assert cache.seq_length(1) == 5
    for (k, v), (k0, v0) in zip(cache.layers, before):
        assert torch.equal(k, k0) and torch.equal(v, v0)


def test_read_only_is_enforced():
    cache = filled(layers=2)
    cache.freeze()
    with pytest.raises(IndexError, match="Invalid VLA prefix cache layer: 2"):
        cache.update(*kv(L=1), 2)                  # would append a layer
    with pytest.raises(AttributeError):
        cache._keys.append(torch.zeros(1))         # frozen storage is a tuple
    with pytest.raises(ReadOnlyCacheError):
        cache._keys = []
    cache.layer(0)[0].add_(1.0)                    # an in-place write is caught at the next read
    with pytest.raises(ReadOnlyCacheError):
        cache.update(*kv(L=1), 0)


def test_frozen_layer_count_must_match_model():
    cache = filled(layers=3)
    with pytest.raises(ValueError, match="holds 3 layers but the model has 4"):
        cache.freeze(num_layers=4)


@pytest.mark.parametrize("bad, what", [
    (lambda: kv(b=3, L=2)[0], "batch"),
    (lambda: kv(h=1, L=2)[0], "heads"),
    (lambda: kv(d=8, L=2)[0], "head dim"),
    (lambda: kv(L=2, dtype=torch.float64)[0], "dtype"),
    (lambda: torch.randn(2, 2, 4), "(B, H_kv, L, D)"),
])
def test_frozen_cache_rejects_mismatched_suffix(bad, what):
    cache = filled(layers=1)
    cache.freeze()
    with pytest.raises(ValueError) as err:
        s = bad()
        cache.update(s, s, 0)
    assert what in str(err.value)


def test_reset_empties_and_allows_refill():
    cache = filled(layers=2)
    cache.freeze()
    cache.reset()
    assert len(cache) == 0 and not cache.read_only
    cache.update(*kv(), 0)
    assert len(cache) == 1


def test_denoising_steps_leave_prefix_tensors_untouched():
    """Same data pointers, same length, same values after N read-only steps, and no growth."""
    cache = filled(layers=3, L=6)
    cache.freeze(3)
    ptrs = [(k.data_ptr(), v.data_ptr()) for k, v in cache.layers]
    values = [(k.clone(), v.clone()) for k, v in cache.layers]
    scratch = None
    for step in range(10):
        for i in range(3):
            out_k, _ = cache.update(*kv(L=2), i)
            assert out_k.shape[-2] == 8
            if i == 0:
                scratch = scratch or out_k.data_ptr()
                assert out_k.data_ptr() == scratch       # one buffer per control step, reused
    assert [(k.data_ptr(), v.data_ptr()) for k, v in cache.layers] == ptrs
    for (k, v), (k0, v0) in zip(cache.layers, values):
        assert k.shape[-2] == 6 and torch.equal(k, k0) and torch.equal(v, v0)
    assert_frozen_prefix_unchanged(cache)


def test_grad_mode_read_only_update_does_not_reuse_buffers():
    cache = filled(layers=1)
    cache.freeze()
    sk = torch.randn(2, 2, 2, 4, requires_grad=True)
    with torch.enable_grad():
        a, _ = cache.update(sk, sk, 0)
        b, _ = cache.update(sk * 2, sk, 0)
    assert a.data_ptr() != b.data_ptr()
    a.sum().backward()
    assert sk.grad is not None
