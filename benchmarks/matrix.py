# SPDX-License-Identifier: Apache-2.0
"""
The overhead-bound matrix: eager and compiled against LeRobot over threads, batch, cameras and padding.

    python -m benchmarks.matrix --threads 1 2 --batch 1 2 4 --cameras 1 3 \
        --padding max_length longest --out /tmp/matrix

Each configuration runs ``vla-policy-bench tiny`` twice, eager then ``--compile``, each in
a fresh process with LeRobot's whole path (pre-processor, ``predict_action_chunk``,
post-processor) on the same raw observation and noise, in blocks alternating with ours
three times, each after an idle pause; the ratios are paired medians from within one
process. Prints one markdown table (BENCHMARKS.md) and
writes every run's JSON under ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path
import subprocess
import sys
import time


def bench(out: Path, threads: int, batch: int, cameras: int, padding: str, compiled: bool, iters: int) -> dict:
    """Run one bench process; returns its JSON."""
    name = f"t{threads}_b{batch}_c{cameras}_{padding}_{'compiled' if compiled else 'eager'}"
    path = out / f"{name}.json"
    cmd = [sys.executable, "-m", "vla_policy_node.bench.cli", "tiny", "--threads", str(threads), "--batch", str(batch),
           "--cameras", str(cameras), "--padding", padding, "--iters", str(iters), "--warmup", "3",
           "--naive-iters", "0", "--json", str(path)] + (["--compile"] if compiled else [])
    with open(out / f"{name}.log", "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
    result = json.loads(path.read_text())
    result["load_average"] = os.getloadavg()[0]
    return result


def row(eager: dict, compiled: dict) -> str:
    """One table row; LeRobot's time is the compiled run's, each ratio paired within its own process."""
    c = eager["config"]
    e_ms, c_ms = (r["stages"]["total"]["median_ms"] for r in (eager, compiled))
    le, lc = eager["lerobot"], compiled["lerobot"]
    if le.get("available") and lc.get("available"):
        lerobot = (f"{lc['pipeline']['median_ms']:.1f} | {le['pipeline_speedup']:.2f}x | "
                   f"**{lc['pipeline_speedup']:.2f}x** | "
                   f"{max(le['pipeline_max_abs_diff'], lc['pipeline_max_abs_diff']):.1e}")
    else:
        lerobot = "not measured | - | - | -"
    fewer = [f"{kind} ran {r['config']['threads_used']}" for kind, r in (("eager", eager), ("compiled", compiled))
             if r["config"].get("threads_used", c["threads"]) != c["threads"]]    # the warm-up's thread race
    threads = f"{c['threads']} ({', '.join(fewer)})" if fewer else f"{c['threads']}"
    used = c.get("prompt_tokens_used", c["prompt_tokens"])      # eager code skips padding no row uses
    tokens = f"{c['prompt_tokens']}" if used == c["prompt_tokens"] else f"{c['prompt_tokens']}, eager {used}"
    return (f"| {threads} | {c['batch']} | {c['cameras']} | {c['padding']} ({tokens}) "
            f"| {e_ms:.2f} | {c_ms:.2f} | {e_ms / c_ms:.2f}x | {lerobot} "
            f"| {eager['load_average']:.1f} / {compiled['load_average']:.1f} |")


HEADER = ("| threads | batch | cameras | padding (prompt tokens) | eager ms | compiled ms | compiled vs eager "
          "| LeRobot ms | eager vs LeRobot | compiled vs LeRobot | max action diff | 1-min load |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    """Run the product of the given axes and print the table."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.matrix", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--cameras", type=int, nargs="+", default=[1, 3])
    p.add_argument("--padding", nargs="+", default=["max_length", "longest"], choices=["max_length", "longest"])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", type=Path, required=True, help="folder for each run's JSON and log")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for threads, batch, cameras, padding in itertools.product(args.threads, args.batch, args.cameras, args.padding):
        t0 = time.monotonic()
        eager = bench(args.out, threads, batch, cameras, padding, False, args.iters)
        compiled = bench(args.out, threads, batch, cameras, padding, True, args.iters)
        rows.append(row(eager, compiled))
        print(rows[-1], f"  ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    print(HEADER)
    print("\n".join(rows))
    (args.out / "table.md").write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
