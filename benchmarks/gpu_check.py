# SPDX-License-Identifier: Apache-2.0
"""
``make gpu-check``: the CUDA tests and the GPU benchmarks in one run (under 5 minutes), then one table of the goals.

Runs, each in its own process (so each starts with an empty GPU): the CUDA tests of
``test/runtime/test_fast_paths.py``; ``vla-policy-bench smolvla`` in float32 and bfloat16, with
and without CUDA graphs; ``pi0`` in bfloat16 with CUDA graphs, with 1 and 3 cameras.
It needs only torch, numpy, safetensors, tokenizers and pytest (no ROS), so it runs with
a GPU machine's own Python (``make gpu-check`` uses ``python3`` when there is no venv).
Then it prints the goals of an H200-class GPU: SmolVLA at most 5 ms per chunk, pi0 with
one camera at most 15 ms, and every denoising step within 2x of its memory-bandwidth
floor (the bytes a step must read, the weights it multiplies by and the prefix K/V it
attends to, divided by the GPU's memory bandwidth). Without CUDA it stops at once with
the reason (exit code 2).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 300.0
# Peak memory bandwidth (GB/s) of GPUs by name, from their data sheets; others are measured.
PEAK_BANDWIDTH_GBS = {"H200": 4800.0, "H100 NVL": 3900.0, "H100 SXM": 3350.0, "H100 PCIe": 2000.0, "H100": 3350.0,
                      "A100-SXM4-80GB": 2039.0, "A100 80GB PCIe": 1935.0, "A100": 1555.0, "L40S": 864.0, "L4": 300.0,
                      "RTX 4090": 1008.0, "A10G": 600.0}
SMOLVLA_GOAL_MS = 5.0
PI0_GOAL_MS = 15.0
FLOOR_FACTOR = 2.0


@dataclass(frozen=True)
class Run:
    """One benchmark of the check: a name and the ``vla-policy-bench`` arguments."""

    name: str
    args: tuple[str, ...]


def runs() -> list[Run]:
    """List the benchmarks, those the goals are read from first: a budget cut drops the others."""
    def smolvla(dtype: str, graphs: bool) -> Run:
        return Run(f"smolvla {dtype}{', CUDA graphs' if graphs else ''}",
                   ("smolvla", "--dtype", dtype, *(("--cuda-graphs",) if graphs else ()),
                    "--iters", "20", "--warmup", "3", "--naive-iters", "0"))

    def pi0(cameras: int) -> Run:
        return Run(f"pi0 bfloat16, CUDA graphs, {cameras} camera{'s' if cameras > 1 else ''}",
                   ("pi0", "--dtype", "bfloat16", "--cuda-graphs", "--cameras", str(cameras),
                    "--iters", "10", "--warmup", "2", "--naive-iters", "0"))
    return [smolvla("bfloat16", True), pi0(1), smolvla("float32", True), smolvla("bfloat16", False),
            smolvla("float32", False), pi0(3)]


def peak_bandwidth_gbs(gpu_name: str) -> Optional[float]:
    """Data-sheet bandwidth of a GPU named like ``NVIDIA H200``, or None when unknown."""
    for key in sorted(PEAK_BANDWIDTH_GBS, key=len, reverse=True):     # the most specific name first
        if key.lower() in gpu_name.lower():
            return PEAK_BANDWIDTH_GBS[key]
    return None


def floor_ms(step_bytes: dict, bandwidth_gbs: float) -> float:
    """Time a denoising step needs at least to read its weights and the prefix K/V once, in ms."""
    if bandwidth_gbs <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_gbs}")
    return (step_bytes["weights"] + step_bytes["kv_cache"]) / (bandwidth_gbs * 1e9) * 1e3


def goals(result: dict, bandwidth_gbs: float) -> list[tuple[str, float, float, bool]]:
    """(goal, measured ms, limit ms, met) for one benchmark result."""
    c, s = result["config"], result["stages"]
    total, step = s["total"]["median_ms"], s["denoise_step"]["median_ms"]
    out = []
    if c["family"] == "smolvla" and c["dtype"] == "bfloat16" and c["cuda_graphs"]:
        out.append(("SmolVLA chunk <= 5 ms", total, SMOLVLA_GOAL_MS, total <= SMOLVLA_GOAL_MS))
    if c["family"] == "pi0" and c["cameras"] == 1:
        out.append(("pi0, 1 camera, chunk <= 15 ms", total, PI0_GOAL_MS, total <= PI0_GOAL_MS))
    limit = FLOOR_FACTOR * floor_ms(result["step_bytes"], bandwidth_gbs)
    out.append(("denoise step <= 2x bandwidth floor", step, limit, step <= limit))
    return out


def table(results: dict[str, Optional[dict]], gpu: str, bandwidth_gbs: float, bandwidth_source: str) -> str:
    """One table: per run the stage medians, the bandwidth floor and each goal, met or not."""
    lines = [f"gpu-check on {gpu}: memory bandwidth {bandwidth_gbs:.0f} GB/s ({bandwidth_source})",
             "| run | prefix ms | step ms | step floor ms | total ms | goal | status |",
             "|---|---|---|---|---|---|---|"]
    met_all = True
    for name, result in results.items():
        if result is None:
            lines.append(f"| {name} | | | | | | **not run** |")
            met_all = False
            continue
        s = result["stages"]
        floor = floor_ms(result["step_bytes"], bandwidth_gbs)
        for i, (goal, measured, limit, met) in enumerate(goals(result, bandwidth_gbs)):
            head = (f"| {name} | {s['prefix']['median_ms']:.2f} | {s['denoise_step']['median_ms']:.3f} | {floor:.3f} "
                    f"| {s['total']['median_ms']:.2f} " if i == 0 else "| | | | | ")
            lines.append(f"{head}| {goal} ({measured:.2f} vs {limit:.2f}) | {'met' if met else '**missed**'} |")
            met_all &= met
    lines.append("all goals met" if met_all else "some goals missed or runs missing (see above)")
    return "\n".join(lines)


def measured_bandwidth_gbs() -> float:
    """Device-to-device copy bandwidth (read + write bytes per second) of 1 GiB, best of 5."""
    import torch

    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * src.element_size() / best / 1e9


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "gpu-check", help="folder for the JSON of each run")
    parser.add_argument("--budget", type=float, default=BUDGET_S,
                        help="seconds for the tests and all runs; a run that would pass it is stopped")
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error(f"--budget must be positive, got {args.budget}")
    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA GPU (torch {torch.__version__}, built for CUDA {torch.version.cuda}): "
              "it needs a machine with a GPU and a CUDA build of torch (GPU_PYTHON=... make gpu-check)",
              file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name(0)
    peak = peak_bandwidth_gbs(gpu)
    bandwidth, source = (peak, "data sheet") if peak else (measured_bandwidth_gbs(), "measured copy")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    try:
        fast_paths = REPO / "test" / "runtime" / "test_fast_paths.py"
        tests_rc = subprocess.run([sys.executable, "-m", "pytest", str(fast_paths), "-q", "-k", "cuda"],
                                  cwd=REPO, env=env, timeout=args.budget / 3).returncode
        tests = "passed" if tests_rc == 0 else f"FAILED (exit {tests_rc})"
    except subprocess.TimeoutExpired:
        tests_rc, tests = 1, f"stopped after {args.budget / 3:.0f} s, a third of the budget"
    results: dict[str, Optional[dict]] = {}
    for run in runs():
        left = args.budget - (time.perf_counter() - start)
        path = args.out / (run.name.replace(", ", "_").replace(" ", "_") + ".json")
        results[run.name] = None
        if left < 10:
            print(f"gpu-check: {run.name}: skipped, the {args.budget:.0f} s budget is spent", file=sys.stderr)
            continue
        # A GPU machine has ample RAM, but its MemAvailable can start low and grow: the bench's
        # host-RAM estimate must not refuse these runs.
        command = [sys.executable, "-m", "vla_policy_node.bench.cli", *run.args, "--device", "cuda",
                   "--no-lerobot", "--no-memory-check", "--json", str(path)]
        try:
            done = subprocess.run(command, cwd=REPO, env=env, timeout=left)
        except subprocess.TimeoutExpired:
            print(f"gpu-check: {run.name}: stopped at the {args.budget:.0f} s budget", file=sys.stderr)
            continue
        if done.returncode == 0 and path.exists():
            results[run.name] = json.loads(path.read_text())
    print(f"CUDA tests: {tests}")
    print(table(results, gpu, bandwidth, source))
    print(f"gpu-check took {time.perf_counter() - start:.0f} s; JSON in {args.out}")
    return 0 if tests_rc == 0 and all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
