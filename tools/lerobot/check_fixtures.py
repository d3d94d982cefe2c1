#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Reload LeRobot fixture folders in fresh processes and check that they reproduce their stored tensors.

    .venv-lerobot061/bin/python tools/lerobot/check_fixtures.py test/fixtures/lerobot061
    .venv-lerobot061/bin/python tools/lerobot/check_fixtures.py /tmp/lerobot061_other --tol 0

For every folder (one subprocess each, cwd = the folder because the tokenizer / VLM directories are referenced by
relative names): ``<Policy>.from_pretrained(".")`` (after the tiny-size patches of tiny_dims.json for pi0/pi0.5),
both processor pipelines with ``PolicyProcessorPipeline.from_pretrained`` (via LeRobot's
``make_pre_post_processors(cfg, pretrained_path=".")``, which also re-links the relative/absolute action steps;
``--plain`` loads them directly and links by hand), then

    raw.* -> prepare_observation_for_inference -> pre-processor   == batch.*
    policy preprocessing (images, state)                          == model_input.*
    predict_action_chunk(batch, noise=noise)                      == action_chunk_normalized
    post-processor(action_chunk_normalized)                       == action_chunk

Exit status 0 only if every max abs diff is <= --tol (default 0: bit-exact).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def check_folder(folder: Path, plain: bool) -> dict[str, float]:
    from fixture_utils import (
        load_policy_and_processors,
        max_abs_diff,
        model_inputs,
        raw_to_policy_batch,
        set_offline_env,
    )

    set_offline_env()
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    os.chdir(folder)
    inp = load_file("inputs.safetensors")
    exp = load_file("expected.safetensors")
    with safe_open("inputs.safetensors", "pt") as f:
        meta = f.metadata()
    tasks = json.loads(meta["tasks"])
    cams = json.loads(meta["camera_order"])

    policy, pre, post = load_policy_and_processors(folder, use_factory=not plain)
    raw = {k[len("raw."):]: v.numpy() for k, v in inp.items() if k.startswith("raw.")}
    assert list(k for k in raw if k != "observation.state") == cams or set(raw) - {"observation.state"} == set(cams)
    batch = pre(raw_to_policy_batch({k: v.copy() for k, v in raw.items()}, tasks))

    res: dict[str, float] = {}
    for k, v in inp.items():
        if k.startswith("batch."):
            res[k] = max_abs_diff(batch[k[len("batch."):]], v)
    mi = model_inputs(policy, {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)})
    for k, v in mi.items():
        res[k] = max_abs_diff(v, inp[k])

    stored_batch = {k[len("batch."):]: v for k, v in inp.items() if k.startswith("batch.")}
    chunk = policy.predict_action_chunk(dict(stored_batch), noise=inp["noise"].clone())
    res["action_chunk_normalized"] = max_abs_diff(chunk, exp["action_chunk_normalized"])
    # The relative/absolute post-processor step adds the state cached by the pre-processor run above.
    res["action_chunk"] = max_abs_diff(post(chunk.clone()), exp["action_chunk"])
    res["post(expected normalized)"] = max_abs_diff(post(exp["action_chunk_normalized"].clone()), exp["action_chunk"])
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", type=Path, help="fixture folders, or set directories holding them")
    ap.add_argument("--only", default=None, help="comma-separated folder names to check inside set directories")
    ap.add_argument("--tol", type=float, default=0.0)
    ap.add_argument("--plain", action="store_true",
                    help="load processors with PolicyProcessorPipeline.from_pretrained directly")  # fmt: skip
    ap.add_argument("--_child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._child is not None:  # the fresh process for one folder
        print("@@RESULT@@" + json.dumps(check_folder(args._child.resolve(), args.plain)))
        return 0

    folders: list[Path] = []
    only = set(args.only.split(",")) if args.only else None
    for p in args.paths:
        p = p.resolve()
        if (p / "config.json").exists():
            folders.append(p)
        else:
            folders += [d for d in sorted(p.iterdir()) if (d / "config.json").exists() and (only is None or d.name in only)]
    ok = True
    for folder in folders:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", str(folder)] + (["--plain"] if args.plain else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT@@")), None)
        if proc.returncode != 0 or line is None:
            ok = False
            print(f"FAIL {folder}: reload crashed\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
            continue
        res = json.loads(line[len("@@RESULT@@"):])
        worst = max(res.values())
        status = "ok  " if worst <= args.tol else "FAIL"
        ok &= worst <= args.tol
        print(f"{status} {folder}  max abs diff {worst:.3g}  ({len(res)} tensors compared)")
        if worst > args.tol:
            for k, v in res.items():
                if v > args.tol:
                    print(f"       {k}: {v:.3g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
