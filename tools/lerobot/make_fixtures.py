#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Generate tiny, seeded LeRobot SmolVLA / pi0 / pi0.5 checkpoints with their inputs and expected actions.

Run with the python of a LeRobot venv made by ``tools/lerobot/setup_env.sh`` (CPU, float32, no hub):

    .venv-lerobot061/bin/python tools/lerobot/make_fixtures.py                       # -> test/fixtures/lerobot061/
    .venv-lerobot061/bin/python tools/lerobot/make_fixtures.py --set other --out /tmp/lerobot061_other

Every folder is saved exactly as LeRobot saves it (``policy.save_pretrained`` + ``make_pre_post_processors(cfg,
dataset_stats=...)`` + ``.save_pretrained`` of both pipelines), next to ``inputs.safetensors``,
``expected.safetensors``, ``fixture_info.json`` (and ``tiny_dims.json`` for pi0/pi0.5). Afterwards every folder
is reloaded in a fresh process by ``check_fixtures.py`` (skip with ``--no-check``).

Two sets exist: ``main`` (committed, seed 0) and ``other`` (different seeds, camera counts/sizes, state/action
dims, chunk sizes, step counts, model sizes; for validation, not committed).
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
REFERENCE = Path(os.environ.get("LEROBOT_REFERENCE_DIR", "/work/shared/reference"))
SMOLVLM_SRC = REFERENCE / "smolvla" / "tiny_smolvlm"
PALIGEMMA_TOK_SRC = REFERENCE / "pi0" / "tiny_paligemma_tokenizer"

sys.path.insert(0, str(HERE))
from fixture_utils import (  # noqa: E402
    apply_tiny_pi_patches,
    model_inputs,
    policy_class,
    raw_to_policy_batch,
    set_offline_env,
)

set_offline_env()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

PERTURB_STD = 0.1

# --------------------------------------------------------------------------------------------------------------
# Fixture specifications
# --------------------------------------------------------------------------------------------------------------

SO100_NAMES = ["shoulder_pan.pos", "shoulder_lift.pos", "elbow_flex.pos", "wrist_flex.pos", "wrist_roll.pos",
               "gripper.pos"]  # fmt: skip

PI_TINY_MAIN = {
    "vlm": {"width": 32, "depth": 2, "mlp_dim": 64, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
    "expert": {"width": 16, "depth": 2, "mlp_dim": 32, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
    "vision": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
               "patch_size": 8},
    "vocab_size": 208,
    "image_size": 32,
}  # fmt: skip

PI_TINY_OTHER = {
    "vlm": {"width": 48, "depth": 3, "mlp_dim": 80, "num_heads": 8, "num_kv_heads": 1, "head_dim": 6},
    "expert": {"width": 24, "depth": 3, "mlp_dim": 40, "num_heads": 8, "num_kv_heads": 1, "head_dim": 6},
    "vision": {"hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 1, "num_attention_heads": 3,
               "patch_size": 8},
    "vocab_size": 208,
    "image_size": 40,
}  # fmt: skip

SMOLVLM_MAIN = {  # changes applied to the reference tiny SmolVLM config before re-saving it
    "text": {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 8, "num_hidden_layers": 4},
    "vision": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
               "image_size": 32, "patch_size": 4},
    "scale_factor": 2,
}  # fmt: skip

SMOLVLM_OTHER = {
    "text": {"hidden_size": 48, "intermediate_size": 96, "num_attention_heads": 6, "num_key_value_heads": 3,
             "head_dim": 8, "num_hidden_layers": 5},
    "vision": {"hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 1, "num_attention_heads": 3,
               "image_size": 48, "patch_size": 8},
    "scale_factor": 3,
}  # fmt: skip

TASKS_MAIN = ["pick up the red cube", "open the top drawer and put the cube inside"]
TASKS_OTHER = ["stack_the_blue block on the green one", "Put the sponge in the sink.\n"]


def _spec_main() -> dict[str, dict]:
    cams_smol = {"observation.images.top": (36, 48), "observation.images.wrist": (40, 28),
                 "observation.images.side": (24, 24)}  # fmt: skip
    cams_pi = {"observation.images.base_0_rgb": (36, 48), "observation.images.left_wrist_0_rgb": (40, 28),
               "observation.images.right_wrist_0_rgb": (24, 24)}  # fmt: skip
    common = {"seed": 0, "perturb_seed": 1, "noise_seed": 2, "tasks": TASKS_MAIN, "batch_size": 2}
    pi0 = {**common, "type": "pi0", "cameras": cams_pi, "state_dim": 6, "action_dim": 6,
           "config": {"chunk_size": 8, "n_action_steps": 8, "num_inference_steps": 5, "max_state_dim": 32,
                      "max_action_dim": 32, "image_resolution": (32, 32), "tokenizer_max_length": 48,
                      "dtype": "float32"},
           "tiny": PI_TINY_MAIN, "norm": "MEAN_STD", "action_names": SO100_NAMES}  # fmt: skip
    pi05 = {**pi0, "type": "pi05", "norm": "QUANTILES",
            "config": {**pi0["config"], "tokenizer_max_length": 64}}  # fmt: skip
    return {
        "smolvla": {**common, "type": "smolvla", "cameras": cams_smol, "state_dim": 6, "action_dim": 6,
                    "config": {"chunk_size": 8, "n_action_steps": 8, "num_steps": 5, "max_state_dim": 32,
                               "max_action_dim": 32, "resize_imgs_with_padding": (32, 32),
                               "tokenizer_max_length": 24, "pad_language_to": "max_length",
                               "num_vlm_layers": 2, "self_attn_every_n_layers": 2,
                               "expert_width_multiplier": 0.75, "attention_mode": "cross_attn",
                               "load_vlm_weights": False, "vlm_model_name": "tiny_smolvlm"},
                    "smolvlm": SMOLVLM_MAIN, "norm": "MEAN_STD", "action_names": SO100_NAMES},
        "pi0": pi0,
        "pi05": pi05,
        "pi0_relative": {**pi0, "relative": {"exclude": ["gripper"]}},
        "pi05_relative": {**pi05, "relative": {"exclude": ["gripper"]}},
    }  # fmt: skip


def _spec_other() -> dict[str, dict]:
    cams_smol = {"observation.images.front": (40, 56), "observation.images.hand": (48, 48)}
    cams_pi0 = {"observation.images.cam_high": (40, 40), "observation.images.cam_low": (30, 72),
                "observation.images.cam_left_wrist": (50, 34), "observation.images.cam_right_wrist": (24, 24)}  # fmt: skip
    cams_pi05 = {"observation.images.image": (36, 52)}
    names7 = ["left_waist", "left_shoulder", "left_elbow", "left_forearm_roll", "left_wrist_angle",
              "Left_Wrist_Rotate", "Left_Gripper"]  # fmt: skip
    pi0 = {"type": "pi0", "seed": 10, "perturb_seed": 11, "noise_seed": 12, "tasks": TASKS_OTHER, "batch_size": 2,
           "cameras": cams_pi0, "state_dim": 8, "action_dim": 7,
           "config": {"chunk_size": 5, "n_action_steps": 4, "num_inference_steps": 4, "max_state_dim": 12,
                      "max_action_dim": 10, "image_resolution": (40, 40), "tokenizer_max_length": 30,
                      "dtype": "float32", "min_period": 0.01, "max_period": 2.0},
           "tiny": PI_TINY_OTHER, "norm": "MEAN_STD", "action_names": names7}  # fmt: skip
    pi05 = {"type": "pi05", "seed": 20, "perturb_seed": 21, "noise_seed": 22, "tasks": TASKS_OTHER[::-1],
            "batch_size": 2, "cameras": cams_pi05, "state_dim": 7, "action_dim": 7,
            "config": {"chunk_size": 10, "n_action_steps": 10, "num_inference_steps": 3, "max_state_dim": 16,
                       "max_action_dim": 16, "image_resolution": (40, 40), "tokenizer_max_length": 80,
                       "dtype": "float32"},
            "tiny": PI_TINY_OTHER, "norm": "QUANTILES", "action_names": names7,
            "state_out_of_range": True}  # fmt: skip
    return {
        "smolvla": {"type": "smolvla", "seed": 30, "perturb_seed": 31, "noise_seed": 32, "tasks": TASKS_OTHER,
                    "batch_size": 2, "cameras": cams_smol, "state_dim": 9, "action_dim": 7,
                    "config": {"chunk_size": 6, "n_action_steps": 6, "num_steps": 3, "max_state_dim": 16,
                               "max_action_dim": 12, "resize_imgs_with_padding": (48, 48),
                               "tokenizer_max_length": 32, "pad_language_to": "longest", "num_vlm_layers": 3,
                               "self_attn_every_n_layers": 3, "expert_width_multiplier": 0.5,
                               "attention_mode": "cross_attn", "load_vlm_weights": False,
                               "vlm_model_name": "tiny_smolvlm", "min_period": 0.01, "max_period": 2.0},
                    "smolvlm": SMOLVLM_OTHER, "norm": "MEAN_STD", "action_names": names7},
        "pi0": pi0,
        "pi05": pi05,
        "pi0_relative": {**pi0, "seed": 40, "perturb_seed": 41, "noise_seed": 42,
                         "relative": {"exclude": ["GRIPPER", "wrist_rotate"]}},
        "pi05_relative": {**pi05, "seed": 50, "perturb_seed": 51, "noise_seed": 52, "state_dim": 9,
                          "action_dim": 6, "action_names": names7[:6],
                          "relative": {"exclude": ["Waist", "wrist"]}},
    }  # fmt: skip


SETS = {"main": _spec_main, "other": _spec_other}


# --------------------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------------------


@contextmanager
def chdir(path: Path):
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("lerobot", "transformers", "torch", "tokenizers", "safetensors", "numpy", "huggingface-hub"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def write_smolvlm_dir(dst: Path, dims: dict) -> dict:
    """Load the tiny SmolVLM config + processor (tokenizer) from the reference folder with transformers 5,
    apply the sizes of ``dims`` and save them with transformers 5's save_pretrained."""
    from transformers import AutoConfig, AutoProcessor

    cfg = AutoConfig.from_pretrained(str(SMOLVLM_SRC))
    for k, v in dims["text"].items():
        setattr(cfg.text_config, k, v)
    for k, v in dims["vision"].items():
        setattr(cfg.vision_config, k, v)
    cfg.scale_factor = dims["scale_factor"]
    dst.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(dst))
    proc = AutoProcessor.from_pretrained(str(SMOLVLM_SRC))
    proc.save_pretrained(str(dst))
    return cfg.to_dict()


def write_paligemma_tokenizer_dir(dst: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(PALIGEMMA_TOK_SRC))
    dst.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(dst))


def make_stats(rng: np.random.Generator, dim: int) -> dict[str, np.ndarray]:
    mean = rng.normal(0.0, 0.8, dim)
    std = rng.uniform(0.3, 2.5, dim)
    lo = mean - std * rng.uniform(1.8, 2.6, dim)
    hi = mean + std * rng.uniform(1.8, 2.6, dim)
    return {
        "mean": mean,
        "std": std,
        "min": lo - std * rng.uniform(0.3, 1.0, dim),
        "max": hi + std * rng.uniform(0.3, 1.0, dim),
        "q01": lo,
        "q99": hi,
    }


def make_config(spec: dict):
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature

    ptype = spec["type"]
    feats_in = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(spec["state_dim"],))}
    for cam, (h, w) in spec["cameras"].items():
        feats_in[cam] = PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w))
    feats_out = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(spec["action_dim"],))}
    norm = NormalizationMode[spec["norm"]]
    kwargs = dict(
        device="cpu",
        input_features=feats_in,
        output_features=feats_out,
        normalization_mapping={"VISUAL": NormalizationMode.IDENTITY, "STATE": norm, "ACTION": norm},
        **spec["config"],
    )
    if "relative" in spec:
        kwargs.update(
            use_relative_actions=True,
            relative_exclude_joints=list(spec["relative"]["exclude"]),
            action_feature_names=list(spec["action_names"]),
        )
    if ptype == "smolvla":
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig as C
    elif ptype == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config as C
    else:
        from lerobot.policies.pi05.configuration_pi05 import PI05Config as C
    return C(**kwargs)


@contextmanager
def redirect_pi_tokenizer(ptype: str, name: str):
    """LeRobot's pi0/pi0.5 processor factories hard-code the gated ``google/paligemma-3b-pt-224`` tokenizer;
    build the (real) TokenizerProcessorStep with the tiny tokenizer's relative name instead."""
    import importlib

    mod = importlib.import_module(f"lerobot.policies.{ptype}.processor_{ptype}")
    orig = mod.TokenizerProcessorStep

    def make(*args, **kwargs):
        kwargs["tokenizer_name"] = name
        return orig(*args, **kwargs)

    mod.TokenizerProcessorStep = make
    try:
        yield
    finally:
        mod.TokenizerProcessorStep = orig


class Recorder:
    """Wraps the policy's inner model to record the intermediates of one predict_action_chunk call."""

    def __init__(self, policy):
        self.policy = policy
        self.model = policy.model
        self.prefix = None
        self.prefix_kv = None
        self.steps = []  # (x_t, t, v_t)
        self.vision_ids = []
        self._undo = []

    def __enter__(self):
        m = self.model
        rec = self

        orig_embed_prefix = m.embed_prefix

        def embed_prefix(*a, **k):
            out = orig_embed_prefix(*a, **k)
            rec.prefix = tuple(t.detach().clone() for t in out)
            return out

        orig_denoise = m.denoise_step

        def denoise_step(*a, **k):
            v = orig_denoise(*a, **k)
            rec.steps.append((k["x_t"].detach().clone(), k["timestep"].detach().clone(), v.detach().clone()))
            return v

        inner = m.vlm_with_expert if self.policy.config.type == "smolvla" else m.paligemma_with_expert
        orig_forward = inner.forward

        def forward(*a, **k):
            out = orig_forward(*a, **k)
            embeds = k.get("inputs_embeds")
            if rec.prefix_kv is None and embeds is not None and embeds[1] is None and k.get("past_key_values") is None:
                pkv = out[1]
                if isinstance(pkv, dict):  # LeRobot <= 0.5 SmolVLA: {layer: {"key_states": [B,L,H,D], ...}}
                    rec.prefix_kv = [
                        (pkv[i]["key_states"].detach().clone(), pkv[i]["value_states"].detach().clone())
                        for i in sorted(pkv)
                    ]
                else:  # transformers DynamicCache: [B, H, L, D] per layer
                    rec.prefix_kv = [
                        (layer.keys.detach().transpose(1, 2).clone(), layer.values.detach().transpose(1, 2).clone())
                        for layer in pkv.layers
                    ]
            return out

        m.embed_prefix, m.denoise_step, inner.forward = embed_prefix, denoise_step, forward
        self._undo = [(m, "embed_prefix"), (m, "denoise_step"), (inner, "forward")]
        if self.policy.config.type == "smolvla":
            pe = m.vlm_with_expert.get_vlm_model().vision_model.embeddings.position_embedding
            self._undo_hook = pe.register_forward_hook(
                lambda mod, inp, out: rec.vision_ids.append(inp[0].detach().clone())
            )
        return self

    def __exit__(self, *exc):
        for obj, name in self._undo:
            delattr(obj, name)  # drop the instance attribute -> class method again
        if hasattr(self, "_undo_hook"):
            self._undo_hook.remove()


def save_safetensors(tensors: dict, path: str, metadata: dict[str, str]) -> None:
    """``safetensors.torch.save_file``, then the header's ``__metadata__`` is rewritten with sorted keys (the
    Rust writer emits metadata in hash-map order, which would make regenerated files differ byte-wise)."""
    save_file(tensors, path, metadata=metadata)
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    Path(path).write_bytes(len(hb).to_bytes(8, "little") + hb + raw[8 + n :])


def generate_one(name: str, spec: dict, out_dir: Path, set_name: str) -> dict:
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.processor import TransitionKey

    ptype = spec["type"]
    folder = out_dir / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(spec["seed"])
    B, S, A = spec["batch_size"], spec["state_dim"], spec["action_dim"]
    info: dict = {"family": ptype, "folder": name, "set": set_name, "versions": versions(), "dtype": "float32",
                  "device": "cpu", "seed": spec["seed"], "perturb_std": PERTURB_STD,
                  "perturb_seed": spec["perturb_seed"], "noise_seed": spec["noise_seed"], "batch_size": B,
                  "tasks": list(spec["tasks"])}  # fmt: skip

    # ---- tokenizer / VLM folder (transformers 5 save_pretrained) and tiny dims
    if ptype == "smolvla":
        info["tiny_smolvlm_config"] = write_smolvlm_dir(folder / "tiny_smolvlm", spec["smolvlm"])
    else:
        write_paligemma_tokenizer_dir(folder / "tiny_paligemma_tokenizer")
        (folder / "tiny_dims.json").write_text(json.dumps(spec["tiny"], indent=2) + "\n")
        apply_tiny_pi_patches(ptype, spec["tiny"])
        info["tiny_dims"] = spec["tiny"]
        assert spec["config"]["image_resolution"][0] == spec["tiny"]["image_size"]

    with chdir(folder):
        # ---- policy: seed, build, perturb every parameter, save
        cfg = make_config(spec)
        torch.manual_seed(spec["seed"])
        policy = policy_class(ptype)(cfg)
        policy.eval()
        g = torch.Generator().manual_seed(spec["perturb_seed"])
        n_params = 0
        with torch.no_grad():
            for _, p in sorted(policy.named_parameters(), key=lambda kv: kv[0]):
                p.add_(torch.randn(p.shape, generator=g, dtype=torch.float32) * PERTURB_STD)
                n_params += p.numel()
        info["n_parameters"] = n_params
        policy.save_pretrained(".")

        # ---- stats + processors, saved exactly as LeRobot saves them
        stats_np = {"observation.state": make_stats(rng, S), "action": make_stats(rng, A)}
        stats = {k: {s: torch.tensor(v, dtype=torch.float32) for s, v in d.items()} for k, d in stats_np.items()}
        if ptype == "smolvla":
            pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
        else:
            with redirect_pi_tokenizer(ptype, "tiny_paligemma_tokenizer"):
                pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
        pre.save_pretrained(".")
        post.save_pretrained(".")
        info["stats"] = {k: {s: v.tolist() for s, v in d.items()} for k, d in stats.items()}

        # ---- raw inputs (robot-style), batch through the pre-processor
        raw = {}
        for cam, (h, w) in spec["cameras"].items():
            raw[cam] = rng.integers(0, 256, size=(B, h, w, 3), dtype=np.uint8)
        st = stats["observation.state"]
        lo, hi = st["q01"].numpy().astype(np.float64), st["q99"].numpy().astype(np.float64)
        u = rng.uniform(0.05, 0.95, size=(B, S))
        state = lo + u * (hi - lo)
        if spec.get("state_out_of_range"):  # pi0.5 bins below -1 / above +1
            state[0, 0] = lo[0] - 0.5 * (hi[0] - lo[0])
            state[1, 1] = hi[1] + 0.5 * (hi[1] - lo[1])
        raw["observation.state"] = state.astype(np.float32)
        raw_t = {f"raw.{k}": torch.from_numpy(np.ascontiguousarray(v)) for k, v in raw.items()}

        tasks = list(spec["tasks"])
        policy_in = raw_to_policy_batch({k: v.copy() for k, v in raw.items()}, tasks)

        # the strings the TokenizerProcessorStep receives (after the newline / pi0.5 state-prompt steps)
        from lerobot.processor import TokenizerProcessorStep

        prompts: list[str] = []
        tok_idx = next(i for i, s in enumerate(pre.steps) if isinstance(s, TokenizerProcessorStep))

        def grab_prompts(i, tr):
            if i == tok_idx:
                t = tr[TransitionKey.COMPLEMENTARY_DATA]["task"]
                prompts.extend([t] if isinstance(t, str) else list(t))

        pre.before_step_hooks.append(grab_prompts)
        batch = pre(policy_in)
        pre.before_step_hooks.clear()
        pre.after_step_hooks.clear()

        batch_t = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):
                batch_t[f"batch.{k}"] = v.detach().clone().contiguous()
        tok = batch_t["batch.observation.language.tokens"]
        att = batch_t["batch.observation.language.attention_mask"]
        assert int(att.sum(1).max()) < spec["config"]["tokenizer_max_length"], (
            f"{name}: a prompt may have been truncated; raise tokenizer_max_length"
        )

        # ---- model inputs
        mi = model_inputs(policy, {k[len("batch."):]: v for k, v in batch_t.items()})
        if ptype == "pi05":
            s_norm = batch_t["batch.observation.state"].cpu().numpy()
            mi["model_input.state_bins"] = torch.from_numpy(
                (np.digitize(s_norm, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1).astype(np.int64)
            )

        # ---- noise and the action chunk
        max_a = policy.config.max_action_dim
        chunk = policy.config.chunk_size
        noise = torch.randn((B, chunk, max_a), generator=torch.Generator().manual_seed(spec["noise_seed"]))
        pred_in = {k[len("batch."):]: v.clone() for k, v in batch_t.items()}
        for k, v in batch.items():
            if not isinstance(v, torch.Tensor):
                pred_in[k] = v
        with Recorder(policy) as rec:
            chunk_norm = policy.predict_action_chunk(pred_in, noise=noise.clone())
        post_steps = []
        post.after_step_hooks.append(lambda i, tr: post_steps.append(tr[TransitionKey.ACTION].detach().clone()))
        chunk_abs = post(chunk_norm.clone())
        post.after_step_hooks.clear()

        # ---- expected tensors
        exp = {"action_chunk_normalized": chunk_norm.detach().clone(), "action_chunk": chunk_abs.detach().clone()}
        p_embs, p_pad, p_att = rec.prefix
        exp["prefix_embs"] = p_embs
        exp["prefix_pad_masks"] = p_pad.bool()
        exp["prefix_att_masks"] = p_att.bool()
        exp["prefix_position_ids"] = torch.cumsum(p_pad.long(), dim=1) - 1
        n_layers = len(rec.prefix_kv)
        for li in sorted({0, n_layers - 1}):
            exp[f"prefix_kv.layer{li}.key"] = rec.prefix_kv[li][0]
            exp[f"prefix_kv.layer{li}.value"] = rec.prefix_kv[li][1]
        exp["timesteps"] = torch.stack([s[1][0] for s in rec.steps]).to(torch.float32)
        exp["x_t_before_step"] = torch.stack([s[0] for s in rec.steps])
        exp["velocities"] = torch.stack([s[2] for s in rec.steps])
        exp["velocity.step0"] = rec.steps[0][2]
        dt = -1.0 / len(rec.steps)
        x = rec.steps[-1][0] + dt * rec.steps[-1][2]
        exp["x_final_padded"] = x
        assert torch.equal(x[:, :, :A], chunk_norm), "Euler reconstruction differs from predict_action_chunk"
        if ptype == "smolvla":
            ids = rec.vision_ids
            assert all(torch.equal(ids[0], i) for i in ids), "cameras got different vision position ids"
            exp["vision_position_ids"] = ids[0].to(torch.int64)
        if "relative" in spec:
            from lerobot.processor import RelativeActionsProcessorStep

            rel = next(s for s in pre.steps if isinstance(s, RelativeActionsProcessorStep))
            exp["action_chunk_before_absolute"] = post_steps[0]  # after the unnormalizer step
            exp["relative_action_mask"] = torch.tensor(rel._build_mask(A), dtype=torch.bool)
            exp["relative_reference_state"] = rel._last_state.detach().clone()  # = rel.get_cached_state() (0.6)
        exp = {k: v.contiguous() for k, v in exp.items()}

        # ---- write inputs / expected / info
        meta = {"family": ptype, "set": set_name, "tasks": json.dumps(tasks), "prompts": json.dumps(prompts),
                "camera_order": json.dumps(list(spec["cameras"]))}  # fmt: skip
        inputs = {**raw_t, **batch_t, **mi, "noise": noise.contiguous()}
        save_safetensors(inputs, "inputs.safetensors", meta)
        save_safetensors(exp, "expected.safetensors", meta)

        info.update({
            "policy_type": ptype,
            "relative_actions": (
                {"use_relative_actions": True, "relative_exclude_joints": list(spec["relative"]["exclude"]),
                 "action_feature_names": list(spec["action_names"]),
                 "mask": exp["relative_action_mask"].tolist()} if "relative" in spec else None),
            "camera_order": list(spec["cameras"]),
            "raw_camera_hw": {k: list(v) for k, v in spec["cameras"].items()},
            "state_dim": S,
            "action_dim": A,
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec["config"].items()},
            "prompts_fed_to_tokenizer": prompts,
            "token_ids": tok.tolist(),
            "attention_mask": att.long().tolist(),
            "prefix_len": int(p_pad.shape[1]),
            "prefix_valid_len": p_pad.long().sum(1).tolist(),
            "num_layers": n_layers,
            "num_steps": len(rec.steps),
            "timesteps": exp["timesteps"].tolist(),
            "inputs": {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in sorted(inputs.items())},
            "expected": {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in sorted(exp.items())},
        })  # fmt: skip
        if ptype == "pi05":
            info["state_bins"] = mi["model_input.state_bins"].tolist()
        if ptype == "smolvla":
            info["vision_position_ids"] = exp["vision_position_ids"].tolist()
        (Path("fixture_info.json")).write_text(json.dumps(info, indent=1) + "\n")
    for f in folder.rglob("*"):  # safetensors / LeRobot write 0600 files
        f.chmod(0o755 if f.is_dir() else 0o644)
    return info


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


README_TEMPLATE = """# Tiny LeRobot {lerobot} fixtures: SmolVLA, pi0, pi0.5 (set `{set_name}`)

Generated by `tools/lerobot/make_fixtures.py{set_flag}` (do not edit by hand; regenerate instead) with LeRobot
**{lerobot}**, transformers **{transformers}**, torch **{torch}**, tokenizers {tokenizers}, safetensors {safetensors},
numpy {numpy}, huggingface-hub {hub}, Python {python}; CPU, float32, `HF_HUB_OFFLINE=1`. Same layout and key
names as the LeRobot 0.4.4 reference fixtures in `shared/reference/` (read their READMEs for the model maths).

```bash
tools/lerobot/setup_env.sh {lerobot} .venv-lerobot{tag}        # CPU venv, LeRobot patched for Python 3.11
.venv-lerobot{tag}/bin/python tools/lerobot/make_fixtures.py{set_flag}   # regenerate (bit-identical)
.venv-lerobot{tag}/bin/python tools/lerobot/check_fixtures.py {out}      # reload in fresh processes, compare
```

## Where the values come from

For every folder, in this order (see `generate_one` in the generator):
1. `torch.manual_seed(seed)`, build the policy from its LeRobot config class (`SmolVLAConfig`, `PI0Config`,
   `PI05Config`) and `<Policy>(cfg)`; then EVERY parameter (sorted by name, `named_parameters()`) gets
   `+= N(0, 0.1^2)` from `torch.Generator().manual_seed(perturb_seed)`; `policy.save_pretrained(dir)`.
2. Normalization stats from `numpy.random.default_rng(seed)` (mean, std, min, max, q01, q99 for
   `observation.state` and `action`); `make_pre_post_processors(cfg, dataset_stats=stats)` and `.save_pretrained(dir)`
   for both pipelines (SmolVLA/pi0: MEAN_STD, pi0.5: QUANTILES; images IDENTITY).
3. Raw robot inputs from the same numpy generator: uint8 HWC frames, a float32 state inside [q01, q99] (the
   `other` set's pi0.5 folders put one value below q01 and one above q99, giving bins -1 and 255).
4. Each sample -> `lerobot.policies.utils.prepare_observation_for_inference` (uint8/255, HWC->CHW, batch dim),
   samples concatenated, `task` = list of the two task strings -> the LeRobot pre-processor -> `batch.*`.
5. `model_input.*` from the policy's own functions (`prepare_images`/`prepare_state` for SmolVLA,
   `_preprocess_images`/`prepare_state` for pi0/pi0.5) applied to `batch.*`.
6. `noise = torch.randn((B, chunk_size, max_action_dim), generator=torch.Generator().manual_seed(noise_seed))`;
   `action_chunk_normalized = policy.predict_action_chunk(batch, noise=noise)`; `action_chunk` = the
   post-processor applied to it, with the SAME pipeline pair (for relative actions the post-processor adds the
   state that the pre-processor cached in step 4). Intermediates are recorded by wrapping `model.embed_prefix`,
   `model.denoise_step` and the VLM-with-expert `forward` (prefix K/V cache) for that same call; they are not
   recomputed.
7. `check_fixtures.py` reloads every folder in a fresh process (`<Policy>.from_pretrained(".")`,
   `PolicyProcessorPipeline.from_pretrained` for both pipelines) and reproduces every stored `batch.*`,
   `model_input.*`, `action_chunk_normalized` and `action_chunk` bit-exactly (max abs diff 0.0).

## Folders

| folder | policy | cameras (HxW, in order) | batch | chunk / steps | state -> max_state, action -> max_action | prefix tokens (valid) | params | size |
|---|---|---|---|---|---|---|---|---|
{table}

Model sizes:
{sizes}

Tasks: {tasks}. Prompts as fed to the tokenizer are in each `fixture_info.json` (`prompts_fed_to_tokenizer`) and
in the safetensors metadata (`prompts`).

{relative_lines}

## Files in every folder

- `config.json`, `model.safetensors`: `policy.save_pretrained(dir)`. Only float32. pi0/pi0.5: BOTH
  `...paligemma.lm_head.weight` and `...paligemma.model.language_model.embed_tokens.weight` are stored and they
  DIFFER (LeRobot {lerobot} builds `PaliGemmaForConditionalGenerationWithPiGemma` by replacing the language model after
  construction, so they are not tied; each was perturbed separately). The forward pass uses `embed_tokens`;
  `lm_head` (and `gemma_expert.lm_head`) are unused.
- `policy_preprocessor.json`, `policy_postprocessor.json` + `*_normalizer_processor.safetensors`: the LeRobot
  pipelines, saved by LeRobot.
- `tiny_smolvlm/` (SmolVLA) or `tiny_paligemma_tokenizer/` (pi0/pi0.5): written by transformers
  {transformers} `save_pretrained` from the 0.4.4 reference tokenizers (SmolVLA: plus the tiny SmolVLM config with the
  sizes below). Referenced by RELATIVE name (`vlm_model_name`, `tokenizer_name`): `cd` into the folder to load it.
- `tiny_dims.json` (pi0/pi0.5): the real model sizes; LeRobot {lerobot} still cannot express them in `config.json`
  (`paligemma_variant`/`action_expert_variant` must be `gemma_2b`/`gemma_300m`, and `get_gemma_config`, the
  vision sizes and the 257152 vocab are hard-coded), so `fixture_utils.apply_tiny_pi_patches` patches
  `get_gemma_config`, `PaliGemmaForConditionalGenerationWithPiGemma` and `PiGemmaForCausalLM` in
  `lerobot.policies.<pi0|pi05>.modeling_<pi0|pi05>` before the policy is built or loaded.
- `inputs.safetensors`, `expected.safetensors` (below; metadata: `tasks`, `prompts`, `camera_order` as JSON
  strings, `family`, `set`), `fixture_info.json` (versions, seeds, dims, prompts, token ids, masks, stats, key
  shapes).

### inputs.safetensors

| key | meaning |
|---|---|
| `raw.observation.images.<cam>` | uint8 (B,H,W,3) RGB frame as a robot gives it |
| `raw.observation.state` | float32 (B,S) raw state |
| `batch.observation.images.<cam>` | float32 (B,3,H,W) in [0,1] (= raw/255) as `predict_action_chunk` receives it |
| `batch.observation.state` | float32 (B,S) normalized state (MEAN_STD `(x-mean)/(std+1e-8)`, QUANTILES `2*(x-q01)/(q99-q01)-1`) |
| `batch.observation.language.tokens` / `.attention_mask` | int64 / bool (B,L) from the TokenizerProcessorStep |
| `model_input.image.<i>` / `model_input.image_mask.<i>` | float32 (B,3,R,R) in [-1,1] as fed to the vision tower (i-th camera of `camera_order`) / bool (B,) |
| `model_input.state_padded` | SmolVLA, pi0: normalized state zero-padded to max_state_dim (input of `state_proj`) |
| `model_input.state_bins` | pi0.5: int64 (B,S) `np.digitize(batch.observation.state, np.linspace(-1,1,257)[:-1]) - 1`, the numbers in the prompt (NOT padded to max_state_dim in LeRobot >= 0.5) |
| `noise` | float32 (B, chunk_size, max_action_dim), `x` at t=1 |

### expected.safetensors

| key | meaning |
|---|---|
| `action_chunk_normalized` | `policy.predict_action_chunk(batch, noise=noise)` (B, chunk, action_dim) |
| `action_chunk` | after the post-processor (unnormalize; relative folders: then + reference state on the masked dims) |
| `prefix_embs`, `prefix_pad_masks`, `prefix_att_masks`, `prefix_position_ids` | prefix as fed to the first VLM layer; positions `cumsum(pad)-1` |
| `prefix_kv.layer<i>.key` / `.value` | prefix K/V cache of the first and last VLM layer, [B, L, H_kv, head_dim], keys AFTER RoPE |
| `timesteps` | (num_steps,) float32 `1 + k*dt`, `dt = -1/num_steps` (as computed in float64 then cast) |
| `x_t_before_step`, `velocities`, `velocity.step0`, `x_final_padded` | Euler loop: x_t entering step k, v_k, v_0, final x (full max_action_dim width) |
| `vision_position_ids` | SmolVLA: (B, patches) position-embedding rows used by the SmolVLM vision embeddings |
| `action_chunk_before_absolute` | relative folders: output of the unnormalizer step, before the absolute-actions step |
| `relative_action_mask` | relative folders: bool (action_dim,), True = dim converted (state added back) |
| `relative_reference_state` | relative folders: the state cached by RelativeActionsProcessorStep (RAW, not normalized) |

## Pipelines saved by LeRobot {lerobot}

{pipelines}

## What changed against the 0.4.4 references (what a re-implementation must follow)

- **pi0/pi0.5 image padding:** `resize_with_pad_torch` now clamps the resized image to [0,1] and pads (centred)
  with **0.0** in [0,1] space, so padded pixels become **-1.0** after `x*2-1` (0.4.4: -1 before the mapping,
  i.e. -3.0). Cameras already at `image_resolution` are not resized. SmolVLA is unchanged: left/top padding with 0
  in [0,1] space (-1 after mapping), `resize_imgs_with_padding` read as (width, height).
- **pi0.5 prompt:** `"Task: {{task.strip().replace('_',' ').replace('\\n',' ')}}, State: {{bins}};\\nAction: "` with
  ONE number per state dimension of the normalized state (no zero-padding to max_state_dim any more, so no
  trailing `128`s). Bins are `np.digitize(x, linspace(-1,1,257)[:-1]) - 1`: values < -1 give `-1`, values >= 1
  give `255`.
- **pi0/pi0.5 processors:** always contain `relative_actions_processor` (pre) and `absolute_actions_processor`
  (post), with `enabled` false unless `use_relative_actions`; the normalizer state file is
  `policy_preprocessor_step_6_...` (pi0) / `step_3` (pi0.5) instead of step 5 / step 2.
- **Gemma embedding scale:** LeRobot 0.6.1 leaves it to transformers 5.5's `GemmaTextScaledWordEmbedding`
  (`embedding * float32(sqrt(width))`); LeRobot 0.5.1 (transformers 5.3) still does `lang_emb * math.sqrt(width)`
  itself, like 0.4.4. Numerically the same.
- **Relative-action step registry name:** `relative_actions_processor` in 0.6.1, `delta_actions_processor` in
  0.5.1 (same class `RelativeActionsProcessorStep`, same config fields).
- **Untied `embed_tokens` / `lm_head`** in pi0/pi0.5 (see Files).
- **SmolVLM vision position ids (transformers {transformers}):** `bucketize(float32(i) * float32(1/n_patches),
  arange(1/n_side, 1, 1/n_side), right=True)`; with the sizes used here this is the plain row-major grid
  (`vision_position_ids` = arange), i.e. the 4.57 float32 quirk of the references is gone.
- **pi0.5 `Pi05PrepareStateTokenizerProcessorStep`** still serialises no config (`{{}}`); since 0.5 its
  `max_state_dim` no longer matters.
- Unchanged: normalizer formulas, Euler sampler and float32 timesteps, float64 sinusoidal time embedding, the
  8-query-head reshape in pi0/pi0.5, eager attention with mask value -2.3819763e38 (pi) / finfo(float32).min
  (SmolVLA) in the language model / expert (the SigLIP / SmolVLM vision towers run with transformers' default
  `sdpa`), SmolVLA's own split-half RoPE with base 10000.

## Reloading with LeRobot

```python
# cwd = the fixture folder; python = a venv from tools/lerobot/setup_env.sh
import sys; sys.path.insert(0, "<repo>/tools/lerobot")
from fixture_utils import load_policy_and_processors, raw_to_policy_batch
policy, pre, post = load_policy_and_processors(Path("."))   # applies tiny_dims.json for pi0/pi0.5
batch = pre(raw_to_policy_batch(raw, tasks))                 # relative folders: caches the raw state
chunk = policy.predict_action_chunk(batch, noise=noise)
actions = post(chunk)
```
Loading the processors with plain `PolicyProcessorPipeline.from_pretrained` leaves
`AbsoluteActionsProcessorStep.relative_step` unset (it is not serialisable) and the relative post-processor then
raises; LeRobot's `make_pre_post_processors(cfg, pretrained_path=...)` re-links it
(`lerobot/policies/factory.py:61-76, 220`).
"""


def write_readme(out_dir: Path, set_name: str) -> None:
    order = ["smolvla", "pi0", "pi05", "pi0_relative", "pi05_relative"]
    infos = []
    for d in sorted(out_dir.iterdir(), key=lambda d: (order.index(d.name) if d.name in order else 99, d.name)):
        if (d / "fixture_info.json").exists():
            infos.append(json.loads((d / "fixture_info.json").read_text()))
    if not infos:
        return
    v = infos[0]["versions"]
    rows, rel_lines, pipes, sizes = [], [], [], []
    names = {"smolvla": "SmolVLAPolicy", "pi0": "PI0Policy", "pi05": "PI05Policy"}
    for inf in infos:
        cfg = inf["config"]
        cams = ", ".join(f"`{c.split('.')[-1]}` {h}x{w}" for c, (h, w) in inf["raw_camera_hw"].items())
        steps = cfg.get("num_steps", cfg.get("num_inference_steps"))
        rows.append(
            f"| `{inf['folder']}/` | {names[inf['family']]}{' (relative)' if inf['relative_actions'] else ''} | "
            f"{cams} | {inf['batch_size']} | {cfg['chunk_size']} / {steps} | {inf['state_dim']} -> "
            f"{cfg['max_state_dim']}, {inf['action_dim']} -> {cfg['max_action_dim']} | {inf['prefix_len']} "
            f"({', '.join(map(str, inf['prefix_valid_len']))}) | {inf['n_parameters']} | "
            f"{_folder_size(out_dir / inf['folder']) / 1024:.0f} KiB |"
        )
        if inf["family"] == "smolvla":
            vc = inf["tiny_smolvlm_config"]
            t, vi = vc["text_config"], vc["vision_config"]
            ew = int(t["hidden_size"] * cfg["expert_width_multiplier"])
            sizes.append(
                f"- `{inf['folder']}/`: VLM text (Llama) hidden {t['hidden_size']}, intermediate "
                f"{t['intermediate_size']}, {t['num_attention_heads']} heads / {t['num_key_value_heads']} KV heads, "
                f"head_dim {t['head_dim']}, vocab {t['vocab_size']}, {t['num_hidden_layers']} layers in the VLM config of "
                f"which SmolVLA keeps num_vlm_layers={cfg['num_vlm_layers']}; vision hidden {vi['hidden_size']}, "
                f"intermediate {vi['intermediate_size']}, {vi['num_hidden_layers']} layers, "
                f"{vi['num_attention_heads']} heads, image {vi['image_size']}, patch {vi['patch_size']}, scale_factor "
                f"{vc['scale_factor']} -> {(vi['image_size'] // vi['patch_size'] // vc['scale_factor']) ** 2} tokens "
                f"per camera; expert hidden {ew} (= int(hidden*{cfg['expert_width_multiplier']})), "
                f"self_attn_every_n_layers {cfg['self_attn_every_n_layers']}, attention_mode "
                f"{cfg['attention_mode']}, tokenizer_max_length {cfg['tokenizer_max_length']} "
                f"(pad_language_to `{cfg['pad_language_to']}`), resize_imgs_with_padding "
                f"{cfg['resize_imgs_with_padding']}"
            )
        else:
            td = inf["tiny_dims"]
            vl, ex, vi = td["vlm"], td["expert"], td["vision"]
            sizes.append(
                f"- `{inf['folder']}/` (tiny_dims.json): VLM width {vl['width']}, depth {vl['depth']}, mlp "
                f"{vl['mlp_dim']}, {vl['num_heads']} heads / {vl['num_kv_heads']} KV, head_dim {vl['head_dim']}; expert "
                f"width {ex['width']}, depth {ex['depth']}, mlp {ex['mlp_dim']}, head_dim {ex['head_dim']}; vision "
                f"hidden {vi['hidden_size']}, intermediate {vi['intermediate_size']}, {vi['num_hidden_layers']} "
                f"layers, {vi['num_attention_heads']} heads, patch {vi['patch_size']}, image {td['image_size']} -> "
                f"{(td['image_size'] // vi['patch_size']) ** 2} tokens per camera; vocab {td['vocab_size']}; "
                f"tokenizer_max_length {cfg['tokenizer_max_length']}, min/max period {cfg.get('min_period', 0.004)}/"
                f"{cfg.get('max_period', 4.0)}"
            )
        if inf["relative_actions"]:
            ra = inf["relative_actions"]
            rel_lines.append(
                f"- `{inf['folder']}/`: `use_relative_actions: true`, `relative_exclude_joints: "
                f"{json.dumps(ra['relative_exclude_joints'])}`, `action_feature_names: "
                f"{json.dumps(ra['action_feature_names'])}` -> mask (True = relative) {json.dumps(ra['mask'])}"
            )
        for fn in ("policy_preprocessor.json", "policy_postprocessor.json"):
            js = json.loads((out_dir / inf["folder"] / fn).read_text())
            desc = " -> ".join(
                s["registry_name"]
                + (f"(enabled={str(s['config']['enabled']).lower()})" if "enabled" in s["config"] else "")
                + (f" [{s['state_file']}]" if s.get("state_file") else "")
                for s in js["steps"]
            )
            pipes.append(f"- `{inf['folder']}/{fn}`: {desc}")
    if rel_lines:
        rel_lines.insert(0, "Relative-action folders (LeRobot `RelativeActionsProcessorStep` / `AbsoluteActionsProcessorStep`):")
        rel_lines.append(
            "  The pre-processor caches the RAW `observation.state` (before normalization) for the whole batch; the "
            "post-processor, after un-normalizing, adds `state[..., :action_dim] * mask` to `action[..., :action_dim]` "
            "(a joint is excluded if any lower-cased exclude token equals, or is a substring of, the lower-cased action "
            "name; missing names count as relative; state_dim < action_dim raises a shape error in LeRobot)."
        )
    tag = v["lerobot"].replace(".", "")
    text = README_TEMPLATE.format(
        lerobot=v["lerobot"], transformers=v["transformers"], torch=v["torch"], tokenizers=v["tokenizers"],
        safetensors=v["safetensors"], numpy=v["numpy"], hub=v["huggingface-hub"], python=v["python"],
        set_name=set_name, tag=tag,
        set_flag="" if set_name == "main" else f" --set {set_name} --out {out_dir}",
        out=(out_dir.relative_to(REPO) if out_dir.is_relative_to(REPO) else out_dir),
        table="\n".join(rows), tasks=", ".join(json.dumps(t) for t in infos[0]["tasks"]),
        relative_lines="\n".join(rel_lines), pipelines="\n".join(pipes), sizes="\n".join(sizes),
    )  # fmt: skip
    (out_dir / "README.md").write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="main", choices=sorted(SETS))
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default: test/fixtures/lerobot<version> for --set main)")  # fmt: skip
    ap.add_argument("--only", default=None, help="comma-separated subset of folders to (re)generate")
    ap.add_argument("--no-check", action="store_true", help="skip the reload check (check_fixtures.py)")
    args = ap.parse_args()

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)
    lerobot_version = md.version("lerobot")
    if args.out is None:
        if args.set != "main":
            ap.error("--out is required for sets other than main (they are not committed)")
        args.out = REPO / "test" / "fixtures" / ("lerobot" + lerobot_version.replace(".", ""))
    args.out = args.out.resolve()
    specs = SETS[args.set]()
    from lerobot.policies.pi0.configuration_pi0 import PI0Config

    if not hasattr(PI0Config, "__dataclass_fields__") or "use_relative_actions" not in PI0Config.__dataclass_fields__:
        print(f"lerobot {lerobot_version} has no relative actions: skipping *_relative")
        specs = {k: v for k, v in specs.items() if "relative" not in v}
    if args.only:
        keep = args.only.split(",")
        specs = {k: v for k, v in specs.items() if k in keep}
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, spec in specs.items():
        print(f"[make_fixtures] {args.set}/{name} -> {args.out / name}", flush=True)
        info = generate_one(name, copy.deepcopy(spec), args.out, args.set)
        summary[name] = {"n_parameters": info["n_parameters"], "prefix_len": info["prefix_len"]}
    print(json.dumps(summary, indent=1))
    if not args.only:
        write_readme(args.out, args.set)
    if not args.no_check:
        rc = subprocess.call([sys.executable, str(HERE / "check_fixtures.py"), str(args.out),
                              "--only", ",".join(specs)])  # fmt: skip
        return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
