#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Record LeRobot's real-time chunking (RTC) on a fixture folder: guided chunks for test_rtc_lerobot.

    .venv-lerobot061/bin/python tools/lerobot/make_rtc_fixture.py test/fixtures/lerobot061/smolvla

Loads the folder with LeRobot (as check_fixtures.py does), turns on ``rtc_config`` with LeRobot's
defaults (LINEAR prefix schedule, max_guidance_weight 10), and for two execution horizons runs
``predict_action_chunk(batch, noise=noise, inference_delay=2, prev_chunk_left_over=prev,
execution_horizon=h)`` with ``prev`` the first 7 rows of the fixture's own normalized chunk shifted
by +0.3 (so the guidance has something to pull). Writes ``rtc.safetensors`` beside the fixture:
``prev_chunk_left_over`` (B, 7, A), ``action_chunk_normalized.h{h}`` and ``action_chunk.h{h}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DELAY, KEPT, SHIFT, HORIZONS = 2, 7, 0.3, (4, 10)


def main() -> int:
    from fixture_utils import load_policy_and_processors, raw_to_policy_batch, set_offline_env

    set_offline_env()
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from lerobot.policies.rtc.configuration_rtc import RTCConfig

    folder = Path(sys.argv[1]).resolve()
    torch.set_num_threads(1)
    os.chdir(folder)
    inp, exp = load_file("inputs.safetensors"), load_file("expected.safetensors")
    with safe_open("inputs.safetensors", "pt") as f:
        tasks = json.loads(f.metadata()["tasks"])
    policy, pre, post = load_policy_and_processors(folder, use_factory=True)
    policy.config.rtc_config = RTCConfig(enabled=True)
    policy.init_rtc_processor()
    raw = {k[len("raw."):]: v.numpy() for k, v in inp.items() if k.startswith("raw.")}
    batch = pre(raw_to_policy_batch({k: v.copy() for k, v in raw.items()}, tasks))
    prev = exp["action_chunk_normalized"][:, :KEPT].clone() + SHIFT
    out = {"prev_chunk_left_over": prev.contiguous()}
    for horizon in HORIZONS:
        chunk = policy.predict_action_chunk(dict(batch), noise=inp["noise"].clone(), inference_delay=DELAY,
                                            prev_chunk_left_over=prev.clone(), execution_horizon=horizon)
        out[f"action_chunk_normalized.h{horizon}"] = chunk.contiguous()
        out[f"action_chunk.h{horizon}"] = post(chunk.clone()).contiguous()
    meta = {"inference_delay": str(DELAY), "horizons": json.dumps(list(HORIZONS)), "max_guidance_weight": "10.0",
            "prefix_attention_schedule": "LINEAR", "source": "tools/lerobot/make_rtc_fixture.py"}
    save_file(out, "rtc.safetensors", metadata=meta)
    print({k: tuple(v.shape) for k, v in out.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
