# SPDX-License-Identifier: Apache-2.0
"""
How much RAM a bench configuration needs: writing its random checkpoint, loading it, running it.

Estimated from a model built on the meta device, before anything is written, so that the bench
can stop with the figures when the run would not fit.
"""

from __future__ import annotations

from typing import Optional

from dataclasses import dataclass

import torch
from torch import nn

from vla_policy_node.bench import checkpoints
from vla_policy_node.model import packed_linear
from vla_policy_node.model.blocks import fuse_projections, packing_targets
from vla_policy_node.model.families import pi0 as pi0_family
from vla_policy_node.model.families import smolvla
from vla_policy_node.model.precision import keep_float32


WORKING_BYTES = 1 << 30
"""Beyond the weights: torch itself, activations, allocator slack (1 GiB; pi0 with 3 cameras needs less)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a bench configuration needs, phase by phase (see ``memory_estimate``)."""

    save: int            # writing the random checkpoint (one copy in the file's dtype, plus what is serialized)
    load: int            # load_policy: the model is built in float32 first, then cast (loading/load.py)
    weights: int         # parameters at run time, float32 islands included
    packed: int          # oneDNN-packed copies of the CPU linears (model/packed_linear.py)
    working: int = WORKING_BYTES
    device: str = "cpu"

    @property
    def host_peak(self) -> int:
        """Peak host RAM over the whole bench."""
        run = self.weights + self.packed if self.device == "cpu" else 0
        return max(self.save, self.load, run) + self.working

    def as_dict(self) -> dict:
        gib = {k: v / 2**30 for k, v in vars(self).items() if isinstance(v, int)}
        return {**{f"{k}_gib": v for k, v in gib.items()}, "host_peak_gib": self.host_peak / 2**30,
                "device": self.device}


def packed_bytes_estimate(model: nn.Module) -> int:
    """Bytes ``blocks.pack_linears`` adds for ``model`` (dtypes final, projections not yet fused)."""
    fuse_projections(model)
    return sum(w.numel() * w.element_size() for _, _, w in packing_targets(model) if packed_linear.worth_packing(w))


def memory_estimate(name: str, cameras: int, dtype: str, device: str = "cpu", pack: bool = True,
                    pi0_dims: Optional[dict] = None) -> MemoryEstimate:
    """
    Estimate the RAM the bench needs for configuration ``name`` from a model built on the meta device.

    Phases: writing the checkpoint, ``load_policy`` (float32 build + the largest tensor read from
    the file), and the run (weights in their run-time dtypes + packed copies on the CPU).
    """
    if name in checkpoints.PI0_CONFIGS:
        model_cfg = checkpoints.pi0_model_config(cameras, pi0_dims)

        def factory() -> nn.Module:
            return pi0_family.Pi0(model_cfg)
        file_dtype = checkpoints.TORCH_DTYPES[dtype]
        vocab, width = model_cfg.backbone.vocab_size, model_cfg.backbone.expert.width
        extra = vocab * width                          # the expert's LM head, made while the model is alive
        serialize = 0                                  # streamed
    else:
        cfg, vlm = checkpoints.lerobot_config(name, cameras)
        smol_cfg = smolvla.SmolVLAConfig.from_lerobot(cfg, vlm)

        def factory() -> nn.Module:
            return smolvla.SmolVLA(smol_cfg)
        file_dtype, extra, serialize = torch.float32, 0, 1    # save_file serializes a second copy
    with torch.device("meta"):
        model = factory()
    params = [p.numel() for p in model.parameters()]
    file_el = checkpoints._element_size(file_dtype)
    save = sum(params) * file_el * (1 + serialize) + extra * file_el
    load = sum(params) * 4 + max(params) * file_el
    model.to(dtype=checkpoints.TORCH_DTYPES[dtype])
    if dtype != "float32":
        keep_float32(model, getattr(model, "FLOAT32_MODULES", ()))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    on_cpu = device == "cpu"
    packed = packed_bytes_estimate(model) if pack and on_cpu else 0
    return MemoryEstimate(save=save, load=load, weights=weights, packed=packed, device="cpu" if on_cpu else device)
