# SPDX-License-Identifier: Apache-2.0
"""
One dtype's chunk time under two code revisions (or two environments), chunks alternating.

Each side is its own process holding the same random checkpoint, observation and noise; they
take turns, one chunk each per round, so the drift of a shared machine falls on both. Prints
the medians, the median of the per-round ratios and the largest action difference between
the sides relative to the largest action of side A.

    python -m benchmarks.revision_pair --base HEAD~3 --dtype int8 --rounds 10
    python -m benchmarks.revision_pair --dtype int8 --env-b OMP_WAIT_POLICY=PASSIVE
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# Run with -c from the side's tree, so that its vla_policy_node (sys.path[0] = cwd) is the one imported.
WORKER = """
import sys, tempfile, time
from pathlib import Path
import numpy as np, torch
from vla_policy_node.bench import checkpoints
from vla_policy_node.bench.measure import make_observation
from vla_policy_node.loading import load_policy
config, dtype, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(threads)
with tempfile.TemporaryDirectory() as tmp:
    folder = checkpoints.save_random_checkpoint(Path(tmp) / "c", config, 1, 0, "float32", {})
    policy = load_policy(folder, device="cpu", dtype=dtype)
obs, noise = make_observation(policy, checkpoints.CAMERA_FRAME[config], 0)
out = policy.predict_action_chunk(obs, noise=noise)
print("ready", flush=True)
for line in sys.stdin:
    if line.startswith("run"):
        t0 = time.perf_counter()
        out = policy.predict_action_chunk(obs, noise=noise)
        print(time.perf_counter() - t0, flush=True)
    else:
        np.save(line.strip(), out)
        print("saved", flush=True)
"""


def start(tree: Path, args: argparse.Namespace, env_extra: list[str]) -> subprocess.Popen:
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in env_extra))
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen([sys.executable, "-c", WORKER, args.config, args.dtype, str(args.threads)], cwd=tree,
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"the worker in {tree} did not start")
    return proc


def ask(proc: subprocess.Popen, line: str) -> str:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def main(argv: list[str] | None = None) -> int:
    """Start both sides, alternate chunks, print the figures."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.revision_pair", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", help="git revision of side A (default: this tree, as side B)")
    p.add_argument("--config", default="smolvla")
    p.add_argument("--dtype", default="int8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--env-a", nargs="*", default=[], metavar="NAME=VALUE")
    p.add_argument("--env-b", nargs="*", default=[], metavar="NAME=VALUE")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vla-revision-pair-") as tmp:
        tree_a = REPO
        if args.base:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.base, "vla_policy_node"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            tree_a = Path(tmp)
        sides = {"a": start(tree_a, args, args.env_a), "b": start(REPO, args, args.env_b)}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name, proc in sides.items():
                times[name].append(float(ask(proc, "run")))
            print(f"round {r + 1}/{args.rounds}: a {1e3 * times['a'][-1]:.0f} ms, b {1e3 * times['b'][-1]:.0f} ms",
                  file=sys.stderr, flush=True)
        actions = {}
        for name, proc in sides.items():
            ask(proc, str(Path(tmp) / f"{name}.npy"))
            actions[name] = np.load(Path(tmp) / f"{name}.npy")
            proc.stdin.close()
            proc.wait()
    a, b = np.asarray(times["a"]), np.asarray(times["b"])
    print(json.dumps({"a": args.base or "this tree", "b": "this tree", "env_a": args.env_a, "env_b": args.env_b,
                      "config": args.config, "dtype": args.dtype, "threads": args.threads, "rounds": args.rounds,
                      "a_median_ms": 1e3 * float(np.median(a)), "b_median_ms": 1e3 * float(np.median(b)),
                      "b_speedup_paired": float(statistics.median(a / b)),
                      "max_action_diff_relative": float(np.abs(actions["b"] - actions["a"]).max()
                                                        / np.abs(actions["a"]).max())}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
