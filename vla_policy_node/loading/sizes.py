# SPDX-License-Identifier: Apache-2.0
"""
The sizes a checkpoint declares, bounded before anything is allocated from them.

A ``config.json`` value that passes type checks can still ask for the impossible:
``resize_imgs_with_padding: [60000, 60000]`` grows the process by tens of GB while it resizes
the first frame; ``chunk_size: 2**30`` asks the allocator for 137 GB at the warm-up. Every
size inference allocates from is bounded here by name (the published SmolVLA, pi0 and pi0.5
use a small fraction of each bound), and :func:`working_bytes` estimates the memory one
inference needs, which the loader compares with what the machine has.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

# field name (in any family's config dataclass) -> the largest value a checkpoint may declare
LIMITS = {
    "chunk_size": 1024, "num_steps": 1000, "image_size": 4096, "patch_size": 4096,
    "tokenizer_max_length": 4096, "prefix_length": 65536, "max_state_dim": 4096, "max_action_dim": 4096,
    "state_dim": 4096, "action_dim": 4096, "width": 65536, "mlp_width": 262144, "mlp_dim": 262144,
    "num_layers": 512, "depth": 512, "num_heads": 1024, "num_kv_heads": 1024, "head_dim": 4096,
    "vocab_size": 2**21, "scale_factor": 64, "empty_cameras": 64, "self_attn_every_n_layers": 512,
    "adaptive_norm_dim": 65536,
}


def bounded_fields(config: Any, source: str) -> str | None:
    """Say which declared size of ``config`` (recursively) is beyond its bound in ``LIMITS``, or None."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            found = bounded_fields(value, source)
            if found is not None:
                return found
            continue
        limit = LIMITS.get(field.name)
        values = value if isinstance(value, tuple) else (value,)
        for item in values:
            if limit is not None and isinstance(item, int) and not isinstance(item, bool) and item > limit:
                return (f"{source}: {type(config).__name__}.{field.name} = {value!r:.60} is beyond {limit}, "
                        "the most this node accepts (published models use a small fraction)")
    return None


def working_bytes(config: Any, cameras: int, batch: int = 1) -> int:
    """
    Estimate the float32 working memory (bytes) of one inference of ``batch`` observations, weights apart.

    The terms that grow with the declared sizes: the frames resized, the vision tower's tokens and
    attention scores per camera, the prefix's K/V cache and attention scores over all layers,
    and the denoised chunk. An upper bound to within a small factor, for a refusal with figures.
    """
    vision = getattr(config, "vision", None) or config.backbone.vision
    text = getattr(config, "text", None) or config.backbone.vlm.spec()
    height, width = config.image_size
    tokens = (vision.image_size // vision.patch_size) ** 2                  # per camera, before any merge
    prefix = cameras * tokens + config.tokenizer_max_length + 1
    floats = (cameras * (height * width + vision.image_size ** 2) * 3 * 4    # frames and their resized copies
              + cameras * tokens * (vision.num_heads * tokens + 4 * vision.mlp_width)  # vision attention, MLP
              + 2 * text.num_layers * prefix * text.num_kv_heads * text.head_dim       # the K/V cache
              + text.num_heads * prefix * prefix + 4 * prefix * text.mlp_width          # one layer's scores, MLP
              + 16 * config.chunk_size * config.max_action_dim)                        # the chunk and its steps
    return 4 * batch * int(floats)


def available_bytes(device: Any) -> float:
    """Return the memory free for ``device`` (a torch.device): CUDA's free memory, else MemAvailable."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return math.inf
