# SPDX-License-Identifier: Apache-2.0
"""
vla-policy-train: train the shipped table-top policy from scripted demonstrations, on a CPU.

    vla-policy-train --output /tmp/touch_policy            # the shipped SO-101 policy: about 19 minutes on 2 cores
    vla-policy-train --output /tmp/quick --steps 200 --episodes 100   # a smoke run
    vla-policy-train --output /tmp/p06 --lerobot-version 0.6          # for LeRobot 0.6.x
    vla-policy-train --export-from vla_policy_node/sim/so101/touch_policy --output /tmp/touch06 --lerobot-version 0.6
    vla-policy-train --robot planar --episodes 3000 --steps 10000 --output /tmp/planar   # the planar test arm's

The network is the runtime's own SmolVLA at a small size (a 2-layer ViT, a 4-layer
text model, a 4-layer action expert), trained from scratch with LeRobot's flow-matching
loss and AdamW, seeded. Batches go through the same ``Preprocessor`` the loaded
checkpoint uses at inference. The result is a LeRobot-layout checkpoint, a loss curve
PNG and a summary with the success rate of closed-loop episodes on unseen layouts,
run through ``load_policy`` on the saved files.

The checkpoint loads in LeRobot itself, of one generation: ``--lerobot-version 0.4`` (the
default; LeRobot 0.4.x, transformers 4.57) or ``0.6`` (LeRobot 0.6.x, transformers 5), see
``export``. ``--export-from DIR`` converts a saved checkpoint (the shipped one, or an export
for the other generation) without training; the actions stay the same.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
import json
import math
import shutil
import sys
from pathlib import Path
import time

import numpy as np
import torch
from tqdm import tqdm

from vla_policy_node.model.families.smolvla import SmolVLA, SmolVLAConfig
from vla_policy_node.loading.load import init_weights, load_policy
from vla_policy_node.model.normalization import Normalizer
from vla_policy_node.model.preprocessing import Preprocessor, newline_prompt, smolvla_image
from vla_policy_node.model.tokenizer import TextTokenizer
from vla_policy_node.sim.robots import make_env, ROBOTS
from vla_policy_node.sim.rollout import evaluate, policy_chunk_fn, success_rate
from vla_policy_node.sim.scene import COLOURS
from vla_policy_node.train import data_parallel, export
from vla_policy_node.train.data_parallel import Worker
from vla_policy_node.train.demonstrations import Demonstrations, collect
from vla_policy_node.train.flow_matching import flow_matching_loss, sample_noise, sample_time

EVAL_SEED_OFFSET = 10_000        # evaluation layouts come from another seed than the demonstrations
SHARD_SEED_STEP = 7_919          # worker r records its demonstrations from seed + r * this
VOCABULARY = ["touch", "the", "block", *COLOURS, "purple", "a", "to", "go", "reach", "cube", "square"]


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides the trained weights (with the code)."""

    robot: str = "so101"                  # the simulated robot (sim.robots): so101 or planar
    seed: int = 0
    episodes: int = 1200
    steps: int = 6000
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 300
    final_lr_fraction: float = 0.05
    weight_decay: float = 1e-10          # LeRobot's SmolVLA preset
    grad_clip_norm: float = 10.0
    chunk_size: int = 10
    num_steps: int = 10                   # Euler steps at inference
    eval_episodes: int = 50
    init_from: str = ""                   # a checkpoint to continue from (its weights and statistics)
    workers: int = 2                      # data-parallel processes; each draws batch_size / workers samples

    def __post_init__(self) -> None:
        for name in ("episodes", "steps", "batch_size", "chunk_size", "num_steps", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.robot not in ROBOTS:
            raise ValueError(f"robot must be one of {', '.join(ROBOTS)}, got {self.robot!r}")
        if self.batch_size % self.workers:
            raise ValueError(f"batch_size {self.batch_size} does not split over {self.workers} workers")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


def policy_configs(cfg: TrainConfig, env, vocab_size: int) -> tuple[dict, dict]:
    """Return LeRobot's config.json and the backbone's config.json for the small model (8x8 patches)."""
    joints = env.num_joints
    h = w = side = env.image_size
    vlm = {
        "model_type": "smolvlm", "scale_factor": 2, "vocab_size": vocab_size,
        "text_config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "head_dim": 16, "rms_norm_eps": 1e-5, "vocab_size": vocab_size},
        "vision_config": {"model_type": "smolvlm_vision", "hidden_size": 64, "intermediate_size": 128,
                          "num_hidden_layers": 2, "num_attention_heads": 4, "patch_size": side // 8,
                          "image_size": side, "layer_norm_eps": 1e-6},
    }
    config = {
        "type": "smolvla", "n_obs_steps": 1,
        "input_features": {
            "observation.state": {"type": "STATE", "shape": [joints]},
            f"observation.images.{env.camera_name}": {"type": "VISUAL", "shape": [3, h, w]},
        },
        "output_features": {"action": {"type": "ACTION", "shape": [joints]}},
        "device": "cpu", "chunk_size": cfg.chunk_size, "n_action_steps": cfg.chunk_size,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
        "max_state_dim": joints, "max_action_dim": joints, "resize_imgs_with_padding": [side, side],
        "empty_cameras": 0, "tokenizer_max_length": 8, "num_steps": cfg.num_steps, "use_cache": True,
        "freeze_vision_encoder": False, "train_expert_only": False, "train_state_proj": True,
        "optimizer_lr": cfg.lr, "optimizer_betas": [0.9, 0.95], "optimizer_eps": 1e-8,
        "optimizer_weight_decay": cfg.weight_decay, "optimizer_grad_clip_norm": cfg.grad_clip_norm,
        "vlm_model_name": export.VLM_FOLDER, "load_vlm_weights": False, "add_image_special_tokens": False,
        "attention_mode": "cross_attn", "prefix_length": -1, "pad_language_to": "max_length",
        "num_expert_layers": -1, "num_vlm_layers": 4, "self_attn_every_n_layers": 2,
        "expert_width_multiplier": 0.75, "min_period": 4e-3, "max_period": 4.0,
        "joint_names": list(env.joint_names),
    }
    return config, vlm


def mean_std(x: np.ndarray, worker: Worker = Worker()) -> dict[str, np.ndarray]:
    """Mean and standard deviation per last-axis feature, over every worker's shard of ``x``."""
    flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
    sums = data_parallel.pooled_sums(np.concatenate([flat.sum(0), (flat ** 2).sum(0), [len(flat)]]), worker)
    features = flat.shape[1]
    count = sums[-1]
    mean = sums[:features] / count
    std = np.sqrt(np.maximum(sums[features:2 * features] / count - mean ** 2, 0.0))
    return {"mean": mean.astype(np.float32), "std": std.astype(np.float32)}


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to ``final_lr_fraction`` of the peak."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.final_lr_fraction + (1 - cfg.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(cfg: TrainConfig, output: Path, progress: bool = True, worker: Worker = Worker(),
          lerobot_version: str = export.DEFAULT_LEROBOT_VERSION) -> dict:
    """
    Collect demonstrations, train, save the checkpoint (for LeRobot ``lerobot_version``) and evaluate it.

    Returns the summary.

    With several workers each one runs this: each records its share of the demonstrations
    (its own seed) and draws its batches from them, the normalization statistics are pooled
    over all shares; rank 0 alone writes files and returns the summary (the others {}).
    """
    if worker.world != cfg.workers:
        raise ValueError(f"the config is for {cfg.workers} workers, this is one of {worker.world} "
                         "(start several through data_parallel.run)")
    started = time.monotonic()
    torch.manual_seed(cfg.seed + 1_000_003 * worker.rank)
    progress = progress and worker.leader
    env = make_env(cfg.robot)
    share = cfg.episodes // cfg.workers + (worker.rank < cfg.episodes % cfg.workers)
    demos = collect(env, share, cfg.chunk_size, cfg.seed + SHARD_SEED_STEP * worker.rank, progress=progress)
    samples = int(data_parallel.pooled_sums(np.array([len(demos)]), worker)[0])
    tokenizer = export.word_tokenizer(VOCABULARY)
    config, vlm = policy_configs(cfg, env, tokenizer.get_vocab_size())
    model_cfg = SmolVLAConfig.from_lerobot(config, vlm)
    model = SmolVLA(model_cfg)
    if cfg.init_from:
        # Continue a run: its weights, and its statistics (the weights were trained against them).
        # An export of either generation is read back into the training layout (4.57 position ids).
        saved = export.read_checkpoint(Path(cfg.init_from))
        state_stats, action_stats = saved.state_stats, saved.action_stats
        export.copy_trained_weights(saved, model)
    else:
        state_stats, action_stats = mean_std(demos.states, worker), mean_std(demos.actions, worker)
        init_weights(model, torch.Generator().manual_seed(cfg.seed))
    data_parallel.broadcast_parameters(model, worker)
    # The checkpoint's files exist from the start: the tokenizer is read back as inference reads it.
    if worker.leader:
        export.save_checkpoint(output, model, config, vlm, tokenizer, state_stats, action_stats, lerobot_version)
    data_parallel.synchronise(worker)
    preprocessor = Preprocessor(
        camera_names=model_cfg.camera_names, image_size=model_cfg.image_size,
        image_transform=smolvla_image(*model_cfg.image_size),
        tokenizer=TextTokenizer(output / export.VLM_FOLDER / "tokenizer.json"),
        max_length=model_cfg.tokenizer_max_length, padding=model_cfg.pad_language_to, prompt=newline_prompt,
        state_normalizer=Normalizer("MEAN_STD", state_stats), state_dim=model_cfg.state_dim,
        max_state_dim=model_cfg.max_state_dim)
    action_norm = Normalizer("MEAN_STD", action_stats)
    losses = optimise(cfg, model, preprocessor, action_norm, demos, progress, worker)
    if not worker.leader:
        env.close()
        return {}
    export.save_checkpoint(output, model, config, vlm, tokenizer, state_stats, action_stats, lerobot_version)
    train_seconds = time.monotonic() - started
    policy = load_policy(output, device="cpu")
    results = evaluate(env, policy_chunk_fn(policy, env), cfg.eval_episodes, cfg.seed + EVAL_SEED_OFFSET,
                       execute=cfg.chunk_size // 2)
    env.close()                         # the SO-101's renderer: released, not left to the collector
    summary = {
        "config": asdict(cfg), "samples": samples, "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(train_seconds, 1), "threads": torch.get_num_threads(),
        "final_loss": float(np.mean(losses[-100:])), "eval_episodes": cfg.eval_episodes,
        "eval_success_rate": success_rate(results),
    }
    (output / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_losses(losses, output / "loss_curve.png", cfg)
    return summary


def optimise(cfg: TrainConfig, model: SmolVLA, preprocessor: Preprocessor, action_norm: Normalizer,
             demos: Demonstrations, progress: bool, worker: Worker = Worker()) -> list[float]:
    """Run the AdamW loop over random batches; returns the loss of every step (averaged over the workers)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(cfg.seed if worker.leader else (cfg.seed, worker.rank))
    batch = cfg.batch_size // cfg.workers
    actions = action_norm.normalize(demos.actions)                     # (N, chunk, J)
    losses: list[float] = []
    model.train()
    bar = tqdm(range(cfg.steps), desc="training", disable=not progress, unit="step")
    for step in bar:
        idx = rng.integers(0, len(demos), batch)
        inputs = preprocessor({"images": {demos.camera: demos.images[idx]}, "state": demos.states[idx],
                               "task": [demos.instructions[i] for i in demos.task_index[idx]]})
        target = torch.from_numpy(actions[idx])
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        loss = flow_matching_loss(model, inputs, target, sample_noise(tuple(target.shape)),
                                  sample_time(batch))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        losses.append(data_parallel.average_gradients(model.parameters(), loss, worker))
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip_norm)
        optimizer.step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-100:]):.4f}", lr=f"{learning_rate(cfg, step):.1e}")
    model.eval()
    return losses


def plot_losses(losses: list[float], path: Path, cfg: TrainConfig) -> None:
    """Loss per step and its 100-step mean, log scale."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    steps = np.arange(len(losses))
    smooth = np.convolve(losses, np.ones(100) / 100, mode="valid") if len(losses) >= 100 else np.asarray(losses)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, losses, color="#bbbbbb", linewidth=0.6, label="batch loss")
    ax.plot(steps[len(steps) - len(smooth):], smooth, color="#1f77b4", label="mean of 100 steps")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("flow-matching MSE")
    ax.set_title(f"vla-policy-train: batch {cfg.batch_size}, peak lr {cfg.lr:g}, seed {cfg.seed}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and train."""
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(prog="vla-policy-train", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--output", type=Path, required=True, help="checkpoint folder to write")
    parser.add_argument("--robot", choices=ROBOTS, default=defaults.robot,
                        help="the simulated robot: so101 (MuJoCo, the demo's) or planar (the numpy test arm)")
    helps = {"seed": "seed of the demonstrations, the initial weights and the batches",
             "episodes": "scripted demonstrations to record", "steps": "optimizer steps",
             "batch_size": "samples per step (split over the workers)", "warmup_steps": "learning-rate warm-up steps",
             "eval_episodes": "closed-loop episodes on unseen layouts after training"}
    for name, text in helps.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name), help=text)
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate (AdamW)")
    parser.add_argument("--workers", type=int, default=defaults.workers,
                        help="data-parallel processes of 1 torch thread each (at most one per core)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (with --workers 1)")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="continue from this checkpoint (its weights and normalization statistics)")
    parser.add_argument("--lerobot-version", choices=export.LEROBOT_VERSIONS, default=export.DEFAULT_LEROBOT_VERSION,
                        help="the LeRobot generation the checkpoint is written for: 0.4 (LeRobot 0.4.x, "
                             "transformers 4.57) or 0.6 (LeRobot 0.6.x, transformers 5)")
    parser.add_argument("--export-from", type=Path, default=None, metavar="DIR",
                        help="do not train: write the checkpoint in DIR (e.g. an export for the other LeRobot "
                             "generation) to --output for --lerobot-version; --output may be DIR itself")
    args = parser.parse_args(argv)
    if args.export_from is not None:
        return export_only(args.export_from, args.output, args.lerobot_version)
    try:
        cfg = TrainConfig(robot=args.robot, seed=args.seed, episodes=args.episodes, steps=args.steps,
                          batch_size=args.batch_size, lr=args.lr, warmup_steps=min(args.warmup_steps, args.steps),
                          eval_episodes=args.eval_episodes, workers=args.workers,
                          init_from=str(args.init_from.resolve()) if args.init_from else "")
    except ValueError as error:
        parser.error(str(error))
    if cfg.workers > 1:
        data_parallel.run(_train_worker, cfg.workers, cfg, args.output, args.lerobot_version)
        summary = json.loads((args.output / "train_summary.json").read_text())
    else:
        torch.set_num_threads(args.threads)
        summary = train(cfg, args.output, lerobot_version=args.lerobot_version)
    print(json.dumps(summary, indent=2))
    print(f"checkpoint: {args.output}  loss curve: {args.output / 'loss_curve.png'}")
    print(lerobot_hint(args.output))
    return 0


def lerobot_hint(folder: Path) -> str:
    """Say how LeRobot loads an export: from inside it (its backbone is the relative folder ``vlm``), offline."""
    return (f"LeRobot loads it from inside the folder (the backbone is the relative name 'vlm'): cd {folder} && "
            "HF_HUB_OFFLINE=1 lerobot-eval --policy.path=. ... (docs/checkpoints.md)")


def _train_worker(worker: Worker, cfg: TrainConfig, output: Path,
                  lerobot_version: str = export.DEFAULT_LEROBOT_VERSION) -> None:
    train(cfg, output, worker=worker, lerobot_version=lerobot_version)


def export_only(source: Path, output: Path, lerobot_version: str) -> int:
    """``--export-from``: one line and no new folder left behind when ``source`` cannot be exported."""
    created = not output.exists()
    try:
        return _export(source, output, lerobot_version)
    except (ValueError, KeyError, OSError) as error:     # CheckpointError is a ValueError
        if created:
            shutil.rmtree(output, ignore_errors=True)
        print(f"vla-policy-train: --export-from {source}: {error}", file=sys.stderr)
        return 1


def _export(source: Path, output: Path, lerobot_version: str) -> int:
    """Re-export a checkpoint for ``lerobot_version``; it must act as the source did."""
    saved = export.read_checkpoint(source)
    obs = export.sample_observation(saved.config, seed=0)
    cfg = saved.model.config
    noise = np.random.default_rng(1).standard_normal((1, cfg.chunk_size, cfg.max_action_dim)).astype(np.float32)
    before = load_policy(source, device="cpu").predict_action_chunk(obs, noise=noise)
    export.save_checkpoint(output, saved.model, saved.config, saved.vlm_config, saved.tokenizer, saved.state_stats,
                           saved.action_stats, lerobot_version, saved.settings)
    after = load_policy(output, device="cpu").predict_action_chunk(obs, noise=noise)
    difference = float(np.abs(after - before).max())
    print(f"exported {source} ({saved.generation.describe()}) for LeRobot {lerobot_version} "
          f"({export.CHECKED_WITH[lerobot_version]}) to {output}; max |action difference| through "
          f"load_policy: {difference:.2e}")
    if not difference <= 1e-5:
        print("error: the exported checkpoint does not act as the source did")
        return 1
    print(lerobot_hint(output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
