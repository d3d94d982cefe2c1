# SPDX-License-Identifier: Apache-2.0
"""
One OpenMP team or two: the chunk on an inference thread while the loading thread's team lives or is released.

The node loads and warms up its policy on one thread and runs it on another
(``runtime.openmp``). Each round runs one chunk on a worker thread with the loading
(main) thread's team alive (a parallel op on the main thread builds it again) and one
after ``release_thread_team`` ended it; voluntary context switches show libgomp's
threads sleeping between parallel regions.

    python -m benchmarks.openmp_teams --dtype int8 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from vla_policy_node.bench import checkpoints
from vla_policy_node.bench.measure import make_observation
from vla_policy_node.loading import load_policy
from vla_policy_node.runtime.openmp import release_thread_team


def main(argv: list[str] | None = None) -> int:
    """Load on the main thread, alternate the two cases on one worker thread, print medians."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.openmp_teams", description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="?", default="smolvla", choices=checkpoints.CONFIG_NAMES)
    p.add_argument("--dtype", default="int8", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="vla-openmp-teams-") as tmp:
        folder = checkpoints.save_random_checkpoint(Path(tmp) / "checkpoint", args.config, 1, 0, "float32", {})
        policy = load_policy(folder, device="cpu", dtype=args.dtype)
    obs, noise = make_observation(policy, checkpoints.CAMERA_FRAME[args.config], 0)
    policy.predict_action_chunk(obs, noise=noise)
    figures: dict[str, list[tuple[float, int]]] = {"two teams": [], "one team": []}

    def chunk(case: str) -> None:
        before, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw, time.perf_counter()
        policy.predict_action_chunk(obs, noise=noise)
        figures[case].append((time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - before))

    for _ in range(args.rounds + 1):                    # the first round is not counted (warm-up)
        for case in figures:
            if case == "two teams":
                torch.ones(1 << 22).add_(1)             # the main thread's team, as after loading
            else:
                release_thread_team()
            worker = threading.Thread(target=chunk, args=(case,))
            worker.start()
            worker.join()
    result = {case: {"median_s": float(np.median([s for s, _ in runs[1:]])),
                     "voluntary_switches_median": int(np.median([n for _, n in runs[1:]]))}
              for case, runs in figures.items()}
    print(json.dumps({"config": args.config, "dtype": args.dtype, "threads": args.threads, **result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
