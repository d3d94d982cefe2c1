#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Check that vla-policy-train's exports load in LeRobot and act there exactly as through ``load_policy``.

Run with the project's python; it calls tools/lerobot/export_check.py with each LeRobot venv's python:

    .venv/bin/python tools/lerobot/export_compare.py \\
        --lerobot 0.4=.venv-lerobot044/bin/python --lerobot 0.6=.venv-lerobot061/bin/python [--work DIR]

For each target generation given (0.4 -> LeRobot 0.4.4, 0.6 -> LeRobot 0.6.1) it exports

* the shipped demo checkpoint (vla_policy_node/sim/planar/touch_policy, re-exported from its own weights; the
  package's files as they are too, for the generation they were exported for), and
* a freshly built tiny SmolVLA (two cameras of other sizes than the backbone's, state and actions padded,
  every parameter randomised so no norm or position row is trivial),

feeds the same raw observation and noise to LeRobot (export_check.py) and to
``load_policy(folder).predict_action_chunk(obs, noise=...)``, and prints the max abs difference of the
un-normalized and normalized action chunks and whether LeRobot's token ids equal ours. It also runs each
export in the other generation's LeRobot, for information: there the vision position ids differ, and so
do the actions. Exits 1 if a same-generation difference exceeds --tolerance (1e-5). A JSON summary is
written to WORK/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from vla_policy_node.model.families.smolvla import SmolVLA, SmolVLAConfig  # noqa: E402
from vla_policy_node.loading.load import init_weights  # noqa: E402
from vla_policy_node.loading import load_policy  # noqa: E402
from vla_policy_node.sim import PLANAR_CHECKPOINT  # noqa: E402
from vla_policy_node.train import export  # noqa: E402


def tiny_parts(seed: int = 0) -> tuple[SmolVLA, dict, dict, object, dict, dict]:
    """A small random SmolVLA, its LeRobot-style config (with project fields), backbone sizes, tokenizer, stats."""
    tokenizer = export.word_tokenizer(["pick", "up", "the", "red", "cube", "touch", "block", "green"])
    vocab = tokenizer.get_vocab_size()
    vlm = {"model_type": "smolvlm", "scale_factor": 2, "vocab_size": vocab,
           "text_config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
                           "vocab_size": vocab},
           "vision_config": {"model_type": "smolvlm_vision", "hidden_size": 32, "intermediate_size": 64,
                             "num_hidden_layers": 2, "num_attention_heads": 2, "patch_size": 4, "image_size": 32,
                             "layer_norm_eps": 1e-6}}
    config = {
        "type": "smolvla", "n_obs_steps": 1,
        "input_features": {"observation.state": {"type": "STATE", "shape": [4]},
                           "observation.images.top": {"type": "VISUAL", "shape": [3, 48, 64]},
                           "observation.images.wrist": {"type": "VISUAL", "shape": [3, 40, 30]}},
        "output_features": {"action": {"type": "ACTION", "shape": [5]}},
        "device": "cpu", "chunk_size": 6, "n_action_steps": 6,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
        "max_state_dim": 6, "max_action_dim": 7, "resize_imgs_with_padding": [32, 32], "tokenizer_max_length": 10,
        "num_steps": 4, "vlm_model_name": export.VLM_FOLDER, "load_vlm_weights": False,
        "add_image_special_tokens": False, "attention_mode": "cross_attn", "prefix_length": -1,
        "pad_language_to": "max_length", "num_expert_layers": -1, "num_vlm_layers": 3, "self_attn_every_n_layers": 2,
        "expert_width_multiplier": 0.75, "min_period": 4e-3, "max_period": 4.0,
        "joint_names": ["j1", "j2", "j3", "j4"],
    }
    model = SmolVLA(SmolVLAConfig.from_lerobot(config, vlm))
    generator = torch.Generator().manual_seed(seed)
    init_weights(model, generator)
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.add_(0.1 * torch.randn(tensor.shape, generator=generator))
    model.eval()
    rng = np.random.default_rng(seed)
    stats = {"mean": rng.standard_normal(4).astype(np.float32), "std": rng.uniform(0.5, 2, 4).astype(np.float32)}
    action_stats = {"mean": rng.standard_normal(5).astype(np.float32),
                    "std": rng.uniform(0.5, 2, 5).astype(np.float32)}
    return model, config, vlm, tokenizer, stats, action_stats


def write_inputs(folder: Path, path: Path, seed: int) -> tuple[dict, np.ndarray]:
    """A raw observation and noise for the checkpoint in ``folder``; saved for export_check.py, returned for us."""
    config = json.loads((folder / "config.json").read_text())
    obs = export.sample_observation(config, seed=seed, task="Touch the red block")
    noise = np.random.default_rng(seed + 1).standard_normal(
        (1, config["chunk_size"], config["max_action_dim"])).astype(np.float32)
    tensors = {"state": obs["state"][None], "noise": noise}
    tensors |= {f"image.{name}": frames[None] for name, frames in obs["images"].items()}
    save_file(tensors, str(path), metadata={"task": json.dumps([obs["task"]])})
    return obs, noise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lerobot", action="append", required=True, metavar="GEN=PYTHON",
                        help="a LeRobot venv's python for a target generation, e.g. 0.6=.venv-lerobot061/bin/python")
    parser.add_argument("--work", type=Path, default=Path("/tmp/vla-export-check"))
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()
    pythons = dict(item.split("=", 1) for item in args.lerobot)
    for generation in pythons:
        export.check_version(generation)
    args.work.mkdir(parents=True, exist_ok=True)
    check = Path(__file__).with_name("export_check.py")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    rows, failed = [], False
    for generation in export.LEROBOT_VERSIONS:
        if generation not in pythons:
            continue
        demo = args.work / f"demo_{generation}"
        export.export_checkpoint(PLANAR_CHECKPOINT, demo, generation)
        tiny = args.work / f"tiny_{generation}"
        model, config, vlm, tokenizer, stats, action_stats = tiny_parts(seed=3)
        export.save_checkpoint(tiny, model, config, vlm, tokenizer, stats, action_stats, generation)
        checkpoints = [("demo", demo), ("tiny", tiny)]
        shipped = json.loads((PLANAR_CHECKPOINT / export.SETTINGS_FILE).read_text()).get("lerobot_version")
        if shipped == generation:
            checkpoints.insert(0, ("shipped", PLANAR_CHECKPOINT))    # the files in the package, as they are
        for name, folder in checkpoints:
            obs, noise = write_inputs(folder, args.work / f"{name}_{generation}_inputs.safetensors", seed=5)
            policy = load_policy(folder, device="cpu")
            ours = policy.predict_action_chunk(obs, noise=noise)
            our_tokens = policy.preprocessor({**obs, "images": obs["images"]}).tokens.numpy()
            for runner in export.LEROBOT_VERSIONS:
                if runner not in pythons:
                    continue
                out = args.work / f"{name}_{generation}_in_{runner}.safetensors"
                result = subprocess.run([pythons[runner], str(check), str(folder),
                                         str(args.work / f"{name}_{generation}_inputs.safetensors"), str(out)],
                                        env=env, capture_output=True, text=True)
                row = {"checkpoint": name, "export": generation, "lerobot": runner,
                       "same_generation": runner == generation}
                if result.returncode != 0:
                    row["error"] = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"
                    (args.work / f"{name}_{generation}_in_{runner}.log").write_text(result.stdout + result.stderr)
                    failed |= runner == generation
                    rows.append(row)
                    print(row)
                    continue
                theirs = load_file(str(out))
                normalized_ours = policy.action_normalizer.normalize(ours)
                row |= {
                    "max_abs_diff": float(np.abs(theirs["action_chunk"] - ours).max()),
                    "max_abs_diff_normalized": float(np.abs(theirs["action_chunk_normalized"] - normalized_ours).max()),
                    "tokens_equal": bool(np.array_equal(theirs["tokens"], our_tokens)),
                    "max_abs_action": float(np.abs(ours).max()),
                }
                if runner == generation and not (row["max_abs_diff"] <= args.tolerance and row["tokens_equal"]):
                    failed = True
                rows.append(row)
                print(json.dumps(row))
    (args.work / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"summary: {args.work / 'summary.json'}; {'FAILED' if failed else 'ok'} "
          f"(same-generation tolerance {args.tolerance:g})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
