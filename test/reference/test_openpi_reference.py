# SPDX-License-Identifier: Apache-2.0
r"""
openpi-layout pi0.5 (8-dim state, ``discrete_state_input`` true and false) against openpi's own definitions.

openpi cannot run here (JAX, a downloaded SentencePiece model), so the expected values are
re-derived in this file from openpi's published definitions, each cited where it is used:

- ``src/openpi/models/tokenizer.py`` at 85cd0a4b, ``PaligemmaTokenizer.tokenize``: the prompt
  is cleaned (``strip``, ``_`` and newlines -> spaces); with a state it is
  ``"Task: {cleaned}, State: {bins};\nAction: "`` with ``bins = digitize(state,
  linspace(-1, 1, 257)[:-1]) - 1``, encoded with BOS; without, ``encode(cleaned, add_bos) +
  encode("\n")``; then right-padded with 0 to ``max_len``, the mask True on the tokens.
- ``src/openpi/training/config.py`` (``ModelTransformFactory``, PI05): ``TokenizePrompt(...,
  discrete_state_input=...)`` runs before ``PadStatesAndActions``, so the bins cover the
  robot's own state dim; ``pi05_libero`` is ``Pi0Config(pi05=True, action_horizon=10,
  discrete_state_input=False)``; ``Pi0Config.discrete_state_input`` defaults to ``pi05``.
- ``src/openpi/transforms.py`` at 7089fe34, ``Normalize`` / ``Unnormalize``:
  ``(x - q01) / (q99 - q01 + 1e-6) * 2 - 1`` and ``(x + 1) / 2 * (q99 - q01 + 1e-6) + q01``;
  ``(x - mean) / (std + 1e-6)`` and ``x * (std + 1e-6) + mean``. ``shared/normalize.py`` at
  9e62e06c reads ``norm_stats.json`` floats, so the statistics and the arithmetic are float64.
- ``src/openpi/models/model.py`` (``Observation.from_dict``): uint8 frames -> ``x / 255 * 2 - 1``.

The tokenizer is the shared tiny PaliGemma ``tokenizer.json`` (openpi's SentencePiece model in
Hugging Face form): its ``encode`` adds the BOS as ``add_bos=True`` does. Tolerance: token ids
exact, values max abs diff <= 1e-5 in float32.
"""

from __future__ import annotations

import json

import numpy as np
from openpi_fixture import ACTION_DIM, IMAGE_SIZE, MAX_TOKEN_LEN, NARROW_JOINT, STATE_DIM, norm_stats, write_checkpoint
import pytest
import torch

from vla_policy_node.model.normalization import Normalizer
from vla_policy_node.loading.openpi import openpi_normalizers
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.loading import load_policy

TASK = "  pick_up the\nred cube \n"
CLEANED = "pick up the red cube"                      # tokenizer.py: strip, "_" and "\n" -> " "


def stats(key: str) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float64) for k, v in norm_stats()["norm_stats"][key].items()}


def openpi_normalize_quantile(x: np.ndarray, s: dict) -> np.ndarray:
    """transforms.py Normalize._normalize_quantile, float64."""
    return (np.asarray(x, np.float64) - s["q01"]) / (s["q99"] - s["q01"] + 1e-6) * 2.0 - 1.0


def openpi_unnormalize_quantile(x: np.ndarray, s: dict) -> np.ndarray:
    """transforms.py Unnormalize._unnormalize_quantile, float64."""
    return (np.asarray(x, np.float64) + 1.0) / 2.0 * (s["q99"] - s["q01"] + 1e-6) + s["q01"]


def openpi_bins(normalized: np.ndarray) -> list[int]:
    """tokenizer.py: 256 bins over [-1, 1] of the unpadded state."""
    return (np.digitize(normalized, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1).tolist()


def raw_state() -> np.ndarray:
    """Build an 8-dim state; the narrow joint sits 7e-5 above bin edge 0.5 without the epsilon, below it with."""
    s = stats("state")
    normalized = np.linspace(-0.9, 0.9, STATE_DIM)
    normalized[NARROW_JOINT] = 0.5 + 7e-5
    return s["q01"] + (normalized + 1.0) / 2.0 * (s["q99"] - s["q01"])       # inverse without the epsilon


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, request):
    from conftest import REFERENCE
    tokenizer = REFERENCE / "pi05" / "tiny_paligemma_tokenizer"
    if not tokenizer.is_dir():
        pytest.skip(f"the tiny PaliGemma tokenizer is not at {tokenizer} (set VLA_REFERENCE_DIR)")
    root = tmp_path_factory.mktemp("openpi")
    return {flag: write_checkpoint(root / f"discrete_{flag}", flag, tokenizer) for flag in (True, False)}


def tokenizer_of(folder):
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(folder / "google" / "paligemma-3b-pt-224" / "tokenizer.json"))


def padded(ids: list[int]) -> tuple[list[int], list[bool]]:
    """tokenizer.py: right-pad with 0 (False) to max_len; the mask is True on the tokens."""
    return ids + [0] * (MAX_TOKEN_LEN - len(ids)), [True] * len(ids) + [False] * (MAX_TOKEN_LEN - len(ids))


def observation(rng_seed: int = 0) -> dict:
    rng = np.random.default_rng(rng_seed)
    return {"images": {"base_0_rgb": rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)},
            "state": raw_state(), "task": TASK}


def test_discrete_state_bins_cover_the_robots_own_state(checkpoints):
    folder = checkpoints[True]
    normalized = openpi_normalize_quantile(raw_state(), stats("state"))
    bins = openpi_bins(normalized)
    assert len(bins) == STATE_DIM                           # not max_state_dim (32)
    prompt = f"Task: {CLEANED}, State: {' '.join(map(str, bins))};\nAction: "
    ids, mask = padded(tokenizer_of(folder).encode(prompt).ids)
    policy = load_policy(folder, device="cpu")
    inputs = policy.preprocessor(observation())
    assert inputs.tokens[0].tolist() == ids
    assert inputs.token_mask[0].tolist() == mask
    assert inputs.state is None                             # pi0.5: the state reaches the model as text only


def test_discrete_state_input_false_is_the_plain_task_with_a_separate_newline(checkpoints):
    folder = checkpoints[False]
    tok = tokenizer_of(folder)
    ids, mask = padded(tok.encode(CLEANED).ids + tok.encode("\n", add_special_tokens=False).ids)
    assert ids[:len(tok.encode(CLEANED + "\n").ids)] != tok.encode(CLEANED + "\n").ids   # the split matters here
    policy = load_policy(folder, device="cpu")
    inputs = policy.preprocessor(observation())
    assert inputs.tokens[0].tolist() == ids
    assert inputs.token_mask[0].tolist() == mask


def test_prompt_cleaning_follows_openpi(checkpoints):
    folder = checkpoints[False]
    tok = tokenizer_of(folder)
    policy = load_policy(folder, device="cpu")
    for task, cleaned in [("open_the_drawer", "open the drawer"), ("\n wave\n", "wave"),
                          ("stack\nthe_blocks  ", "stack the blocks")]:
        ids, _ = padded(tok.encode(cleaned).ids + tok.encode("\n", add_special_tokens=False).ids)
        assert policy.preprocessor({**observation(), "task": task}).tokens[0].tolist() == ids, task


def test_quantile_normalization_keeps_openpis_epsilon(checkpoints):
    s = stats("state")
    policy = load_policy(checkpoints[True], device="cpu")
    state = raw_state()
    expected = openpi_normalize_quantile(state, s)
    ours = policy.preprocessor.state_normalizer.normalize(state)
    assert np.abs(ours - expected).max() <= 1e-5
    # Without the epsilon the narrow joint (0.01 wide) moves by ~1.5e-4 and changes bin.
    no_eps = (state - s["q01"]) / (s["q99"] - s["q01"]) * 2.0 - 1.0
    assert abs(no_eps[NARROW_JOINT] - expected[NARROW_JOINT]) > 1e-4
    assert openpi_bins(no_eps)[NARROW_JOINT] != openpi_bins(expected)[NARROW_JOINT]
    assert openpi_bins(ours)[NARROW_JOINT] == openpi_bins(expected)[NARROW_JOINT]
    x = np.linspace(-1.2, 1.2, ACTION_DIM)
    a = stats("actions")
    assert np.abs(policy.action_normalizer.unnormalize(x) - openpi_unnormalize_quantile(x, a)).max() <= 1e-5


def test_mean_std_normalization_keeps_openpis_epsilon(tmp_path):
    # pi0 checkpoints use z-scores: (x - mean) / (std + 1e-6) and back x * (std + 1e-6) + mean.
    (tmp_path / "assets" / "robot").mkdir(parents=True)
    mean, std = np.array([0.5, -0.2, 1.0]), np.array([0.005, 2.0, 0.3])
    entry = {"mean": mean.tolist(), "std": std.tolist()}
    (tmp_path / "assets" / "robot" / "norm_stats.json").write_text(
        json.dumps({"norm_stats": {"state": entry, "actions": entry}}))
    state_norm, action_norm = openpi_normalizers(tmp_path, pi05=False)
    x = np.array([0.51, 1.0, 0.7])
    assert np.abs(state_norm.normalize(x) - (x - mean) / (std + 1e-6)).max() <= 1e-12
    z = np.array([1.5, -0.5, 2.0])
    assert np.abs(action_norm.unnormalize(z) - (z * (std + 1e-6) + mean)).max() <= 1e-6
    lerobot = Normalizer("MEAN_STD", {"mean": mean, "std": std}, eps=1e-6)     # no epsilon on the way back
    assert np.abs(lerobot.unnormalize(z) - action_norm.unnormalize(z)).max() > 1e-6


@pytest.mark.parametrize("discrete", [True, False])
def test_actions_are_the_network_between_openpis_transforms(checkpoints, discrete):
    """predict_action_chunk = Unnormalize(network(openpi's tokens, openpi's image), noise)[:, :, :7]."""
    folder = checkpoints[discrete]
    policy = load_policy(folder, device="cpu", pack_weights=False)
    obs = observation(1)
    tok = tokenizer_of(folder)
    if discrete:
        bins = openpi_bins(openpi_normalize_quantile(obs["state"], stats("state")))
        ids, mask = padded(tok.encode(f"Task: {CLEANED}, State: {' '.join(map(str, bins))};\nAction: ").ids)
    else:
        ids, mask = padded(tok.encode(CLEANED).ids + tok.encode("\n", add_special_tokens=False).ids)
    frame = torch.from_numpy(obs["images"]["base_0_rgb"]).permute(2, 0, 1)[None].float() / 255.0 * 2.0 - 1.0
    masked = torch.full_like(frame, -1.0)                   # LIBERO's missing wrist cameras: masked out
    inputs = ModelInputs(images=[frame, masked, masked],
                         image_masks=[torch.tensor([True]), torch.tensor([False]), torch.tensor([False])],
                         tokens=torch.tensor([ids]), token_mask=torch.tensor([mask]))
    noise = torch.randn(1, policy.chunk_size, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        network = policy.runtime.sample(inputs, noise)[..., :ACTION_DIM].numpy()
    expected = openpi_unnormalize_quantile(network, stats("actions"))
    chunk = policy.predict_action_chunk(obs, noise=noise.numpy())
    assert chunk.shape == (1, policy.chunk_size, ACTION_DIM) and chunk.dtype == np.float32
    assert np.abs(chunk - expected).max() <= 1e-5


def test_discrete_state_input_is_checked(tmp_path, checkpoints):
    import shutil
    from vla_policy_node.loading.checkpoint import CheckpointError
    folder = tmp_path / "bad"
    shutil.copytree(checkpoints[True], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "discrete_state_input": "yes"}))
    with pytest.raises(CheckpointError, match="discrete_state_input must be bool"):
        load_policy(folder, device="cpu")
