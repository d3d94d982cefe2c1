# SPDX-License-Identifier: Apache-2.0
"""
A tiny openpi-layout pi0.5 checkpoint, written by the test itself from a seeded build.

Layout as openpi's ``examples/convert_jax_model_to_pytorch.py`` writes it (``config.json``
with the model config, ``model.safetensors`` with un-rooted ``paligemma_with_expert.*`` keys
and the embedding instead of the LM head, ``assets/<asset_id>/norm_stats.json``), plus the
``pi05`` / ``discrete_state_input`` / ``max_token_len`` / ``num_steps`` fields of openpi's
``Pi0Config`` and a ``tiny_dims.json``. The robot is LIBERO-like: an 8-dim state and
7-dim actions, normalized with q01/q99 quantiles (openpi uses quantiles for pi0.5). One
state joint is only 0.01 wide, where openpi's epsilon matters.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.torch import save_file
import torch

from vla_policy_node.model.families.paligemma import PiConfig, backbone_key_rules
from vla_policy_node.model.families.pi05 import Pi05
from vla_policy_node.loading.load import init_weights
from vla_policy_node.loading.openpi import lerobot_style_config

STATE_DIM, ACTION_DIM, IMAGE_SIZE, MAX_TOKEN_LEN = 8, 7, 28, 64
TINY_DIMS = {
    "vlm": {"width": 32, "depth": 2, "mlp_dim": 64, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16},
    "expert": {"width": 16, "depth": 2, "mlp_dim": 32, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16},
    "vision": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
               "patch_size": 14},
    "vocab_size": 208,           # the shared tiny PaliGemma tokenizer's vocabulary
    "image_size": IMAGE_SIZE,
}
NARROW_JOINT = 3                 # q99 - q01 = 0.01 on this joint


def norm_stats() -> dict:
    """Quantile (and mean/std) statistics, as openpi's ``compute_norm_stats`` writes them."""
    rng = np.random.default_rng(7)
    q01 = rng.uniform(-1.0, 0.0, STATE_DIM)
    q99 = q01 + rng.uniform(0.5, 2.0, STATE_DIM)
    q99[NARROW_JOINT] = q01[NARROW_JOINT] + 0.01
    a01 = rng.uniform(-0.5, 0.0, ACTION_DIM)
    a99 = a01 + rng.uniform(0.2, 1.0, ACTION_DIM)

    def entry(lo: np.ndarray, hi: np.ndarray) -> dict:
        return {"mean": ((lo + hi) / 2).tolist(), "std": ((hi - lo) / 4).tolist(), "q01": lo.tolist(),
                "q99": hi.tolist()}
    return {"norm_stats": {"state": entry(q01, q99), "actions": entry(a01, a99)}}


def openpi_config(discrete_state_input: bool) -> dict:
    return {"action_dim": 32, "action_horizon": 8, "paligemma_variant": "gemma_2b",
            "action_expert_variant": "gemma_300m", "precision": "float32", "pi05": True,
            "discrete_state_input": discrete_state_input, "num_steps": 4, "max_token_len": MAX_TOKEN_LEN}


def openpi_key(module_key: str) -> str:
    """Map a module state-dict key to its openpi checkpoint key (the family's un-rooted key rules, inverted)."""
    rules = [(ckpt, mod) for ckpt, mod in backbone_key_rules([]) if mod is not None and not ckpt.startswith("model.")
             and not ckpt.endswith("lm_head.")]
    for ckpt, mod in sorted(rules, key=lambda r: -len(r[1])):
        if module_key.startswith(mod):
            return ckpt + module_key[len(mod):]
    return module_key                                   # the family's own heads keep their names


def write_checkpoint(folder: Path, discrete_state_input: bool, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write the checkpoint into ``folder``; weights depend only on ``seed``."""
    folder.mkdir(parents=True, exist_ok=True)
    config = openpi_config(discrete_state_input)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tiny_dims.json").write_text(json.dumps(TINY_DIMS))
    (folder / "assets" / "libero").mkdir(parents=True, exist_ok=True)
    (folder / "assets" / "libero" / "norm_stats.json").write_text(json.dumps(norm_stats()))
    shutil.copytree(tokenizer_dir, folder / "google" / "paligemma-3b-pt-224", dirs_exist_ok=True)
    cfg = PiConfig.from_checkpoint(lerobot_style_config(config, STATE_DIM, ACTION_DIM, IMAGE_SIZE), TINY_DIMS)
    model = Pi05(cfg)
    generator = torch.Generator().manual_seed(seed)
    init_weights(model, generator)
    with torch.no_grad():                 # as the shared fixtures: N(0, 0.1^2) on every parameter, so
        for p in model.parameters():      # that the actions depend visibly on the prompt
            p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    save_file({openpi_key(k): v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    return folder
