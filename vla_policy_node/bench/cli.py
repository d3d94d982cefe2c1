# SPDX-License-Identifier: Apache-2.0
"""
``vla-policy-bench``: observation-to-chunk latency, per stage, against the naive path and LeRobot.

One run measures, after warm-up and on the same weights and inputs:
- per stage (preprocessing, prefix pass, each denoising step, post-processing,
  total) median / p95 / max, and peak memory;
- the cached path against the naive one that recomputes the prefix at every
  denoising step (alternating), with the theoretical ratio from FLOP counts;
- LeRobot 0.4.4's own ``predict_action_chunk`` and whole path, run from ``.venv-lerobot``
  as a subprocess (``lerobot_worker.py``): blocks of its chunks and ours alternate
  ``--rounds`` times, each block after an idle pause, so that machine drift cancels and
  neither process runs while the other's threads still spin; and the largest action
  difference at equal noise.

Named configurations (``tiny``, ``smolvla``, ``pi0``) are random-weight models saved as
LeRobot checkpoints in a temporary folder (see ``checkpoints``); ``--checkpoint``
benchmarks a checkpoint folder instead. Before writing one, the bench estimates the
RAM the run needs and stops with the figures when it does not fit. LeRobot's pi0 and
pi0.5 need openpi's patched transformers; without it the comparison is skipped, with
the reason in the table and the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch
import torch.utils._pytree as pytree
from safetensors.torch import load_file, save_file
from torch.overrides import TorchFunctionMode

from vla_policy_node.bench import checkpoints
from vla_policy_node.model.blocks import packing_targets
from vla_policy_node.loading.checkpoint import CheckpointError, read_safetensors_header
from vla_policy_node.runtime.policy import Policy
from vla_policy_node.model.prefix_cache import VLAPrefixCache
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.loading import load_policy

REPO = Path(__file__).resolve().parents[2]
# LeRobot's own environment (``make lerobot-env``); VLA_BENCH_LEROBOT_PYTHON points at another one.
LEROBOT_PYTHON = Path(os.environ.get("VLA_BENCH_LEROBOT_PYTHON", REPO / ".venv-lerobot" / "bin" / "python"))
WORKER = Path(__file__).with_name("lerobot_worker.py")
TASK = "pick up the red cube and put it in the bin"
# Rows of a batch get prompts of different lengths, so that 'longest' padding has something to pad.
BATCH_TASKS = (TASK, "open the drawer", "put the cube in the bin", "stack the blocks")
STAGES = ("preprocess", "prefix", "denoise_step", "denoise", "postprocess", "total")
PI_FAMILIES = ("pi0", "pi05")


def summarize(seconds: list[float]) -> dict[str, float]:
    """Milliseconds: median, p95, max, n."""
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {"median_ms": float(np.median(ms)), "p95_ms": float(np.percentile(ms, 95)),
            "max_ms": float(ms.max()), "n": int(ms.size)}


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS counter (VmHWM), so writing the random checkpoint is not counted."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def available_memory_bytes() -> int:
    """MemAvailable: what can be allocated without swapping (page cache included, as the kernel reclaims it)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def memory_check(estimate: checkpoints.MemoryEstimate, args: argparse.Namespace) -> Optional[str]:
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
        lighter = checkpoints.memory_estimate(args.config, args.cameras, "bfloat16", args.device, not args.no_pack)
        hints.append(f"--dtype bfloat16 (about {lighter.host_peak / gib:.1f} GiB)")
    if not args.no_pack and estimate.packed:
        unpacked = checkpoints.memory_estimate(args.config, args.cameras, args.dtype, args.device, False)
        hints.append(f"--no-pack (about {unpacked.host_peak / gib:.1f} GiB, slower CPU matmuls)")
    if hints:
        msg += " Try " + " or ".join(hints) + "."
    return msg


@contextlib.contextmanager
def unpacked(model: torch.nn.Module) -> Iterator[None]:
    """Hide the packed weights (the plain ``F.linear`` path runs): ``FlopCounterMode`` does not count oneDNN's."""
    hidden = [(m, a, getattr(m, a)) for m, a, _ in packing_targets(model) if getattr(m, a, None) is not None]
    for m, a, _ in hidden:
        setattr(m, a, None)
    try:
        yield
    finally:
        for m, a, t in hidden:
            setattr(m, a, t)


def tensor_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of the parameters and of the packed copies actually held."""
    packed = sum(t.numel() * t.element_size() for m, a, _ in packing_targets(model)
                 if isinstance(t := getattr(m, a, None), torch.Tensor))
    return {"weights": sum(p.numel() * p.element_size() for p in model.parameters()), "packed": packed}


def lerobot_pi_blocker() -> Optional[str]:
    """Why LeRobot 0.4.4's pi0 / pi0.5 cannot run from ``.venv-lerobot`` (found in a second), or None."""
    probe = ("import importlib.util, transformers; print(transformers.__version__, "
             "importlib.util.find_spec('transformers.models.siglip.check') is not None)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
    try:
        out = subprocess.run([str(LEROBOT_PYTHON), "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not probe {LEROBOT_PYTHON} for transformers: {exc}"
    words = out.stdout.split()
    if out.returncode != 0 or len(words) < 2:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return f"could not import transformers in {LEROBOT_PYTHON}: {tail}"
    if words[-1] == "True":
        return None
    return (f"LeRobot 0.4.4's pi0/pi0.5 need openpi's patched transformers (modeling_pi0 imports "
            f"transformers.models.siglip.check, else raises 'An incorrect transformer version is used'); "
            f".venv-lerobot has transformers {words[-2]} without it")


def lerobot_memory_blocker(folder: Path) -> Optional[str]:
    """Say why LeRobot's float32 copy of the checkpoint would not fit in RAM beside our policy, or None."""
    try:
        params = sum(info.numel for info in read_safetensors_header(folder / "model.safetensors").values())
    except (CheckpointError, OSError):
        return None                     # not a single-file checkpoint: let the worker report
    need, available = params * 4 + checkpoints.WORKING_BYTES, available_memory_bytes()
    if need <= available:
        return None
    return (f"LeRobot would load {params / 1e9:.2f} B parameters in float32 ({need / 2**30:.1f} GiB with its working "
            f"memory) beside this policy; {available / 2**30:.1f} GiB is available")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def progress(msg: str) -> None:
    print(f"[vla-policy-bench] {msg}", file=sys.stderr, flush=True)


class LeRobotWorker:
    """LeRobot's ``predict_action_chunk`` in its own virtual environment, one request per line."""

    def __init__(self, checkpoint: Path, inputs: Path, threads: int, log: Path) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
        self.log = log
        with open(log, "w") as stderr:
            self.proc = subprocess.Popen(
                [str(LEROBOT_PYTHON), str(WORKER), str(checkpoint), str(inputs), "--threads", str(threads)],
                cwd=checkpoint, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self.info = self._reply()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"the LeRobot worker exited (code {self.proc.wait()}): {' | '.join(tail)}")
        return json.loads(line)

    def request(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def make_observation(policy: Policy, frame_hw: tuple[int, int], seed: int, batch: int = 1) -> tuple[dict, np.ndarray]:
    """
    Random uint8 camera frames, state and tasks; noise (B, chunk, max_action_dim).

    At batch 1 the arrays are single-row ((H, W, 3), (D,)) and the task ``TASK``, as a robot
    sends them; larger batches stack rows with the prompts of ``BATCH_TASKS``.
    """
    rng = np.random.default_rng(seed)
    h, w = frame_hw
    lead = () if batch == 1 else (batch,)
    obs = {"images": {name: rng.integers(0, 256, (*lead, h, w, 3), dtype=np.uint8) for name in policy.camera_names},
           "state": rng.normal(size=(*lead, policy.state_dim)).astype(np.float32),
           "task": TASK if batch == 1 else [BATCH_TASKS[i % len(BATCH_TASKS)] for i in range(batch)]}
    noise = rng.standard_normal((batch, policy.chunk_size, policy.model.max_action_dim)).astype(np.float32)
    return obs, noise


def worker_inputs(policy: Policy, obs: dict, noise: np.ndarray, path: Path) -> ModelInputs:
    """
    Save the same observation for LeRobot, raw and as its model takes it.

    ``raw.*`` (with the tasks in the metadata) feeds its whole path, ``batch.*`` its
    ``predict_action_chunk`` as its pre-processor would leave it.
    """
    inputs = policy.preprocessor(obs)

    def frames(arr: np.ndarray) -> torch.Tensor:            # (B, 3, H, W) float in [0, 1]
        arr = arr if arr.ndim == 4 else arr[None]
        return torch.from_numpy(arr).permute(0, 3, 1, 2).float().div(255.0).contiguous()
    images = {name: frames(obs["images"][name]) for name in policy.camera_names}
    tensors = {f"{kind}.{name}": t.clone() for kind in ("batch", "raw") for name, t in images.items()}
    state = np.asarray(obs["state"], np.float32)
    state = state if state.ndim == 2 else state[None]
    tensors["raw.observation.state"] = torch.from_numpy(np.ascontiguousarray(state))
    normalized = policy.preprocessor.state_normalizer.normalize(state)
    tensors["batch.observation.state"] = torch.from_numpy(np.ascontiguousarray(normalized, dtype=np.float32))
    tensors["batch.observation.language.tokens"] = inputs.tokens
    tensors["batch.observation.language.attention_mask"] = inputs.token_mask
    tensors["noise"] = torch.from_numpy(noise)
    tasks = [obs["task"]] if isinstance(obs["task"], str) else list(obs["task"])
    save_file(tensors, str(path), metadata={"tasks": json.dumps(tasks)})
    return inputs


class StepTimer:
    """Times each denoising step by wrapping the runtime's velocity function (a device sync per step)."""

    def __init__(self, policy: Policy) -> None:
        self.samples: list[float] = []
        runtime = policy.runtime
        inner = runtime.velocity_fn

        def timed(ctx):
            fn = inner(ctx)

            def velocity(x, k):
                t0 = time.perf_counter()
                v = fn(x, k)
                sync(runtime.device)
                self.samples.append(time.perf_counter() - t0)
                return v
            return velocity
        runtime.velocity_fn = timed


def count_flops(policy: Policy, inputs: ModelInputs, noise: torch.Tensor) -> dict[str, float]:
    """Matmul FLOPs of one prefix pass and one denoising step (attention counted through the eager backend)."""
    from torch.utils.flop_counter import FlopCounterMode

    model, runtime = policy.model, policy.runtime
    backend = getattr(model, "backend", None)
    if backend is not None:
        model.backend = "eager"
    try:
        with torch.inference_mode(), unpacked(model):
            cache = VLAPrefixCache()
            with FlopCounterMode(display=False) as prefix:
                ctx = model.encode_prefix(inputs, cache)
            cache.freeze(model.num_cache_layers)
            with FlopCounterMode(display=False) as step:
                model.velocity(noise, runtime.time_cond[0], ctx)
    finally:
        if backend is not None:
            model.backend = backend
    return {"prefix": float(prefix.get_total_flops()), "step": float(step.get_total_flops())}


def prefix_length(policy: Policy, inputs: ModelInputs) -> int:
    """Count the tokens in the prefix of ``inputs`` (one eager prefix pass)."""
    with torch.inference_mode():
        cache = VLAPrefixCache()
        policy.model.encode_prefix(inputs, cache)
    return cache.seq_length()


class _StateReads(TorchFunctionMode):
    """Record which of the model's weight storages the torch calls run under it read."""

    def __init__(self, owned: dict[int, int]) -> None:
        super().__init__()
        self.owned, self.read = owned, {}

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        reads_data = getattr(func, "__name__", "") != "__get__"      # not ``.dtype``, ``.shape``, ...
        for leaf in pytree.tree_leaves((args, kwargs or {})) if reads_data else ():
            if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided:      # packed/sparse: no storage
                key = leaf.untyped_storage().data_ptr()
                if key in self.owned:
                    self.read[key] = self.owned[key]
        return func(*args, **(kwargs or {}))


def step_bytes(policy: Policy, inputs: ModelInputs, noise: torch.Tensor) -> dict[str, int]:
    """
    Bytes one denoising step must read from memory at least: its weights and the prefix K/V.

    The weights are every parameter or buffer storage that one ``velocity`` call passes to
    a torch function, each counted once: fused projections (buffers whose storage the
    covered linears share) included, cross-attention K/V projected once per prefix not.
    The GPU check divides this by the memory bandwidth: the step's floor.
    """
    model, runtime = policy.model, policy.runtime
    owned = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
             for t in [*model.parameters(), *model.buffers()]}
    with torch.inference_mode(), unpacked(model):
        cache = VLAPrefixCache()
        ctx = model.encode_prefix(inputs, cache)
        cache.freeze(model.num_cache_layers)
        with _StateReads(owned) as reads:
            model.velocity(noise.to(policy.device), runtime.time_cond[0], ctx)
        kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in layer)
    return {"weights": sum(reads.read.values()), "kv_cache": kv}


SETTLE_S = 0.05
"""
Idle time before each side's block of chunks. An OpenMP worker thread spins for about
9 ms after a parallel region (measured here: an idle process burns 8.8 ms of CPU in the
100 ms after one 2-thread matmul); without this pause that spinning takes a core from
the process timed next.
"""


def settle() -> None:
    """Wait until the other process's OpenMP threads have stopped spinning (see ``SETTLE_S``)."""
    time.sleep(SETTLE_S)


def naive_ratio(policy: Policy, inputs: ModelInputs, noise: torch.Tensor, iters: int,
                stages: dict) -> dict:
    """Time cached vs naive (prefix recomputed every step), alternating; measured and theoretical ratios."""
    rt, n = policy.runtime, policy.num_steps
    cached, naive = [], []
    a = b = None
    for i in range(iters):
        t0 = time.perf_counter()
        a = rt.sample(inputs, noise)
        sync(rt.device)
        t1 = time.perf_counter()
        b = rt.sample_naive(inputs, noise)
        sync(rt.device)
        t2 = time.perf_counter()
        cached.append(t1 - t0)
        naive.append(t2 - t1)
        progress(f"naive {i + 1}/{iters}: cached {1e3 * (t1 - t0):.1f} ms, naive {1e3 * (t2 - t1):.1f} ms")
    flops = count_flops(policy, inputs, noise)
    p, s = flops["prefix"], flops["step"]
    tp, ts = stages["prefix"]["median_ms"], stages["denoise_step"]["median_ms"]
    return {
        "iters": iters, "cached": summarize(cached), "naive": summarize(naive),
        "ratio": float(np.median(naive) / np.median(cached)),
        "theoretical_ratio": n * (p + s) / (p + n * s),
        "expected_ratio_from_stage_medians": n * (tp + ts) / (tp + n * ts),
        "gflops": {"prefix": p / 1e9, "step": s / 1e9},
        "max_abs_diff": float((a - b).abs().max()),
    }


def run(args: argparse.Namespace, folder: Path, work: Path, saved: Optional[dict] = None,
        estimate: Optional[checkpoints.MemoryEstimate] = None) -> dict:
    threads = torch.get_num_threads()         # the budget; the warm-up may keep fewer (``threads_used``)
    peak_since_load = reset_peak_rss()
    t_load = time.perf_counter()
    policy = load_policy(folder, device=args.device, dtype=args.dtype, pack_weights=not args.no_pack)
    load_s = time.perf_counter() - t_load
    progress(f"loaded in {load_s:.1f} s: {policy.describe()}")
    held = tensor_bytes(policy.model)
    policy.runtime.cuda_graphs = args.cuda_graphs
    policy.runtime.torch_compile = args.compile
    frame = checkpoints.CAMERA_FRAME.get(args.config) if not args.checkpoint else None
    frame = frame or policy.preprocessor.image_size
    obs, noise_np = make_observation(policy, frame, args.seed, args.batch)
    inputs_path = work / "inputs.safetensors"
    inputs = worker_inputs(policy, obs, noise_np, inputs_path).to(policy.device, policy.dtype)
    noise = torch.from_numpy(noise_np)
    cuda = policy.device.type == "cuda"

    lerobot: dict = {"available": False}
    worker: Optional[LeRobotWorker] = None
    if args.no_lerobot:
        lerobot["reason"] = "disabled (--no-lerobot)"
    elif not LEROBOT_PYTHON.exists():
        lerobot["reason"] = f"{LEROBOT_PYTHON} not found; make it with `make lerobot-env` (see BENCHMARKS.md)"
    elif cuda:
        lerobot["reason"] = "the LeRobot comparison runs on the CPU only"
    elif policy.family in PI_FAMILIES and (blocker := lerobot_pi_blocker()):
        lerobot["reason"] = blocker
    elif blocker := lerobot_memory_blocker(folder):
        lerobot["reason"] = blocker
    else:
        progress("starting the LeRobot worker")
        try:
            worker = LeRobotWorker(folder, inputs_path, args.threads or torch.get_num_threads(),
                                   work / "lerobot_worker.log")
            lerobot.update(available=True, torch=worker.info["torch"], load_s=worker.info["load_s"],
                           not_in_checkpoint=worker.info["not_in_checkpoint"])
        except (RuntimeError, OSError, json.JSONDecodeError) as exc:
            lerobot["reason"] = f"worker failed: {exc}"

    try:
        if worker is not None:
            theirs = load_file(str(Path(worker.request(f"actions {work / 'lerobot_actions.safetensors'}")["saved"])))
            ours = policy.runtime.sample(inputs, noise)[..., :policy.action_dim].float().cpu()
            lerobot["max_abs_diff"] = float((ours - theirs["actions"]).abs().max())
            lerobot["max_abs_action"] = float(theirs["actions"].abs().max())
            ours_raw = torch.as_tensor(policy.predict_action_chunk(obs, noise=noise_np)).float().reshape(
                theirs["pipeline_actions"].shape)
            lerobot["pipeline_max_abs_diff"] = float((ours_raw - theirs["pipeline_actions"]).abs().max())

        policy.warmup(obs)                    # as the node does: compiled/eager and thread-count races
        for i in range(args.warmup):
            policy.predict_action_chunk(obs, noise=noise_np)
            if worker is not None:
                worker.request("run")
            progress(f"warm-up {i + 1}/{args.warmup}")
        if cuda:
            torch.cuda.reset_peak_memory_stats(policy.device)
        steps = StepTimer(policy)
        samples: dict[str, list[float]] = {s: [] for s in STAGES if s != "denoise_step"}
        theirs_s: list[float] = []
        pipeline_s: list[float] = []          # LeRobot's pre-processor + predict_action_chunk + post-processor
        rss_start, peak_load = rss_mib(), peak_rss_mib()
        reset_peak_rss()
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
        rss_end, peak_run = rss_mib(), peak_rss_mib()
        stages = {s: summarize(v) for s, v in samples.items()}
        stages["denoise_step"] = summarize(steps.samples) if steps.samples else {
            **{k: v / policy.num_steps for k, v in stages["denoise"].items() if k != "n"}, "n": 0}
        if theirs_s:
            ours_total = np.asarray(samples["total"])
            pairs = np.asarray(theirs_s) / ours_total
            lerobot.update(**summarize(theirs_s), speedup=float(np.median(pairs)),
                           speedup_of_medians=float(np.median(theirs_s) / np.median(ours_total)),
                           pipeline=summarize(pipeline_s),
                           pipeline_speedup=float(np.median(np.asarray(pipeline_s) / ours_total)))
        naive = naive_ratio(policy, inputs, noise, args.naive_iters, stages) if args.naive_iters else None
        read_per_step = step_bytes(policy, inputs, noise)
    finally:
        if worker is not None:
            worker.close()

    memory = {"peak_rss_load_mib": peak_load, "peak_rss_mib": peak_run if peak_since_load else peak_rss_mib(),
              "peak_counted_from": "timed run" if peak_since_load else "process start",
              "rss_start_mib": rss_start, "rss_end_mib": rss_end,
              "cuda_peak_mib": torch.cuda.max_memory_allocated(policy.device) / 2**20 if cuda else None,
              "weights_mib": held["weights"] / 2**20, "packed_mib": held["packed"] / 2**20,
              "estimate": estimate.as_dict() if estimate is not None else None}
    model = policy.model
    prefix_tokens = policy.runtime.cache.seq_length() or prefix_length(policy, inputs)   # graphs keep their own
    return {
        "config": {"name": args.checkpoint or args.config, "family": policy.family, "cameras": len(policy.camera_names),
                   "batch": args.batch, "padding": policy.preprocessor.padding,
                   "prompt_tokens": int(inputs.tokens.shape[1]),
                   "prompt_tokens_used": int(inputs.token_mask.bool().any(0).sum()),   # eager code skips the rest
                   "device": str(policy.device), "dtype": args.dtype, "threads": threads,
                   "threads_used": policy.threads or threads, "threads_report": policy.threads_report,
                   "compiled": policy.runtime.torch_compile, "compile_report": policy.compile_report,
                   "cuda_graphs": bool(policy.runtime.cuda_graphs_active), "compile": args.compile,
                   "iters": args.iters,
                   "warmup": args.warmup, "num_steps": policy.num_steps, "chunk_size": policy.chunk_size,
                   "prefix_tokens": prefix_tokens,
                   "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
                   "camera_frame_hw": list(frame), "packed_weights": not args.no_pack,
                   "load_s": load_s, "checkpoint": saved},
        "machine": {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(policy.device) if cuda else None},
        "stages": stages, "memory": memory, "naive": naive, "lerobot": lerobot, "step_bytes": read_per_step,
    }


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


def dds_table(result: dict) -> str:
    c, r = result["config"], result["dds"]
    head = (f"vla-policy-bench --dds: {c['name']}, {c['cameras']} camera(s) {c['camera_frame_hw']}, {c['dtype']}"
            + (", compiled" if r.get("compile") else ""))
    if "frame_to_command" not in r:
        return f"{head}\nnot measured: {r.get('reason', 'no command received')}"
    f = r["frame_to_command"]
    return (f"{head}, node at {r['control_rate_hz']:.0f} Hz, ROS_DOMAIN_ID {r['domain_id']}, localhost only\n"
            f"frame -> command: median {f['median_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms, "
            f"max {f['max_ms']:.1f} ms ({f['n']} episodes; {r['frames_without_command_within_a_period']} "
            f"camera periods passed with no command)\n"
            f"node observation -> chunk p50 {r['node_total_p50_ms']:.1f} ms; "
            f"ROS overhead {r['ros_overhead_ms']:.1f} ms "
            f"(target < {r['target_ms']:.1f} ms = 5% of the policy time + 2 ms)")


def table(result: dict) -> str:
    c, m, s = result["config"], result["memory"], result["stages"]
    lines = [f"vla-policy-bench: {c['name']} ({c['family']}, {c['params_m']:.1f} M params), {c['cameras']} camera(s), "
             f"batch {c['batch']}, '{c['padding']}' padding ({c['prompt_tokens']} prompt tokens, "
             f"{c['prompt_tokens_used']} used), "
             f"{c['device']} {c['dtype']}, {c['threads']} threads ({c['threads_used']} used), "
             f"{c['prefix_tokens']} prefix tokens, "
             f"{c['num_steps']} steps, chunk {c['chunk_size']}, {c['iters']} iterations after {c['warmup']} warm-up",
             *(report for report in (c["compile_report"], c["threads_report"]) if report),
             f"{'stage':<22}{'median ms':>12}{'p95 ms':>12}{'max ms':>12}"]
    names = {"denoise_step": "denoise step (each)", "denoise": f"denoise ({c['num_steps']} steps)"}
    for stage in STAGES:
        st = s[stage]
        lines.append(f"{names.get(stage, stage):<22}{st['median_ms']:>12.2f}{st['p95_ms']:>12.2f}{st['max_ms']:>12.2f}")
    mem = (f"peak RSS {m['peak_rss_mib']:.0f} MiB over the {m['peak_counted_from']} (RSS {m['rss_start_mib']:.0f} -> "
           f"{m['rss_end_mib']:.0f} MiB; {m['peak_rss_load_mib']:.0f} MiB while loading, mapped weights file included)")
    if m["cuda_peak_mib"] is not None:
        mem += f", CUDA peak {m['cuda_peak_mib']:.0f} MiB"
    lines.append(mem)
    held = f"weights held {m['weights_mib'] / 1024:.2f} GiB + oneDNN-packed copies {m['packed_mib'] / 1024:.2f} GiB"
    est = m.get("estimate")
    if est:
        held += (f" (estimated {est['weights_gib']:.2f} + {est['packed_gib']:.2f} GiB; "
                 f"estimated host peak {est['host_peak_gib']:.1f} GiB)")
    lines.append(held)
    saved = c.get("checkpoint")
    if saved:
        lines.append(f"random checkpoint: {saved['params_in_file'] / 1e6:.1f} M params in the file, {saved['dtype']}, "
                     f"{saved['file_bytes'] / 2**30:.2f} GiB; build + init {saved['build_s']:.1f} s, "
                     f"save {saved['save_s']:.1f} s; load_policy {c['load_s']:.1f} s")
    else:
        lines.append(f"load_policy {c['load_s']:.1f} s")
    n = result["naive"]
    if n:
        lines.append(f"naive path (prefix every step): {n['naive']['median_ms']:.1f} ms vs cached "
                     f"{n['cached']['median_ms']:.1f} ms -> ratio {n['ratio']:.2f} "
                     f"(theoretical {n['theoretical_ratio']:.2f} "
                     f"from FLOPs, {n['expected_ratio_from_stage_medians']:.2f} from stage medians); "
                     f"max |diff| {n['max_abs_diff']:.1e}")
    lr = result["lerobot"]
    if lr.get("available") and "speedup" in lr:
        lines.append(f"LeRobot {lr['torch']} predict_action_chunk (float32): median {lr['median_ms']:.1f} ms, "
                     f"p95 {lr['p95_ms']:.1f} ms -> ours is {lr['speedup']:.2f}x faster (paired median; "
                     f"{lr['speedup_of_medians']:.2f}x of medians); max |action diff| {lr['max_abs_diff']:.1e}, "
                     f"peak RSS {lr['peak_rss_mib']:.0f} MiB")
        pl = lr["pipeline"]
        lines.append(f"LeRobot pre-processor + predict_action_chunk + post-processor: median {pl['median_ms']:.1f} ms "
                     f"-> ours is {lr['pipeline_speedup']:.2f}x faster (paired median, same raw observation); "
                     f"max |action diff| {lr['pipeline_max_abs_diff']:.1e}")
    else:
        lines.append(f"LeRobot: not measured: {lr.get('reason', 'no iterations')}")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vla-policy-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="?", default="tiny", choices=checkpoints.CONFIG_NAMES,
                   help="random-weight configuration at real dimensions (ignored with --checkpoint)")
    p.add_argument("--checkpoint", type=Path, help="benchmark this LeRobot checkpoint folder instead")
    p.add_argument("--cameras", type=int, default=1, help="1..3 (named configurations)")
    p.add_argument("--batch", type=int, default=1, help="observations per chunk request (rows of different prompts)")
    p.add_argument("--padding", choices=["max_length", "longest"], default="max_length",
                   help="prompt padding the random checkpoint's pre-processor records (named configurations)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="run dtype; pi0's random checkpoint is also saved in it")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3,
                   help="with LeRobot: blocks of ours and LeRobot's chunks, alternated this many times "
                        "(--iters is rounded up to a multiple)")
    p.add_argument("--naive-iters", type=int, default=3, help="cached/naive pairs (0 skips the naive ratio)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay the prefix pass and the denoising loop as CUDA graphs (CUDA only)")
    p.add_argument("--compile", action="store_true",
                   help="compile the prefix pass and the denoising loop ahead of time (AOTInductor, in the warm-up)")
    p.add_argument("--no-lerobot", action="store_true", help="skip the LeRobot comparison")
    p.add_argument("--no-pack", action="store_true",
                   help="CPU: keep no oneDNN-packed weight copies (half the memory, slower float32 matmuls)")
    p.add_argument("--no-memory-check", action="store_true",
                   help="run even when the RAM estimate exceeds MemAvailable")
    p.add_argument("--dds", action="store_true",
                   help="measure the installed node over DDS on localhost instead: frame published -> command received")
    p.add_argument("--control-rate", type=float, default=500.0, help="--dds: the node's control_rate_hz")
    p.add_argument("--seed", type=int, default=0)
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
        estimate = checkpoints.memory_estimate(args.config, args.cameras, args.dtype, args.device, not args.no_pack)
        progress(f"{args.config}: about {estimate.host_peak / 2**30:.1f} GiB of RAM at the peak, "
                 f"{available_memory_bytes() / 2**30:.1f} GiB available")
        problem = None if args.no_memory_check else memory_check(estimate, args)
        if problem:
            print(f"vla-policy-bench: not run: {problem}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="vla-policy-bench-") as tmp:
        work = Path(tmp)
        if args.checkpoint:
            folder = args.checkpoint.resolve()
        else:
            progress(f"writing a random-weight {args.config} checkpoint ({args.cameras} camera(s))")
            saved = {}
            folder = checkpoints.save_random_checkpoint(work / "checkpoint", args.config, args.cameras, args.seed,
                                                        args.dtype, saved, args.padding)
            progress(f"checkpoint written: build + init {saved['build_s']:.1f} s, save {saved['save_s']:.1f} s, "
                     f"{saved['file_bytes'] / 2**30:.2f} GiB")
        result = run_dds(args, folder) if args.dds else run(args, folder, work, saved, estimate)
    print(dds_table(result) if args.dds else table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
