# SPDX-License-Identifier: Apache-2.0
"""
Property-based tests: prefix cache invariants on random operation sequences, preprocessor fuzz.

The cache is checked against a plain-list model of its semantics (layer
order, concatenation, sliding windows, read-only immutability, reset). The
preprocessor gets whatever may cross the ROS boundary: odd image sizes,
dtypes and ranks, empty arrays, wrong-length or non-finite states, empty,
multi-megabyte, control-character and lone-surrogate tasks. Each call must
give ``ModelInputs`` or a ``ValueError`` with a message, quickly. Example
counts are set so the file runs in a few seconds on a shared 2-core machine.
"""

import dataclasses
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from vla_policy_node.model.normalization import Normalizer
from cache_checks import assert_frozen_prefix_unchanged
from vla_policy_node.model.prefix_cache import ReadOnlyCacheError, VLAPrefixCache
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.loading import build_tiny_policy

BATCH, HEADS, DIM = 2, 2, 4


def states(length: int, seed: int) -> torch.Tensor:
    return torch.randn(BATCH, HEADS, length, DIM, generator=torch.Generator().manual_seed(seed))


class PrefixCacheMachine(RuleBasedStateMachine):
    """``VLAPrefixCache`` against a model: a list of (key, value) per layer plus a read-only flag."""

    @initialize()
    def start(self):
        self.cache = VLAPrefixCache()
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.read_only = False
        self.seed = 0

    def fresh(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.seed += 2
        return states(length, self.seed), states(length, self.seed + 1)

    @precondition(lambda self: not self.read_only)
    @rule(offset=st.integers(-2, 2), length=st.integers(1, 4))
    def fill(self, offset, length):
        idx = len(self.layers) + offset
        k, v = self.fresh(length)
        if not 0 <= idx <= len(self.layers):
            with pytest.raises(IndexError, match=f"^Invalid VLA prefix cache layer: {idx}"):
                self.cache.update(k, v, idx)
            return
        out_k, out_v = self.cache.update(k, v, idx)
        if idx == len(self.layers):
            self.layers.append((k, v))
        else:
            old_k, old_v = self.layers[idx]
            self.layers[idx] = (torch.cat([old_k, k], -2), torch.cat([old_v, v], -2))
        assert torch.equal(out_k, self.layers[idx][0]) and torch.equal(out_v, self.layers[idx][1])

    @rule(correct=st.booleans())
    def freeze(self, correct):
        if self.read_only:
            with pytest.raises(ReadOnlyCacheError):
                self.cache.freeze()
            return
        expected = len(self.layers) if correct else len(self.layers) + 1
        if not correct:
            with pytest.raises(ValueError, match="layers but the model has"):
                self.cache.freeze(expected)
            return
        self.cache.freeze(expected)
        self.read_only = True

    @precondition(lambda self: self.read_only)
    @rule(idx=st.integers(-1, 5), length=st.integers(1, 4))
    def read_only_update(self, idx, length):
        k, v = self.fresh(length)
        pointers = [t.data_ptr() for pair in self.cache.layers for t in pair]
        if not 0 <= idx < len(self.layers):
            with pytest.raises(IndexError, match=f"^Invalid VLA prefix cache layer: {idx}"):
                self.cache.update(k, v, idx)
            return
        out_k, out_v = self.cache.update(k, v, idx)
        pk, pv = self.layers[idx]
        assert torch.equal(out_k, torch.cat([pk, k], -2)) and torch.equal(out_v, torch.cat([pv, v], -2))
        assert [t.data_ptr() for pair in self.cache.layers for t in pair] == pointers

    @precondition(lambda self: self.read_only and self.layers)
    @rule(bad=st.sampled_from(["heads", "dim", "dtype", "batch"]))
    def mismatched_suffix(self, bad):
        shape = {"heads": (BATCH, HEADS + 1, 1, DIM), "dim": (BATCH, HEADS, 1, DIM + 1),
                 "batch": (BATCH + 1, HEADS, 1, DIM)}.get(bad, (BATCH, HEADS, 1, DIM))
        k = torch.zeros(shape, dtype=torch.float64 if bad == "dtype" else torch.float32)
        with pytest.raises(ValueError, match="does not match the prefix cache"):
            self.cache.update(k, k, 0)

    @precondition(lambda self: self.read_only)
    @rule()
    def mutate_frozen(self):
        with pytest.raises(ReadOnlyCacheError):
            self.cache._keys = []
        with pytest.raises(AttributeError):
            self.cache._keys.append(None)

    @rule()
    def reset(self):
        self.cache.reset()
        self.layers, self.read_only = [], False

    @invariant()
    def matches_model(self):
        if not hasattr(self, "cache"):
            return
        assert self.cache.read_only == self.read_only
        assert len(self.cache) == len(self.layers)
        for (k, v), (mk, mv) in zip(self.cache.layers, self.layers):
            assert torch.equal(k, mk) and torch.equal(v, mv)
        if self.read_only and self.layers:
            assert_frozen_prefix_unchanged(self.cache)


TestPrefixCache = PrefixCacheMachine.TestCase
TestPrefixCache.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)


# ------------------------------------------------------------------ preprocessor fuzz
@pytest.fixture(scope="module")
def preprocessor():
    return build_tiny_policy(camera_names=("front",), state_dim=6).preprocessor


def codepoints(max_size: int) -> st.SearchStrategy[str]:
    """Any code points, lone surrogates and C0/C1 controls included."""
    return st.lists(st.one_of(st.integers(0, 0x10FFFF), st.integers(0xD800, 0xDFFF), st.integers(0, 0x9F)),
                    max_size=max_size).map(lambda cps: "".join(map(chr, cps)))


image_arrays = st.one_of(
    hnp.arrays(np.uint8, hnp.array_shapes(min_dims=3, max_dims=3, min_side=1, max_side=70)
               .map(lambda s: s[:2] + (3,))),
    hnp.arrays(st.sampled_from([np.uint8, np.float32, np.float64, np.int16, np.bool_, np.uint16]),
               hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=9)),
)
state_values = st.one_of(
    st.none(),
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=9),
    hnp.arrays(st.sampled_from([np.float32, np.float64, np.int32]),
               hnp.array_shapes(min_dims=0, max_dims=3, max_side=7)),
)
task_values = st.one_of(
    codepoints(64),
    st.sampled_from(["", " \t\n", "\x00", "\ud800", "pick\x1b[2Jup", "\u202eevil"]),
    st.sampled_from([2**20, 3 * 2**20]).map(lambda n: "a" * n),
    st.lists(codepoints(8), min_size=0, max_size=3),
    st.none(),
)
camera_names = st.sampled_from(["front", "observation.images.front", "wrist", ""])


FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
VALID = {"images": {"front": np.full((24, 40, 3), 90, np.uint8)}, "state": np.zeros(6), "task": "pick"}


def inputs_or_value_error(preprocessor, observation: dict) -> None:
    """``ModelInputs`` with finite tensors, or ``ValueError`` with a message; within 5 s either way."""
    start = time.monotonic()
    try:
        out = preprocessor(observation)
    except ValueError as exc:
        assert str(exc)
    else:
        assert isinstance(out, ModelInputs)
        assert all(torch.isfinite(im).all() for im in out.images)
        assert out.state is None or torch.isfinite(out.state).all()
        assert out.tokens.shape == out.token_mask.shape
    assert time.monotonic() - start < 5.0


@FUZZ
@given(images=st.dictionaries(camera_names, image_arrays, max_size=2))
def test_fuzzed_images(preprocessor, images):
    inputs_or_value_error(preprocessor, {**VALID, "images": images})


@FUZZ
@given(state=state_values)
def test_fuzzed_states(preprocessor, state):
    inputs_or_value_error(preprocessor, {**VALID, "state": state})


@FUZZ
@given(task=task_values)
def test_fuzzed_tasks(preprocessor, task):
    inputs_or_value_error(preprocessor, {**VALID, "task": task})


@FUZZ
@given(images=st.dictionaries(camera_names, image_arrays, max_size=2), state=state_values, task=task_values)
def test_fuzzed_observations(preprocessor, images, state, task):
    inputs_or_value_error(preprocessor, {"images": images, "state": state, "task": task})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=codepoints(200).filter(lambda t: t.strip()))
def test_any_short_task_with_valid_inputs_is_accepted(preprocessor, task):
    """A valid frame and state with any non-blank task (surrogates too): accepted, tokens in the vocabulary."""
    out = preprocessor({"images": {"front": np.zeros((24, 40, 3), np.uint8)}, "state": np.zeros(6), "task": task})
    assert int(out.tokens.max()) < 257 and bool(out.token_mask.any())


@pytest.mark.parametrize("value", [1e300, -1e39])
def test_finite_state_beyond_float32_is_refused(preprocessor, value):
    """Finite in float64, infinite in the model's float32: refused, not passed on as inf."""
    state = np.zeros(6)
    state[2] = value
    with pytest.raises(ValueError, match="beyond float32"):
        preprocessor({**VALID, "state": state})


def test_state_overflowing_once_normalized_is_refused(preprocessor):
    narrow = Normalizer("MEAN_STD", {"mean": np.zeros(6, np.float32), "std": np.full(6, 1e-3, np.float32)})
    state = np.zeros(6)
    state[2] = 3e38
    with pytest.raises(ValueError, match="overflows float32 once normalized"):
        dataclasses.replace(preprocessor, state_normalizer=narrow)({**VALID, "state": state})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tasks=st.lists(st.sampled_from(["open the drawer", "wave", "stack the blocks\n"]), min_size=1, max_size=6))
def test_reused_tokens_equal_a_fresh_tokenization(preprocessor, tasks):
    """The last prompt's tokens are reused while the task repeats, and always equal the tokenizer's own."""
    calls = []

    def counting(prompts, max_length, padding, padding_side):
        calls.append(list(prompts))
        return preprocessor.tokenizer(prompts, max_length, padding, padding_side)
    counted = dataclasses.replace(preprocessor, tokenizer=counting)
    for task in tasks:
        out = counted({**VALID, "task": task})
        ids, mask = preprocessor.tokenizer([preprocessor.prompt(task, None)], preprocessor.max_length,
                                           preprocessor.padding)
        out.tokens[0, 0] = -1                   # the caller owns its copy: the cached result stays intact
        assert np.array_equal(counted({**VALID, "task": task}).tokens.numpy(), ids)
        assert np.array_equal(out.token_mask.numpy(), mask)
    changes = 1 + sum(a != b for a, b in zip(tasks, tasks[1:]))
    assert len(calls) == changes                # tokenized once per change of task, not per call
