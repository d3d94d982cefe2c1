# SPDX-License-Identifier: Apache-2.0
"""
``vla-policy-bench``: observation-to-chunk latency, per stage, against the naive path and LeRobot.

One run measures, after warm-up and on the same weights and inputs:
- per stage (preprocessing, prefix pass, each denoising step, post-processing,
  total) median / p95 / max, and peak memory;
- the cached path against the naive one that recomputes the prefix at every
  denoising step (alternating), with the theoretical ratio from FLOP counts;
- LeRobot's own ``predict_action_chunk`` and whole path, run from ``.venv-lerobot`` (0.4.4;
  ``VLA_BENCH_LEROBOT_PYTHON`` picks another, e.g. 0.6.1) as a subprocess
  (``lerobot_worker.py``): blocks of its chunks and ours alternate ``--rounds`` times,
  each block after an idle pause, so that machine drift cancels and neither process
  runs while the other's threads still spin; and the largest action difference at
  equal noise;
- the matmul FLOPs per chunk and the fraction of the CPU's measured float32 peak each side reaches
  (with ``--dtype int8`` also of its int8 matmul peak).

Named configurations (``tiny``, ``smolvla``, ``pi0``) are random-weight models saved as
LeRobot checkpoints in a temporary folder (see ``checkpoints``); ``--checkpoint``
benchmarks a checkpoint folder instead. Before writing one, the bench estimates the
RAM the run needs and stops with the figures when it does not fit. LeRobot's pi0 and
pi0.5 need openpi's patched transformers; without it the comparison is skipped, with
the reason in the table and the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from safetensors.torch import load_file

from vla_policy_node.bench import checkpoints, memory
from vla_policy_node.bench.lerobot_compare import (LEROBOT_PYTHON, LeRobotWorker, lerobot_memory_blocker,
                                                   lerobot_pi_blocker, worker_inputs)
from vla_policy_node.bench.measure import (STAGES, StepTimer, available_memory_bytes, chunk_flops, cpu_model,
                                           make_observation, naive_ratio, peak_float32_flops, peak_int8_ops,
                                           peak_rss_mib, prefix_length, progress, reset_peak_rss, rss_mib, settle,
                                           step_bytes, summarize, tensor_bytes)
from vla_policy_node.bench.report import dds_table, table
from vla_policy_node.loading import load_policy
from vla_policy_node.loading.checkpoint import CheckpointError, checkpoint_dir
from vla_policy_node.runtime.engine import RuntimeConfig
from vla_policy_node.model.families import FAMILIES
from vla_policy_node.model.precision import INT8, load_dtype_name


def memory_check(estimate: memory.MemoryEstimate, args: argparse.Namespace) -> Optional[str]:
    """Return why the run would not fit in RAM (with the figures and what would fit), or None."""
    available = available_memory_bytes()
    need = estimate.host_peak
    if need <= available:
        return None
    gib = 2**30
    parts = (f"weights {estimate.weights / gib:.1f} GiB + oneDNN-packed copies {estimate.packed / gib:.1f} GiB"
             if estimate.device == "cpu" else f"loading {estimate.load / gib:.1f} GiB (float32 build)")
    msg = (f"{args.config} {args.dtype} on {args.device} needs about {need / gib:.1f} GiB of RAM ({parts}, "
           f"+ {estimate.working / gib:.1f} GiB working memory; loading alone peaks at {estimate.load / gib:.1f} GiB); "
           f"{available / gib:.1f} GiB is available.")
    hints = []
    if args.dtype == "float32":
        lighter = memory.memory_estimate(args.config, args.cameras, "bfloat16", args.device, not args.no_pack,
                                         args.pi0_dims)
        hints.append(f"--dtype bfloat16 (about {lighter.host_peak / gib:.1f} GiB)")
    if not args.no_pack and estimate.packed:
        unpacked = memory.memory_estimate(args.config, args.cameras, load_dtype_name(args.dtype), args.device, False,
                                          args.pi0_dims)
        hints.append(f"--no-pack (about {unpacked.host_peak / gib:.1f} GiB, slower CPU matmuls)")
    if hints:
        msg += " Try " + " or ".join(hints) + "."
    return msg


def start_lerobot(args: argparse.Namespace, policy, folder: Path, inputs_path: Path,
                  work: Path) -> tuple[dict, Optional[LeRobotWorker]]:
    """Start LeRobot's worker on the same checkpoint and inputs, or say why it does not run."""
    lerobot: dict = {"available": False, "python": str(LEROBOT_PYTHON)}
    if args.no_lerobot:
        lerobot["reason"] = "disabled (--no-lerobot)"
    elif not LEROBOT_PYTHON.exists():
        lerobot["reason"] = f"{LEROBOT_PYTHON} not found; make it with `make lerobot-env` (see BENCHMARKS.md)"
    elif policy.device.type == "cuda":
        lerobot["reason"] = "the LeRobot comparison runs on the CPU only"
    elif FAMILIES[policy.family].backbone == "paligemma" and (blocker := lerobot_pi_blocker(LEROBOT_PYTHON)):
        lerobot["reason"] = blocker
    elif blocker := lerobot_memory_blocker(folder):
        lerobot["reason"] = blocker
    else:
        progress("starting the LeRobot worker")
        try:
            worker = LeRobotWorker(folder, inputs_path, args.threads or torch.get_num_threads(),
                                   work / "lerobot_worker.log", LEROBOT_PYTHON)
            lerobot.update(available=True, torch=worker.info["torch"], load_s=worker.info["load_s"],
                           not_in_checkpoint=worker.info["not_in_checkpoint"])
            return lerobot, worker
        except (RuntimeError, OSError, json.JSONDecodeError) as exc:
            lerobot["reason"] = f"worker failed: {exc}"
    return lerobot, None


def compare_actions(policy, worker: LeRobotWorker, work: Path, inputs, noise: torch.Tensor, obs: dict,
                    noise_np: np.ndarray, lerobot: dict) -> None:
    """Record the largest action differences against LeRobot at equal noise (model, then whole path)."""
    theirs = load_file(str(Path(worker.request(f"actions {work / 'lerobot_actions.safetensors'}")["saved"])))
    ours = policy.runtime.sample(inputs, noise)[..., :policy.action_dim].float().cpu()
    lerobot["max_abs_diff"] = float((ours - theirs["actions"]).abs().max())
    lerobot["max_abs_action"] = float(theirs["actions"].abs().max())
    ours_raw = torch.as_tensor(policy.predict_action_chunk(obs, noise=noise_np)).float().reshape(
        theirs["pipeline_actions"].shape)
    lerobot["pipeline_max_abs_diff"] = float((ours_raw - theirs["pipeline_actions"]).abs().max())


def time_chunks(args: argparse.Namespace, policy, obs: dict, noise_np: np.ndarray,
                worker: Optional[LeRobotWorker], lerobot: dict) -> dict:
    """Time ours and LeRobot's chunks in alternating blocks; return per-stage samples and step timings."""
    steps = StepTimer(policy)
    samples: dict[str, list[float]] = {s: [] for s in STAGES if s != "denoise_step"}
    theirs_s: list[float] = []
    pipeline_s: list[float] = []          # LeRobot's pre-processor + predict_action_chunk + post-processor
    rounds = max(1, min(args.rounds, args.iters)) if worker is not None else 1
    per_round = max(1, -(-args.iters // rounds))
    if worker is not None:
        lerobot["rounds"] = rounds
    for r in range(rounds):
        if worker is not None:
            settle()
            untimed = len(steps.samples)
            policy.predict_action_chunk(obs, noise=noise_np)      # re-warms what LeRobot's block evicted
            del steps.samples[untimed:]
        for i in range(per_round):
            policy.predict_action_chunk(obs, noise=noise_np)
            for stage in samples:
                samples[stage].append(policy.stats.timings[stage][-1])
            progress(f"round {r + 1}/{rounds}, ours {i + 1}/{per_round}: "
                     f"total {1e3 * samples['total'][-1]:.1f} ms")
        if worker is None:
            continue
        settle()
        worker.request("run")                                     # untimed, like ours
        for i in range(per_round):
            reply = worker.request("run")
            theirs_s.append(reply["seconds"])
            pipeline_s.append(reply["pipeline_seconds"])
            lerobot["peak_rss_mib"] = reply["peak_rss_mib"]
            progress(f"round {r + 1}/{rounds}, LeRobot {i + 1}/{per_round}: {1e3 * reply['seconds']:.1f} ms")
    if theirs_s:
        ours_total = np.asarray(samples["total"])
        lerobot.update(**summarize(theirs_s), seconds=theirs_s,
                       speedup=float(np.median(np.asarray(theirs_s) / ours_total)),
                       speedup_of_medians=float(np.median(theirs_s) / np.median(ours_total)),
                       pipeline=summarize(pipeline_s),
                       pipeline_speedup=float(np.median(np.asarray(pipeline_s) / ours_total)))
    return {"samples": samples, "steps": steps.samples}


def flop_rates(policy, inputs, noise: torch.Tensor, stages: dict, lerobot: dict, peak: dict) -> dict:
    """Count the matmul FLOPs per chunk and the fraction of the float32 peak ours and LeRobot's chunks reach."""
    flops = chunk_flops(policy, inputs, noise)
    result = {"gflops": {k: v / 1e9 for k, v in flops.items()}, "peak_gflops": peak["peak"] / 1e9,
              "peak_measured": {k: v / 1e9 if k in ("mkl", "onednn_packed", "peak") else v for k, v in peak.items()
                                if k != "int8"},
              "ours_fraction": flops["chunk"] / (stages["total"]["median_ms"] / 1e3) / peak["peak"]}
    if "median_ms" in lerobot:
        result["lerobot_fraction"] = flops["chunk"] / (lerobot["median_ms"] / 1e3) / peak["peak"]
    if "int8" in peak:          # the rates an int8 chunk could reach: its distance to this CPU's limit
        result["int8_peak"] = {k: v if k == "threads" else v / 1e9 for k, v in peak["int8"].items()}
        result["ours_fraction_of_int8_peak"] = result["ours_fraction"] * peak["peak"] / peak["int8"]["peak"]
    return result


def run(args: argparse.Namespace, folder: Path, work: Path, saved: Optional[dict] = None,
        estimate: Optional[memory.MemoryEstimate] = None) -> dict:
    threads = torch.get_num_threads()         # the budget; the warm-up may keep fewer (``threads_used``)
    peak = peak_float32_flops() if args.device == "cpu" else None      # before anything else loads the CPU
    if peak:
        progress(f"float32 matmul peak {peak['peak'] / 1e9:.0f} GFLOP/s with {peak['threads']} thread(s)")
    if peak and args.dtype == "int8":
        peak["int8"] = peak_int8_ops()
        progress(f"int8 matmul peak {peak['int8']['peak'] / 1e9:.0f} GOPS")
    peak_since_load = reset_peak_rss()
    t_load = time.perf_counter()
    policy = load_policy(folder, device=args.device, dtype=args.dtype, pack_weights=not args.no_pack)
    load_s = time.perf_counter() - t_load
    progress(f"loaded in {load_s:.1f} s: {policy.describe()}")
    held = tensor_bytes(policy.model)
    policy.runtime.configure(RuntimeConfig(cuda_graphs=args.cuda_graphs, torch_compile=args.compile, trace=args.trace))
    frame = checkpoints.CAMERA_FRAME.get(args.config) if not args.checkpoint else None
    frame = frame or policy.preprocessor.image_size
    obs, noise_np = make_observation(policy, frame, args.seed, args.batch)
    inputs = worker_inputs(policy, obs, noise_np, work / "inputs.safetensors").to(policy.device, policy.dtype)
    noise = torch.from_numpy(noise_np)
    cuda = policy.device.type == "cuda"
    lerobot, worker = start_lerobot(args, policy, folder, work / "inputs.safetensors", work)
    try:
        if worker is not None:
            compare_actions(policy, worker, work, inputs, noise, obs, noise_np, lerobot)
        policy.warmup(obs)                    # as the node does: compiled/eager and thread-count races
        for i in range(args.warmup):
            policy.predict_action_chunk(obs, noise=noise_np)
            if worker is not None:
                worker.request("run")
            progress(f"warm-up {i + 1}/{args.warmup}")
        if cuda:
            torch.cuda.reset_peak_memory_stats(policy.device)
        rss_start, peak_load = rss_mib(), peak_rss_mib()
        reset_peak_rss()
        timed = time_chunks(args, policy, obs, noise_np, worker, lerobot)
        rss_end, peak_run = rss_mib(), peak_rss_mib()
        stages = {s: summarize(v) for s, v in timed["samples"].items()}
        stages["total"]["seconds"] = timed["samples"]["total"]          # the closed-loop benchmark's input
        stages["denoise_step"] = summarize(timed["steps"]) if timed["steps"] else {
            **{k: v / policy.num_steps for k, v in stages["denoise"].items() if k != "n"}, "n": 0}
        naive = naive_ratio(policy, inputs, noise, args.naive_iters, stages) if args.naive_iters else None
        read_per_step = step_bytes(policy, inputs, noise)
        flops = flop_rates(policy, inputs, noise, stages, lerobot, peak) if peak else None
    finally:
        if worker is not None:
            worker.close()
    memory = {"peak_rss_load_mib": peak_load, "peak_rss_mib": peak_run if peak_since_load else peak_rss_mib(),
              "peak_counted_from": "timed run" if peak_since_load else "process start",
              "rss_start_mib": rss_start, "rss_end_mib": rss_end,
              "cuda_peak_mib": torch.cuda.max_memory_allocated(policy.device) / 2**20 if cuda else None,
              "weights_mib": held["weights"] / 2**20, "packed_mib": held["packed"] / 2**20,
              "estimate": estimate.as_dict() if estimate is not None else None}
    return {"config": describe_run(args, policy, inputs, frame, threads, load_s, saved),
            "machine": {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "torch": torch.__version__,
                        "gpu": torch.cuda.get_device_name(policy.device) if cuda else None},
            "stages": stages, "memory": memory, "naive": naive, "lerobot": lerobot, "step_bytes": read_per_step,
            "flops": flops}


def describe_run(args: argparse.Namespace, policy, inputs, frame, threads: int, load_s: float,
                 saved: Optional[dict]) -> dict:
    """Describe the run for the result: what ran, at which sizes, and what the warm-up decided."""
    model = policy.model
    prefix_tokens = policy.runtime.cache.seq_length() or prefix_length(policy, inputs)   # graphs keep their own
    return {"name": args.checkpoint or args.config, "family": policy.family, "cameras": len(policy.camera_names),
            "batch": args.batch, "padding": policy.preprocessor.padding,
            "prompt_tokens": int(inputs.tokens.shape[1]),
            "prompt_tokens_used": int(inputs.token_mask.bool().any(0).sum()),   # eager code skips the rest
            "device": str(policy.device), "dtype": args.dtype, "threads": threads,
            "threads_used": policy.threads or threads, "threads_report": policy.threads_report,
            "compiled": policy.runtime.torch_compile, "compile_report": policy.compile_report,
            "cuda_graphs": bool(policy.runtime.cuda_graphs_active), "compile": args.compile,
            "traced": len(policy.runtime.traces.signatures), "trace_report": policy.runtime.traces.report,
            "iters": args.iters, "warmup": args.warmup, "num_steps": policy.num_steps,
            "chunk_size": policy.chunk_size, "prefix_tokens": prefix_tokens,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "camera_frame_hw": list(frame), "packed_weights": not args.no_pack,
            "load_s": load_s, "checkpoint": saved}


def run_dds(args: argparse.Namespace, folder: Path) -> dict:
    """Run the node over DDS; measure its ROS overhead against the target (5% of the policy time + 2 ms)."""
    from vla_policy_node.bench import dds

    config = json.loads((folder / "config.json").read_text())
    cameras = [k for k, v in config["input_features"].items() if v.get("type") == "VISUAL"]
    frame = checkpoints.CAMERA_FRAME.get(args.config) if not args.checkpoint else None
    frame = frame or tuple(config["input_features"][cameras[0]]["shape"][1:])
    r = dds.measure(folder, cameras, frame, args.dtype, args.threads, args.control_rate, args.iters, args.warmup,
                    progress, args.compile)
    if r.get("available") and r["latencies_s"]:
        r["frame_to_command"] = summarize(r.pop("latencies_s"))
        policy_ms = r["node_total_p50_ms"]
        r["ros_overhead_ms"] = r["frame_to_command"]["median_ms"] - policy_ms
        r["target_ms"] = 0.05 * policy_ms + 2.0
    return {"config": {"name": str(args.checkpoint or args.config), "cameras": len(cameras), "dtype": args.dtype,
                       "threads": args.threads, "iters": args.iters, "camera_frame_hw": list(frame)},
            "machine": {"cpu": cpu_model(), "logical_cpus": os.cpu_count()}, "dds": r}


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vla-policy-bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("config", nargs="?", default="tiny", choices=checkpoints.CONFIG_NAMES,
                   help="random-weight configuration at real dimensions (ignored with --checkpoint)")
    p.add_argument("--checkpoint", type=Path, help="benchmark this LeRobot checkpoint folder instead")
    p.add_argument("--cameras", type=int, default=1, help="1..3 (named configurations)")
    p.add_argument("--batch", type=int, default=1, help="observations per chunk request (rows of different prompts)")
    p.add_argument("--padding", choices=["max_length", "longest"], default="max_length",
                   help="prompt padding the random checkpoint's pre-processor records (named configurations)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", INT8],
                   help="run dtype (int8: int8 linear weights, float32 activations, CPU); "
                        "pi0's random checkpoint is also saved in it")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--warmup", type=int, default=3, help="untimed chunks before the timing")
    p.add_argument("--iters", type=int, default=20, help="timed chunks (per round)")
    p.add_argument("--rounds", type=int, default=3,
                   help="with LeRobot: blocks of ours and LeRobot's chunks, alternated this many times "
                        "(--iters is rounded up to a multiple)")
    p.add_argument("--naive-iters", type=int, default=3, help="cached/naive pairs (0 skips the naive ratio)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay the prefix pass and the denoising loop as CUDA graphs (CUDA only)")
    p.add_argument("--compile", action="store_true",
                   help="compile the prefix pass and the denoising loop ahead of time (AOTInductor, in the warm-up)")
    p.add_argument("--trace", action="store_true",
                   help="trace the eager chunk in the warm-up and replay it, as the node does (its trace parameter)")
    p.add_argument("--no-lerobot", action="store_true", help="skip the LeRobot comparison")
    p.add_argument("--no-pack", action="store_true",
                   help="CPU: keep no oneDNN-packed weight copies (half the memory, slower float32 matmuls)")
    p.add_argument("--no-memory-check", action="store_true",
                   help="run even when the RAM estimate exceeds MemAvailable")
    p.add_argument("--dds", action="store_true",
                   help="measure the installed node over DDS on localhost instead: frame published -> command received")
    p.add_argument("--control-rate", type=float, default=500.0, help="--dds: the node's control_rate_hz")
    p.add_argument("--pi0-dims", type=lambda path: json.loads(Path(path).read_text()), default=None,
                   metavar="JSON", help="pi0 only: sizes instead of the published ones, in the loader's "
                                        "tiny_dims.json form (vlm, expert, vision, vocab_size, image_size)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights, frames and noise")
    p.add_argument("--json", type=Path, help="write every figure to this file")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.naive_iters < 0:
        p.error("--iters must be >= 1, --warmup and --naive-iters >= 0")
    if args.batch < 1:
        p.error("--batch must be >= 1")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    estimate, saved = None, None
    if not args.checkpoint:
        estimate = memory.memory_estimate(args.config, args.cameras, load_dtype_name(args.dtype), args.device,
                                          not args.no_pack, args.pi0_dims)
        progress(f"{args.config}: about {estimate.host_peak / 2**30:.1f} GiB of RAM at the peak, "
                 f"{available_memory_bytes() / 2**30:.1f} GiB available")
        problem = None if args.no_memory_check else memory_check(estimate, args)
        if problem:
            print(f"vla-policy-bench: not run: {problem}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="vla-policy-bench-") as tmp:
        work = Path(tmp)
        if args.checkpoint:
            try:
                folder = checkpoint_dir(args.checkpoint)
            except CheckpointError as error:
                print(f"vla-policy-bench: not run: {error}", file=sys.stderr)
                return 2
        else:
            progress(f"writing a random-weight {args.config} checkpoint ({args.cameras} camera(s))")
            saved = {}
            folder = checkpoints.save_random_checkpoint(work / "checkpoint", args.config, args.cameras, args.seed,
                                                        args.dtype, saved, args.padding, args.pi0_dims)
            progress(f"checkpoint written: build + init {saved['build_s']:.1f} s, save {saved['save_s']:.1f} s, "
                     f"{saved['file_bytes'] / 2**30:.2f} GiB")
        try:
            result = run_dds(args, folder) if args.dds else run(args, folder, work, saved, estimate)
        except CheckpointError as error:
            print(f"vla-policy-bench: not run: {error}", file=sys.stderr)
            return 2
    print(dds_table(result) if args.dds else table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
