# SPDX-License-Identifier: Apache-2.0
"""Eager inference writes into its own temporaries only where that gives the same bits and autograd is off."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vla_policy_node.model import in_place
from vla_policy_node.loading import build_tiny_policy


def test_add_writes_into_the_temporary_only_without_autograd():
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    want = x + y
    with torch.no_grad():
        out = in_place.add(x, y.clone())
    assert torch.equal(out, want)
    with torch.inference_mode():
        y2 = y.clone()
        assert in_place.add(x, y2) is y2 and torch.equal(y2, want)
    y3 = y.clone().requires_grad_()
    out = in_place.add(x, y3)                              # autograd on: a new tensor, y untouched
    assert out is not y3 and torch.equal(y3.detach(), y) and out.grad_fn is not None


@pytest.mark.parametrize("x", [torch.randn(1, 3), torch.randn(2, 3, dtype=torch.float64)])
def test_add_takes_a_new_tensor_where_writing_into_y_would_change_the_result(x):
    """Broadcasting x or promoting the dtype: in place would give another shape or precision."""
    y = torch.randn(2, 3)
    with torch.inference_mode():
        out = in_place.add(x, y)
        assert out is not y and torch.equal(out, x + y) and out.dtype == (x + y).dtype


def test_silu_of_sum_matches_the_out_of_place_arithmetic():
    y, bias = torch.randn(4, 5, 6), torch.randn(1, 1, 6)
    want = F.silu(y + bias)
    with torch.inference_mode():
        y2 = y.clone()
        assert in_place.silu_of_sum(y2, bias) is y2 and torch.equal(y2, want)
        half = torch.randn(1, 1, 6, dtype=torch.float64)
        assert torch.equal(in_place.silu_of_sum(y, half), F.silu(y + half))      # promotes: a new tensor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_tanh_in_place_has_the_bits_of_f_gelu(dtype):
    y = (torch.randn(3, 7, 130) * 4).to(dtype)
    want = F.gelu(y, approximate="tanh")
    with torch.inference_mode():
        y2 = y.clone()
        assert in_place.gelu_tanh(y2) is y2 and torch.equal(y2, want)
    y3 = y.clone().requires_grad_(dtype == torch.float32)
    out = in_place.gelu_tanh(y3)
    assert torch.equal(out.detach(), want) and torch.equal(y3.detach(), y)       # autograd on: y untouched


def test_the_eager_chunk_has_the_same_bits_with_and_without_writing_in_place(monkeypatch):
    """Every in-place rewrite (MLP, norm, RoPE, residuals, the action-time MLP, vision) is bit for bit."""
    policy = build_tiny_policy(("front", "wrist"), chunk_size=8, num_steps=3)
    rng = np.random.default_rng(7)
    obs = {"images": {n: rng.integers(0, 256, (3, 48, 64, 3), dtype=np.uint8) for n in policy.camera_names},
           "state": rng.normal(size=(3, policy.state_dim)), "task": ["wave", "pick the cube", "stop"]}
    noise = rng.standard_normal((3, 8, 32)).astype(np.float32)
    calls = []
    allowed = in_place.allowed
    monkeypatch.setattr(in_place, "allowed", lambda: calls.append(1) or allowed())
    fast = policy.predict_action_chunk(obs, noise=noise)
    assert calls, "the eager chunk never asked"
    monkeypatch.setattr(in_place, "allowed", lambda: False)
    np.testing.assert_array_equal(fast, policy.predict_action_chunk(obs, noise=noise))
