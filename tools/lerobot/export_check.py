#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run an exported checkpoint through LeRobot itself and write the action chunk it computes.

Run with a LeRobot venv's python (tools/lerobot/setup_env.sh VERSION DIR):

    .venv-lerobot044/bin/python tools/lerobot/export_check.py CHECKPOINT INPUTS OUTPUT

CHECKPOINT  a folder written by ``vla-policy-train`` (``vla_policy_node.train.export``)
INPUTS      safetensors: ``image.<feature>`` uint8 (B, H, W, 3) frames as a robot gives them, ``state``
            float32 (B, S) raw robot state, ``noise`` float32 (B, chunk, max_action_dim); metadata ``task``
OUTPUT      safetensors: ``action_chunk`` (after LeRobot's post-processor), ``action_chunk_normalized``,
            ``tokens`` / ``attention_mask`` (LeRobot's tokenizer step); metadata: the versions used

LeRobot is used as a user would: ``SmolVLAPolicy.from_pretrained`` (``strict=True``: every tensor must be
in the file, none extra) and ``PolicyProcessorPipeline.from_pretrained`` for both processors, with
HF_HUB_OFFLINE=1, from inside the checkpoint folder (the backbone is the relative name ``vlm``). The
robot-to-policy conversion is LeRobot's ``prepare_observation_for_inference`` (frames / 255, CHW, batch).

One stand-in: transformers 4.57's ``AutoProcessor`` builds SmolVLM's video processor, which needs
torchvision; these venvs carry a torchvision stub (see tools/lerobot/torchvision_stub), so with
transformers < 5 and the stub, ``SmolVLMVideoProcessor`` is replaced by a class that only reads and
checks ``video_preprocessor_config.json``. SmolVLA never uses the video processor; with a real
torchvision the stand-in is not installed.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402


def video_processor_stand_in() -> bool:
    """With transformers 4.x and the torchvision stub: stand in for SmolVLMVideoProcessor (returns whether)."""
    import transformers

    try:
        import torchvision
    except ImportError:
        torchvision = None
    stub = torchvision is None or getattr(torchvision, "STUB", False)
    if int(transformers.__version__.split(".")[0]) >= 5 or not stub:
        return False

    class SmolVLMVideoProcessor:
        """Reads ``video_preprocessor_config.json`` as transformers would, builds nothing."""

        def __init__(self, **config):
            self.__dict__.update(config)

        @classmethod
        def from_pretrained(cls, path, **kwargs):
            file = Path(path) / "video_preprocessor_config.json"
            config = json.loads(file.read_text())
            if config.get("video_processor_type") != "SmolVLMVideoProcessor":
                raise ValueError(f"{file}: video_processor_type is {config.get('video_processor_type')!r}")
            return cls(**config)

    from transformers import processing_utils

    # ProcessorMixin looks the class up on its own handle of the transformers package
    for module in {transformers, processing_utils.transformers_module}:
        setattr(module, "SmolVLMVideoProcessor", SmolVLMVideoProcessor)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__)
        return 2
    folder, inputs_path, output_path = (Path(a).resolve() for a in argv)
    with safe_open(str(inputs_path), "pt") as f:
        inputs = {k: f.get_tensor(k) for k in f.keys()}
        task = json.loads(f.metadata()["task"])
    stand_in = video_processor_stand_in()

    os.chdir(folder)
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

    policy = SmolVLAPolicy.from_pretrained(".", strict=True).eval()
    pre = PolicyProcessorPipeline.from_pretrained(".", config_filename="policy_preprocessor.json")
    post = PolicyProcessorPipeline.from_pretrained(".", config_filename="policy_postprocessor.json",
                                                   to_transition=policy_action_to_transition,
                                                   to_output=transition_to_policy_action)
    batch = {"observation.state": inputs["state"].float(), "task": task}
    for key, frames in inputs.items():
        if key.startswith("image."):
            batch[key[len("image."):]] = frames.permute(0, 3, 1, 2).float() / 255.0
    with torch.no_grad():
        processed = pre(batch)
        normalized = policy.predict_action_chunk(processed, noise=inputs["noise"])
        chunk = post(normalized)
    versions = {name: md.version(name) for name in ("lerobot", "transformers", "torch", "tokenizers")}
    versions["video_processor_stand_in"] = stand_in
    save_file({"action_chunk": chunk.contiguous(), "action_chunk_normalized": normalized.contiguous(),
               "tokens": processed["observation.language.tokens"].contiguous(),
               "attention_mask": processed["observation.language.attention_mask"].contiguous()},
              str(output_path), metadata={"versions": json.dumps(versions)})
    print(f"{folder}: LeRobot {versions['lerobot']} (transformers {versions['transformers']}) action chunk "
          f"{tuple(chunk.shape)} -> {output_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
