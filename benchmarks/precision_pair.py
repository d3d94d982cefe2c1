# SPDX-License-Identifier: Apache-2.0
"""
float32 against int8 (``dtype: int8``) on one random checkpoint, chunks alternating in one process.

Paired chunks cancel the drift of a shared machine; each round runs one float32 and one int8
chunk on the same observation and noise, and reports the medians, the median of the per-round
ratios and the largest action difference relative to the largest float32 action.

    python -m benchmarks.precision_pair smolvla --threads 2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from vla_policy_node.bench import checkpoints
from vla_policy_node.bench.measure import make_observation, progress
from vla_policy_node.loading import load_policy


def main(argv: list[str] | None = None) -> int:
    """Load the checkpoint twice, alternate chunks, print the figures."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.precision_pair", description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="?", default="smolvla", choices=checkpoints.CONFIG_NAMES)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="vla-precision-pair-") as tmp:
        folder = checkpoints.save_random_checkpoint(Path(tmp) / "checkpoint", args.config, 1, 0, "float32", {})
        policies = {dtype: load_policy(folder, device="cpu", dtype=dtype) for dtype in ("float32", "int8")}
    frame = checkpoints.CAMERA_FRAME[args.config]
    obs, noise = make_observation(policies["float32"], frame, 0)
    actions = {dtype: policy.predict_action_chunk(obs, noise=noise) for dtype, policy in policies.items()}  # warm
    times: dict[str, list[float]] = {dtype: [] for dtype in policies}
    for r in range(args.rounds):
        for dtype, policy in policies.items():
            t0 = time.perf_counter()
            policy.predict_action_chunk(obs, noise=noise)
            times[dtype].append(time.perf_counter() - t0)
        progress(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{d} {1e3 * t[-1]:.0f} ms" for d, t in times.items()))
    f32, int8 = np.asarray(times["float32"]), np.asarray(times["int8"])
    result = {"config": args.config, "threads": args.threads, "rounds": args.rounds,
              "float32_median_ms": 1e3 * float(np.median(f32)), "int8_median_ms": 1e3 * float(np.median(int8)),
              "int8_speedup_paired": float(np.median(f32 / int8)), "float32_s": f32.tolist(), "int8_s": int8.tolist(),
              "max_action_diff_relative": float(np.abs(actions["int8"] - actions["float32"]).max()
                                                / np.abs(actions["float32"]).max())}
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_s")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
