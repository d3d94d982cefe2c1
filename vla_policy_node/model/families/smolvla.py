# SPDX-License-Identifier: Apache-2.0
"""
SmolVLA: SmolVLM (SigLIP + pixel-shuffle connector + Llama text model) with a narrow action expert.

Prefix = [camera tokens * sqrt(width) ...; language * sqrt(width); state token].
The prefix pass runs the first ``num_vlm_layers`` text layers once, filling
the cache. The expert (``expert_width_multiplier`` x narrower) alternates:
layers where ``i % self_attn_every_n_layers == 0`` attend to [prefix_i; suffix]
(causal among the action tokens); the others cross-attend to the prefix K/V of
layer i, projected by the expert's own k/v projections. That projection does
not change across denoising steps, so it is done once per control step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vla_policy_node.model.attention import (additive_mask, attention, FIXED_KV_MAX_HEAD_DIM, FIXED_KV_SDPA,
                                             fixed_kv_attention, fixed_kv_layout, make_att_2d_masks)
from vla_policy_node.model import in_place
from vla_policy_node.model.blocks import (action_half, check_flow_config, DecoderLayer, DecoderSpec, RMSNorm,
                                          sinusoidal_time_embedding, time_half)
from vla_policy_node.model.prefix_cache import PrefixContext, VLAPrefixCache
from vla_policy_node.model.rope import apply_rope, rope_cos_sin
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.model.vision import SiglipVisionTransformer, VisionSpec

# Published SmolVLM2 backbone used by SmolVLA when its config folder is not on disk
# (the text/vision configuration of HuggingFaceTB/SmolVLM2-500M-Video-Instruct).
SMOLVLM2_500M = {
    "text_config": {"hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32,
                    "num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 64,
                    "rms_norm_eps": 1e-5, "vocab_size": 49280},
    "vision_config": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                      "num_attention_heads": 12, "patch_size": 16, "image_size": 512,
                      "layer_norm_eps": 1e-6},
    "scale_factor": 4,
}
KNOWN_VLMS = {"HuggingFaceTB/SmolVLM2-500M-Video-Instruct": SMOLVLM2_500M}


def expert_intermediate_size(width: int, ffn_multiplier: int = 4, multiple_of: int = 256) -> int:
    """Compute the expert MLP width as LeRobot does: 4 * (2/3 * width), rounded up to a multiple of 256."""
    hidden = int(ffn_multiplier * int(2 * width / 3))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class SmolVLAConfig:
    """Model configuration, read from LeRobot's ``config.json`` plus the VLM's own config."""

    text: DecoderSpec                 # the VLM text layers that are kept (num_vlm_layers)
    expert: DecoderSpec
    vision: VisionSpec
    vocab_size: int
    scale_factor: int                 # pixel-shuffle factor of the connector
    chunk_size: int
    max_state_dim: int
    max_action_dim: int
    num_steps: int
    self_attn_every_n_layers: int
    attention_mode: str = "cross_attn"
    min_period: float = 4e-3
    max_period: float = 4.0
    prefix_length: int = -1
    image_size: tuple[int, int] = (512, 512)     # resize_imgs_with_padding (height, width)
    tokenizer_max_length: int = 48
    pad_language_to: str = "longest"
    camera_names: tuple[str, ...] = ()
    state_dim: int = 0
    action_dim: int = 0
    vision_positions: str = "transformers4"   # SmolVLM position ids of the generation that trained it
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_flow_config(self)
        if self.vision_positions not in VISION_POSITIONS:
            raise ValueError(f"vision_positions must be one of {VISION_POSITIONS}, got {self.vision_positions!r}")
        if len(self.image_size) != 2 or min(self.image_size) <= 0:
            raise ValueError(f"resize_imgs_with_padding must be two positive sizes, got {self.image_size}")
        if self.attention_mode not in ("cross_attn", "self_attn"):
            raise ValueError(f"unsupported SmolVLA attention_mode {self.attention_mode!r}")
        if self.text.num_layers % self.expert.num_layers:
            raise ValueError(f"num_vlm_layers {self.text.num_layers} is not a multiple of "
                             f"num_expert_layers {self.expert.num_layers}")
        if self.expert.num_heads != self.text.num_heads or self.expert.head_dim != self.text.head_dim \
                or self.expert.num_kv_heads != self.text.num_kv_heads:
            raise ValueError("the SmolVLA expert must share the VLM's heads and head dim")
        if self.pad_language_to not in ("longest", "max_length"):
            raise ValueError(f"pad_language_to must be 'longest' or 'max_length', got {self.pad_language_to!r}")
        if not 0 < self.state_dim <= self.max_state_dim:
            raise ValueError(f"state dim {self.state_dim} must be in 1..max_state_dim={self.max_state_dim}")
        if not 0 < self.action_dim <= self.max_action_dim:
            raise ValueError(f"action dim {self.action_dim} must be in 1..max_action_dim={self.max_action_dim}")
        every = self.text.num_layers // self.expert.num_layers
        n = self.self_attn_every_n_layers
        # LeRobot shapes expert layer e's k/v for cross-attention unless e % n == 0, but picks the
        # attention of VLM layer e * every by (e * every) % n: where they disagree it cannot run the
        # layer. Both repeat with period n, so n expert layers cover every case.
        if self.attention_mode == "cross_attn" and every > 1 and n > 0:
            for e in range(min(self.expert.num_layers, n, 4096)):
                if (e % n == 0) != (e * every % n == 0):
                    raise ValueError(
                        f"with {self.text.num_layers} VLM layers, {self.expert.num_layers} expert layers and "
                        f"self_attn_every_n_layers {n}, LeRobot builds expert layer {e} for "
                        f"{'self' if e % n == 0 else 'cross'}-attention but runs it as the other (LeRobot "
                        "cannot run this configuration either)")
        side = self.vision.image_size // self.vision.patch_size
        if side % self.scale_factor:
            raise ValueError(f"{side} patches per side do not divide by scale_factor {self.scale_factor}")

    @property
    def tokens_per_image(self) -> int:
        return self.vision.num_patches // self.scale_factor ** 2

    @classmethod
    def from_lerobot(cls, cfg: dict, vlm_cfg: dict, vision_positions: str = "transformers4") -> "SmolVLAConfig":
        """From LeRobot's policy ``config.json``, the SmolVLM ``config.json`` it names, and the generation's ids."""
        if cfg.get("add_image_special_tokens"):
            raise ValueError("SmolVLA checkpoints with add_image_special_tokens=true are not supported")
        text, vis = vlm_cfg["text_config"], vlm_cfg["vision_config"]
        n_vlm = cfg.get("num_vlm_layers", -1)
        n_vlm = n_vlm if n_vlm > 0 else text["num_hidden_layers"]
        n_expert = cfg.get("num_expert_layers", -1)
        n_expert = n_expert if n_expert > 0 else n_vlm
        heads = text["num_attention_heads"]
        head_dim = text.get("head_dim") or text["hidden_size"] // heads
        common = dict(num_heads=heads, num_kv_heads=text.get("num_key_value_heads", heads), head_dim=head_dim,
                      act="silu", norm_eps=text.get("rms_norm_eps", 1e-5))
        expert_width = int(text["hidden_size"] * cfg.get("expert_width_multiplier", 0.75))
        features = cfg.get("input_features", {})
        cameras = tuple(k for k, v in features.items() if v.get("type") == "VISUAL")
        state = features.get("observation.state", {}).get("shape", [0])
        action = cfg.get("output_features", {}).get("action", {}).get("shape", [0])
        size = cfg.get("resize_imgs_with_padding") or [vis["image_size"], vis["image_size"]]
        if not (isinstance(size, list) and len(size) == 2 and all(isinstance(n, int) for n in size)):
            raise ValueError(f"resize_imgs_with_padding must be [width, height], got {size!r}")
        return cls(
            text=DecoderSpec(width=text["hidden_size"], num_layers=n_vlm, mlp_width=text["intermediate_size"],
                             **common),
            expert=DecoderSpec(width=expert_width, num_layers=n_expert,
                               mlp_width=expert_intermediate_size(expert_width), **common),
            vision=VisionSpec(image_size=vis["image_size"], patch_size=vis["patch_size"], width=vis["hidden_size"],
                              num_layers=vis["num_hidden_layers"], num_heads=vis["num_attention_heads"],
                              mlp_width=vis["intermediate_size"], norm_eps=vis.get("layer_norm_eps", 1e-6)),
            vocab_size=text["vocab_size"],
            scale_factor=vlm_cfg.get("scale_factor", 1),
            chunk_size=cfg["chunk_size"],
            max_state_dim=cfg["max_state_dim"],
            max_action_dim=cfg["max_action_dim"],
            num_steps=cfg["num_steps"],
            self_attn_every_n_layers=cfg.get("self_attn_every_n_layers", -1),
            attention_mode=cfg.get("attention_mode", "cross_attn"),
            min_period=cfg.get("min_period", 4e-3),
            max_period=cfg.get("max_period", 4.0),
            prefix_length=cfg.get("prefix_length", -1),
            image_size=(int(size[1]), int(size[0])),   # LeRobot stores (width, height)
            tokenizer_max_length=cfg.get("tokenizer_max_length", 48),
            pad_language_to=cfg.get("pad_language_to", "longest"),
            camera_names=cameras,
            state_dim=int(state[0]),
            action_dim=int(action[0]),
            vision_positions=vision_positions,
        )

    def is_self_attn_layer(self, layer_idx: int) -> bool:
        if self.attention_mode == "self_attn":
            return True
        n = self.self_attn_every_n_layers
        return n > 0 and layer_idx % n == 0


def pixel_shuffle(x: Tensor, scale: int) -> Tensor:
    """(B, N, C) patch grid -> (B, N / scale^2, C * scale^2): SmolVLM's space-to-depth connector."""
    b, n, c = x.shape
    side = int(math.isqrt(n))
    x = x.view(b, side, side // scale, c * scale)
    x = x.permute(0, 2, 1, 3).reshape(b, side // scale, side // scale, c * scale * scale)
    return x.permute(0, 2, 1, 3).reshape(b, n // scale ** 2, c * scale * scale)


VISION_POSITIONS = ("transformers4", "transformers5")


def smolvlm_position_ids(num_patches_per_side: int, table: str = "transformers4") -> Tensor:
    """
    Vision position ids (n * n,) exactly as SmolVLM computes them, per transformers generation.

    ``transformers4`` (4.57, LeRobot 0.4.x): the fractional coordinates are shrunk by
    (1 - 1e-6) before ``bucketize``, so the first two rows share bucket 0 and the last is
    never used: ``[0, 0, 1, 2, ...]``. ``transformers5`` (LeRobot >= 0.5): ``i * (1 / n)``,
    clamped below 1, gives ``[0, 1, 2, ...]``. A checkpoint was trained with one of them, and
    the other is off by ~1e-1 in the actions.
    """
    if table not in VISION_POSITIONS:
        raise ValueError(f"vision position table must be one of {VISION_POSITIONS}, got {table!r}")
    n = num_patches_per_side
    # A constant table, always made on the CPU (a float arange on the meta device of
    # ``weights.build_model`` would run torch's reference kernel, which imports torch._dynamo).
    boundaries = torch.arange(1 / n, 1.0, 1 / n, dtype=torch.float32, device="cpu")
    index = torch.arange(n, dtype=torch.float32, device="cpu")
    if table == "transformers4":
        coords = index / n * (1 - 1e-6)
    else:
        step = 1.0 / torch.tensor(n, device="cpu")
        coords = torch.clamp(index * step, max=1.0 - 1e-6)
    buckets = torch.bucketize(coords, boundaries, right=True)
    return (buckets[:, None] * n + buckets[None, :]).flatten()


def position_table_for(table: str, embedding: Tensor, num_patches_per_side: int) -> Tensor:
    """
    Re-index a vision position embedding (n * n, D) trained with ``transformers4`` ids for ``table``.

    Every ``transformers5`` id is used once, so the rows the 4.x ids picked can be laid out for
    5.x exactly: the same network then gives the same actions under either generation.
    """
    old = smolvlm_position_ids(num_patches_per_side, "transformers4")
    new = smolvlm_position_ids(num_patches_per_side, table)
    out = embedding.clone()
    out[new] = embedding[old]
    return out


class Connector(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.proj = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(pixel_shuffle(x, self.scale))


class SmolVLA(nn.Module):
    """SmolVLA flow-matching policy network (implements ``model.vla.FlowMatchingVLA``)."""

    # Kept in float32 when the rest runs in bfloat16: norms, time/action MLPs, state projection.
    FLOAT32_MODULES = ("state_proj", "action_in_proj", "action_out_proj", "action_time_mlp_in",
                       "action_time_mlp_out", "expert_norm")
    fixed_kv_at_batch_one: bool = False
    """Set by ``int8_linear.quantize_linears``: a batch of one denoises through ``fixed_kv_attention`` at any
    head width (``_fixed_kv_attention``). float32 models keep the kernels their actions were validated with."""

    def __init__(self, config: SmolVLAConfig, attention_backend: str = "sdpa") -> None:
        super().__init__()
        c = config
        self.config = c
        self.backend = attention_backend
        self.chunk_size = c.chunk_size
        self.max_action_dim = c.max_action_dim
        self.num_cache_layers = c.text.num_layers
        self.vision = SiglipVisionTransformer(c.vision)
        self.connector = Connector(c.vision.width * c.scale_factor ** 2, c.text.width, c.scale_factor)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.text.width)
        self.vlm_layers = nn.ModuleList(DecoderLayer(c.text) for _ in range(c.text.num_layers))
        kv_dim = c.text.num_kv_heads * c.text.head_dim
        every = c.text.num_layers // c.expert.num_layers
        self.expert_at = {i: i // every for i in range(c.text.num_layers) if i % every == 0}
        self.expert_layers = nn.ModuleList(
            DecoderLayer(c.expert, kv_in_dim=None if c.is_self_attn_layer(i) else kv_dim)
            for i in sorted(self.expert_at))
        self.expert_norm = RMSNorm(c.expert.width, c.expert.norm_eps)
        self.state_proj = nn.Linear(c.max_state_dim, c.text.width)
        self.action_in_proj = nn.Linear(c.max_action_dim, c.expert.width)
        self.action_out_proj = nn.Linear(c.expert.width, c.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * c.expert.width, c.expert.width)
        self.action_time_mlp_out = nn.Linear(c.expert.width, c.expert.width)
        side = c.vision.image_size // c.vision.patch_size
        self.register_buffer("vision_position_ids", smolvlm_position_ids(side, c.vision_positions), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    # ------------------------------------------------------------------ prefix
    def embed_prefix(self, inputs: ModelInputs) -> tuple[Tensor, Tensor, Tensor]:
        """
        -> embeddings (B, Lp, W), pad mask (B, Lp) bool, ar mask (B, Lp) int.

        All cameras go through the vision tower as one batch of n_cameras * B (one pass
        instead of one per camera: the same numbers, half the time at three cameras).
        """
        b, n_cam = inputs.batch_size, len(inputs.images)
        embs, pads, ars = [], [], []
        cameras: list[Tensor] = []
        if n_cam:
            pixels = torch.cat(inputs.images, dim=0).to(self.dtype)             # (n_cam * B, 3, S, S)
            feats = self.connector(self.vision(pixels, self.vision_position_ids, self.backend))
            feats = feats * torch.tensor(feats.shape[-1] ** 0.5, dtype=feats.dtype)
            cameras = list(feats.view(n_cam, b, *feats.shape[1:]))
        for camera, valid in zip(cameras, inputs.image_masks):
            embs.append(camera)                                                  # (B, n_img, W)
            pads.append(valid[:, None].expand(b, camera.shape[1]))
            ars.append(torch.zeros(b, camera.shape[1], dtype=torch.long, device=camera.device))
        lang = self.embed_tokens(inputs.tokens)
        embs.append(lang * math.sqrt(lang.shape[-1]))
        pads.append(inputs.token_mask)
        ars.append(torch.zeros_like(inputs.tokens))
        if inputs.state is None:
            raise ValueError("SmolVLA needs the robot state")
        state = self.state_proj(inputs.state.float()).to(self.dtype)[:, None]
        embs.append(state)
        pads.append(torch.ones(b, 1, dtype=torch.bool, device=state.device))
        ars.append(torch.ones(b, 1, dtype=torch.long, device=state.device))
        emb, pad, ar = torch.cat(embs, 1), torch.cat(pads, 1), torch.cat(ars, 1)
        extra = self.config.prefix_length - emb.shape[1]
        if extra > 0:
            emb = F.pad(emb, (0, 0, 0, extra))
            pad = F.pad(pad, (0, extra), value=False)
            ar = F.pad(ar, (0, extra))
        return emb, pad, ar

    def encode_prefix(self, inputs: ModelInputs, cache: VLAPrefixCache) -> PrefixContext:
        emb, pad, ar = self.embed_prefix(inputs)
        mask = additive_mask(make_att_2d_masks(pad, ar), self.dtype)
        positions = torch.cumsum(pad.long(), dim=1) - 1
        rope = rope_cos_sin(positions, self.config.text.head_dim, self.config.text.rope_base)
        x = emb
        *layers, last = self.vlm_layers
        for i, layer in enumerate(layers):
            x = layer.mlp_block(layer.attention_block(x, rope, mask, cache, i, self.backend))
        last.store_kv(x, rope, cache, len(layers))
        return PrefixContext(cache=cache, pad_mask=pad, extras=self._suffix_constants(pad, cache))

    def _suffix_constants(self, pad: Tensor, cache: VLAPrefixCache) -> dict[str, Any]:
        """Masks, RoPE angles and cross-attention K/V: fixed for all denoising steps of a control step."""
        b, T = pad.shape[0], self.chunk_size
        device = pad.device
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        self_allowed = torch.cat([pad[:, None, :].expand(b, T, pad.shape[1]), causal.expand(b, T, T)], dim=2)
        offsets = pad.long().sum(1, keepdim=True)
        steps = torch.arange(T, device=device)[None]
        head_dim, base = self.config.text.head_dim, self.config.text.rope_base
        cross_kv: list[Optional[tuple[Tensor, Tensor]]] = []
        for i in sorted(self.expert_at):
            if self.config.is_self_attn_layer(i):
                cross_kv.append(None)
                continue
            proj = self.expert_layers[self.expert_at[i]].self_attn
            k, v = cache.layer(i)                                 # (B, H_kv, Lp, D)
            flat = [t.transpose(1, 2).reshape(b, t.shape[2], -1) for t in (k, v)]
            cross_kv.append((proj.split(proj.k_proj(flat[0]), proj.num_kv_heads),
                             proj.split(proj.v_proj(flat[1]), proj.num_kv_heads)))
        cross_mask = additive_mask(pad[:, None, :].expand(b, T, pad.shape[1]), self.dtype)
        extras = {
            "self_mask": additive_mask(self_allowed, self.dtype),
            "cross_mask": cross_mask,
            "self_rope": rope_cos_sin(offsets + steps, head_dim, base),
            "cross_rope": rope_cos_sin(steps.expand(b, T), head_dim, base),
            "cross_kv": cross_kv,
        }
        if self._fixed_kv_attention(device, b):
            # The cross-attention K/V and mask are the same at every denoising step: lay them out
            # once here (K transposed and scaled, the mask repeated per query head) instead of
            # letting the flash kernel redo it at each of the num_steps calls.
            extras["cross_fixed"] = [None if kv is None else
                                     list(fixed_kv_layout(kv[0], kv[1], cross_mask, self.config.expert.num_heads))
                                     for kv in cross_kv]
        return extras

    def _fixed_kv_attention(self, device: torch.device, batch: int) -> bool:
        """
        Whether eager CPU float32 denoising attends through ``fixed_kv_attention`` (K/V laid out once per prefix).

        For heads at most FIXED_KV_MAX_HEAD_DIM wide, where CPU flash attention is slow: measured
        1.17-1.33x faster than SDPA at 16- and 32-wide heads (batch 1-4, 50 queries), but
        0.37-0.69x at SmolVLA's 64-wide heads at batch 4 (the git history of BENCHMARKS.md). At a
        batch of one (a robot's node) it wins at 64-wide heads too: 1.35-1.46x at smolvla_base's
        50 queries over 108 and 158 keys (AMD EPYC, 2 threads), so int8 models take it there
        (``fixed_kv_at_batch_one``).
        """
        wins = self.config.text.head_dim <= FIXED_KV_MAX_HEAD_DIM or (batch == 1 and self.fixed_kv_at_batch_one)
        return (device.type == "cpu" and self.backend == "sdpa" and self.dtype == torch.float32 and wins
                and not torch.compiler.is_compiling())

    # ----------------------------------------------------------------- suffix
    def time_conditioning(self, timesteps: Tensor) -> list[Tensor]:
        """Return the time half of ``action_time_mlp_in`` for each step, with its bias: (1, 1, W_e) float32."""
        emb = sinusoidal_time_embedding(timesteps, self.config.expert.width,
                                        self.config.min_period, self.config.max_period)
        return [t[None, None] for t in time_half(self.action_time_mlp_in, emb)]

    def velocity(self, x_t: Tensor, time_cond: Tensor, ctx: PrefixContext) -> Tensor:
        a = self.action_in_proj(x_t)                                # (B, T, W_e) float32
        h = self.action_time_mlp_out(in_place.silu_of_sum(action_half(self.action_time_mlp_in, a), time_cond))
        h = h.to(self.dtype)
        ex = ctx.extras
        self_backend = FIXED_KV_SDPA if self._fixed_kv_attention(h.device, h.shape[0]) else self.backend
        for n, i in enumerate(sorted(self.expert_at)):
            layer = self.expert_layers[self.expert_at[i]]
            if ex["cross_kv"][n] is None:
                h = layer(h, ex["self_rope"], ex["self_mask"], ctx.cache, i, self_backend)
            else:
                fixed = ex["cross_fixed"][n] if "cross_fixed" in ex else None
                h = self._cross_layer(layer, h, ex["cross_rope"], ex["cross_mask"], ex["cross_kv"][n], fixed)
        h, _ = self.expert_norm(h)
        return self.action_out_proj(h.float())

    def _cross_layer(self, layer: DecoderLayer, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor,
                     kv: tuple[Tensor, Tensor], fixed: Optional[list[Tensor]] = None) -> Tensor:
        """Cross-attention to the prefix K/V; ``fixed``: the same laid out once per prefix (``fixed_kv_layout``)."""
        h, _ = layer.input_layernorm(x)
        q = apply_rope(layer.self_attn.q(h), *rope)
        out = attention(q, kv[0], kv[1], mask, self.backend) if fixed is None else fixed_kv_attention(q, *fixed)
        return layer.mlp_block(in_place.add(x, layer.self_attn.out(out)))


def key_rules() -> list[tuple[str, Optional[str]]]:
    """Map LeRobot checkpoint names to this module's names; None = not used at inference (not loaded)."""
    vlm = "model.vlm_with_expert.vlm."
    return [
        (vlm + "lm_head.", None),
        (vlm + "model.text_model.norm.", None),        # the prefix's final norm output is never read
        (vlm + "model.vision_model.", "vision."),
        (vlm + "model.connector.modality_projection.", "connector."),
        (vlm + "model.text_model.embed_tokens.", "embed_tokens."),
        (vlm + "model.text_model.layers.", "vlm_layers."),
        ("model.vlm_with_expert.lm_expert.layers.", "expert_layers."),
        ("model.vlm_with_expert.lm_expert.norm.", "expert_norm."),
        ("model.vlm_with_expert.lm_expert.lm_head.", None),
        ("model.", ""),
    ]
