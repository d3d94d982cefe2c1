# SPDX-License-Identifier: Apache-2.0
"""
Traced against Python eager chunks (the node's ``trace`` parameter), alternating in one process.

Two policies load the same random checkpoint; one is warmed up with traces (``RuntimeConfig.trace``),
one without. Each round runs one chunk of each on the same observation and noise; the figures
are medians, the median of the per-round ratios, and the largest action difference relative to
the largest action (the traced prompt is padded to its bucket). ``--beside`` repeats the rounds
next to the closed loop's co-runners in miniature: a Python thread of this process busy 11% of a
core in 0.55 ms bursts (the node's executor, which wants the GIL) and a process busy 22% of a
core in 7 ms bursts at 30 Hz (the simulator).

    python -m benchmarks.traced_pair smolvla --dtype int8 --rounds 9 --beside
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from vla_policy_node.bench import checkpoints
from vla_policy_node.bench.measure import make_observation, progress, publish
from vla_policy_node.loading import load_policy
from vla_policy_node.runtime.engine import RuntimeConfig

BUSY_PROCESS = ("import time\nwhile True:\n    t = time.perf_counter()\n"
                "    while time.perf_counter() - t < {busy}: pass\n    time.sleep({idle})\n")


def busy_thread(stop: threading.Event, duty: float = 0.11, period: float = 0.005) -> None:
    """Hold the GIL ``duty`` of each ``period`` seconds, as an executor thread's callbacks do."""
    while not stop.is_set():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < duty * period:
            pass
        time.sleep(period * (1 - duty))


def rounds(policies: dict, obs: dict, noise: np.ndarray, count: int, label: str) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in policies}
    for r in range(count):
        for name, policy in policies.items():
            t0 = time.perf_counter()
            policy.predict_action_chunk(obs, noise=noise)
            times[name].append(time.perf_counter() - t0)
        progress(f"{label} round {r + 1}/{count}: " + ", ".join(f"{n} {1e3 * t[-1]:.0f} ms" for n, t in times.items()))
    return times


def summary(times: dict[str, list[float]]) -> dict:
    traced, python = np.asarray(times["traced"]), np.asarray(times["python"])
    return {"traced_median_ms": 1e3 * float(np.median(traced)), "python_median_ms": 1e3 * float(np.median(python)),
            "traced_speedup_paired": float(np.median(python / traced))}


def main(argv: list[str] | None = None) -> int:
    """Load the checkpoint twice, warm both up, alternate chunks (alone, then beside the co-runners), print."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.traced_pair", description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="?", default="smolvla", choices=checkpoints.CONFIG_NAMES)
    p.add_argument("--dtype", default="int8", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--beside", action="store_true", help="also run the rounds beside the miniature co-runners")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.setswitchinterval(0.0005)                     # as the node's process (ros.process)
    with tempfile.TemporaryDirectory(prefix="vla-traced-pair-") as tmp:
        folder = checkpoints.save_random_checkpoint(Path(tmp) / "checkpoint", args.config, 1, 0, "float32", {})
        policies = {name: load_policy(folder, device="cpu", dtype=args.dtype) for name in ("traced", "python")}
    for name, policy in policies.items():
        policy.runtime.configure(RuntimeConfig(trace=name == "traced"))
        t0 = time.perf_counter()
        policy.warmup(policy.dummy_observation())
        progress(f"{name}: warm-up {time.perf_counter() - t0:.1f} s, {len(policy.runtime.traces.signatures)} traces "
                 f"{policy.runtime.traces.report}")
    obs, noise = make_observation(policies["python"], checkpoints.CAMERA_FRAME[args.config], 0)
    actions = {name: policy.predict_action_chunk(obs, noise=noise) for name, policy in policies.items()}
    result = {"config": args.config, "dtype": args.dtype, "threads": args.threads, "rounds": args.rounds,
              "traces": len(policies["traced"].runtime.traces.signatures),
              "max_action_diff_relative": float(np.abs(actions["traced"] - actions["python"]).max()
                                                / np.abs(actions["python"]).max()),
              "alone": summary(rounds(policies, obs, noise, args.rounds, "alone"))}
    if args.beside:
        stop = threading.Event()
        thread = threading.Thread(target=busy_thread, args=(stop,), daemon=True)
        process = subprocess.Popen([sys.executable, "-c", BUSY_PROCESS.format(busy=0.22 / 30, idle=0.78 / 30)])
        thread.start()
        try:
            result["beside"] = summary(rounds(policies, obs, noise, args.rounds, "beside"))
        finally:
            stop.set()
            process.kill()
            process.wait()
            thread.join()
    publish(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
