# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by make_fixtures.py and check_fixtures.py (run them with a LeRobot venv's python).

* ``apply_tiny_pi_patches`` - the monkeypatches that give LeRobot's pi0 / pi0.5 the tiny sizes of ``tiny_dims.json``
  (LeRobot's PI0Config / PI05Config cannot express them; see the set README).
* ``raw_to_policy_batch`` - robot-style raw observations -> the dict a LeRobot pre-processor takes, exactly as
  ``lerobot.policies.utils.prepare_observation_for_inference`` builds it (per sample, then concatenated).
* ``load_policy_and_processors`` - reload a fixture folder the way LeRobot does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

FAMILY_POLICY = {
    "smolvla": ("lerobot.policies.smolvla.modeling_smolvla", "SmolVLAPolicy"),
    "pi0": ("lerobot.policies.pi0.modeling_pi0", "PI0Policy"),
    "pi05": ("lerobot.policies.pi05.modeling_pi05", "PI05Policy"),
}


def policy_type_of(folder: Path) -> str:
    return json.loads((Path(folder) / "config.json").read_text())["type"]


def apply_tiny_pi_patches(policy_type: str, tiny: dict) -> None:
    """Patch ``lerobot.policies.<pi0|pi05>.modeling_<...>`` so the next model it builds has the tiny sizes.

    1. ``get_gemma_config(variant)`` -> ``GemmaConfig(**tiny["vlm"])`` for "gemma_2b", ``(**tiny["expert"])`` for
       "gemma_300m";
    2. the module-level ``PaliGemmaForConditionalGenerationWithPiGemma`` is wrapped so that, right before
       construction, ``config.vision_config.{hidden_size, intermediate_size, num_hidden_layers,
       num_attention_heads, patch_size}`` come from ``tiny["vision"]``, ``vision_config.projection_dim =
       config.projection_dim = text hidden size`` and ``config.text_config.vocab_size = config._vocab_size =
       tiny["vocab_size"]``;
    3. the module-level ``PiGemmaForCausalLM`` (action expert) is wrapped to set ``config.vocab_size``.
    Idempotent (re-applying replaces the sizes).
    """
    import importlib

    mod = importlib.import_module(FAMILY_POLICY[policy_type][0])
    GemmaConfig = mod.GemmaConfig

    def get_gemma_config(variant: str):
        key = {"gemma_2b": "vlm", "gemma_300m": "expert"}.get(variant)
        if key is None:
            raise ValueError(f"Unknown variant: {variant}")
        d = tiny[key]
        return GemmaConfig(
            width=d["width"],
            depth=d["depth"],
            mlp_dim=d["mlp_dim"],
            num_heads=d["num_heads"],
            num_kv_heads=d["num_kv_heads"],
            head_dim=d["head_dim"],
        )

    orig_pali = getattr(mod, "_orig_PaliGemmaForConditionalGenerationWithPiGemma", None) or (
        mod.PaliGemmaForConditionalGenerationWithPiGemma
    )
    orig_expert = getattr(mod, "_orig_PiGemmaForCausalLM", None) or mod.PiGemmaForCausalLM
    mod._orig_PaliGemmaForConditionalGenerationWithPiGemma = orig_pali
    mod._orig_PiGemmaForCausalLM = orig_expert

    def make_pali(config, *args, **kwargs):
        v = tiny["vision"]
        vc = config.vision_config
        vc.hidden_size = v["hidden_size"]
        vc.intermediate_size = v["intermediate_size"]
        vc.num_hidden_layers = v["num_hidden_layers"]
        vc.num_attention_heads = v["num_attention_heads"]
        vc.patch_size = v["patch_size"]
        vc.projection_dim = config.text_config.hidden_size
        config.projection_dim = config.text_config.hidden_size
        config.text_config.vocab_size = tiny["vocab_size"]
        config._vocab_size = tiny["vocab_size"]
        return orig_pali(config, *args, **kwargs)

    def make_expert(config, *args, **kwargs):
        config.vocab_size = tiny["vocab_size"]
        return orig_expert(config, *args, **kwargs)

    mod.get_gemma_config = get_gemma_config
    mod.PaliGemmaForConditionalGenerationWithPiGemma = make_pali
    mod.PiGemmaForCausalLM = make_expert


def policy_class(policy_type: str):
    import importlib

    mod_name, cls_name = FAMILY_POLICY[policy_type]
    return getattr(importlib.import_module(mod_name), cls_name)


def raw_to_policy_batch(raw: dict[str, np.ndarray], tasks: list[str], device="cpu") -> dict:
    """Robot-style raw observations (batched numpy: images uint8 (B,H,W,3), state float32 (B,S)) -> the dict
    that LeRobot's pre-processor takes. Each sample goes through LeRobot's own
    ``prepare_observation_for_inference`` (uint8 HWC -> float32/255 CHW, batch dim added), then the samples are
    concatenated; ``task`` becomes the list of task strings."""
    from lerobot.policies.utils import prepare_observation_for_inference

    per_sample = []
    for i, task in enumerate(tasks):
        obs = {k: np.ascontiguousarray(v[i]) for k, v in raw.items()}
        per_sample.append(prepare_observation_for_inference(obs, torch.device(device), task=task))
    batch = {}
    for k in raw:
        batch[k] = torch.cat([s[k] for s in per_sample], dim=0)
    batch["task"] = [s["task"] for s in per_sample]
    batch["robot_type"] = per_sample[0]["robot_type"]
    return batch


def load_policy_and_processors(folder: Path, use_factory: bool = True):
    """Reload a fixture folder with LeRobot. MUST be called with cwd == folder (relative tokenizer/VLM names).

    Returns (policy, preprocessor, postprocessor). The processors come from
    ``PolicyProcessorPipeline.from_pretrained`` (through ``make_pre_post_processors(cfg, pretrained_path=...)``
    when ``use_factory``, which also re-wires AbsoluteActionsProcessorStep.relative_step; otherwise directly, with
    that re-wiring done by hand)."""
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

    folder = Path(folder)
    assert Path.cwd().resolve() == folder.resolve(), "cd into the fixture folder first"
    ptype = policy_type_of(folder)
    if ptype in ("pi0", "pi05"):
        apply_tiny_pi_patches(ptype, json.loads((folder / "tiny_dims.json").read_text()))
    policy = policy_class(ptype).from_pretrained(".").eval()
    if use_factory:
        from lerobot.policies.factory import make_pre_post_processors

        pre, post = make_pre_post_processors(policy.config, pretrained_path=".")
    else:
        pre = PolicyProcessorPipeline.from_pretrained(".", config_filename="policy_preprocessor.json")
        post = PolicyProcessorPipeline.from_pretrained(
            ".",
            config_filename="policy_postprocessor.json",
            to_transition=policy_action_to_transition,
            to_output=transition_to_policy_action,
        )
        try:  # LeRobot >= 0.6: AbsoluteActionsProcessorStep needs a live link to the RelativeActionsProcessorStep
            from lerobot.processor import AbsoluteActionsProcessorStep, RelativeActionsProcessorStep

            rel = next((s for s in pre.steps if isinstance(s, RelativeActionsProcessorStep)), None)
            for s in post.steps:
                if isinstance(s, AbsoluteActionsProcessorStep) and s.relative_step is None:
                    s.relative_step = rel
        except ImportError:
            pass
    return policy, pre, post


def model_inputs(policy, batch: dict) -> dict[str, torch.Tensor]:
    """The tensors the network is fed, computed with the policy's own preprocessing functions."""
    ptype = policy.config.type
    out = {}
    if ptype == "smolvla":
        images, img_masks = policy.prepare_images(dict(batch))
        state = policy.prepare_state(dict(batch))
    else:
        images, img_masks = policy._preprocess_images(dict(batch))
        state = policy.prepare_state(dict(batch)) if ptype == "pi0" else None
    for i, (img, m) in enumerate(zip(images, img_masks, strict=True)):
        out[f"model_input.image.{i}"] = img.detach().clone().contiguous()
        out[f"model_input.image_mask.{i}"] = m.detach().clone().contiguous()
    if state is not None:
        out["model_input.state_padded"] = state.detach().clone().contiguous()
    return out


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.dtype == torch.bool or not a.is_floating_point():
        return float((a.to(torch.int64) - b.to(torch.int64)).abs().max().item()) if a.numel() else 0.0
    return float((a.double() - b.double()).abs().max().item()) if a.numel() else 0.0


def set_offline_env() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
