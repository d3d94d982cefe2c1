# SPDX-License-Identifier: Apache-2.0
"""
LeRobot 0.4.4's own ``predict_action_chunk``, driven by ``vla-policy-bench`` over a pipe.

Runs with ``.venv-lerobot/bin/python`` (LeRobot pins its own torch), inside the
checkpoint folder (LeRobot resolves ``vlm_model_name`` against the working
directory), offline. Standalone on purpose: it imports nothing from this package.

Protocol, one JSON object per line: the worker answers ``{"ready": ...}`` once
loaded; then for each request line ``run`` it runs LeRobot's whole path on the raw
observation (its saved pre-processor, ``predict_action_chunk``, its post-processor)
and answers ``{"seconds": s, "pipeline_seconds": p}``: s times ``predict_action_chunk``
alone, p the whole path. ``actions PATH`` saves both outputs to PATH (safetensors
``actions``: normalized, from ``predict_action_chunk`` on the bench's own tokens;
``pipeline_actions``: unnormalized, from the whole path), and ``quit`` ends it.
LeRobot's own prints go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("inputs", help="safetensors written by the bench")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()

    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                                   # library prints must not corrupt the protocol

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    with open(os.path.join(args.checkpoint, "config.json")) as f:
        policy_type = json.load(f)["type"]
    policy = get_policy_class(policy_type).from_pretrained(args.checkpoint, strict=False).eval()
    preprocessor, postprocessor = make_pre_post_processors(policy.config, pretrained_path=args.checkpoint)
    saved = set(load_file(os.path.join(args.checkpoint, "model.safetensors")).keys())
    expected = set(policy.state_dict().keys())
    inputs = load_file(args.inputs)
    batch = {k[len("batch."):]: v for k, v in inputs.items() if k.startswith("batch.")}
    raw = {k[len("raw."):]: v for k, v in inputs.items() if k.startswith("raw.")}
    with safe_open(args.inputs, "pt") as f:
        raw["task"] = json.loads(f.metadata()["tasks"])
    noise = inputs["noise"]
    protocol.write(json.dumps({
        "ready": True, "type": policy_type, "load_s": time.perf_counter() - t0, "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "not_in_checkpoint": sorted(expected - saved), "unexpected": sorted(saved - expected)}) + "\n")

    def chunk() -> torch.Tensor:
        policy.reset()
        return policy.predict_action_chunk(dict(batch), noise=noise.clone())

    def pipeline() -> tuple[torch.Tensor, float, float]:
        """Raw observation -> actions as a LeRobot user runs it; returns the actions and both times."""
        t0 = time.perf_counter()
        model_batch = preprocessor(dict(raw))
        policy.reset()
        t1 = time.perf_counter()
        actions = policy.predict_action_chunk(model_batch, noise=noise.clone())
        t2 = time.perf_counter()
        actions = postprocessor(actions)
        return actions, t2 - t1, time.perf_counter() - t0

    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "run":
            _, predict_s, pipeline_s = pipeline()
            reply = {"seconds": predict_s, "pipeline_seconds": pipeline_s}
        elif cmd == "actions":
            save_file({"actions": chunk().float().contiguous(),
                       "pipeline_actions": pipeline()[0].float().contiguous()}, arg)
            reply = {"saved": arg}
        elif cmd == "quit":
            break
        else:
            reply = {"error": f"unknown command {cmd!r}"}
        reply["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        protocol.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
