# SPDX-License-Identifier: Apache-2.0
"""
PaliGemma with a Gemma action expert: the backbone pi0 and pi0.5 share.

Prefix pass (once per control step)::

    images (B, 3, S, S) -> SigLIP -> projector ----------------.
    tokens (B, L) -> embed_tokens * sqrt(width) -----------------+-> Gemma VLM layers -> cache (K/V per layer)

Image tokens are not scaled; only language embeddings are multiplied by
sqrt(width) (openpi moved Gemma's input scaling there). Every valid prefix
token sees every other one (ar-mask all 0). The VLM's final norm and LM head
are never needed: only the per-layer K/V leave the prefix pass.

Denoising (every step): expert layer i attends over [prefix K/V of VLM layer i;
its own suffix K/V], which is exactly ``DecoderLayer`` reading a frozen cache.
So the VLM and the expert must agree on depth, KV heads and head_dim.

Sizes come by name (``gemma_2b``, ``gemma_300m``, SigLIP So400m, the
published configurations) unless a ``tiny_dims.json`` overrides them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vla_policy_node.model.attention import additive_mask, make_att_2d_masks
from vla_policy_node.model.blocks import check_flow_config, DecoderLayer, DecoderSpec, make_norm
from vla_policy_node.model.prefix_cache import PrefixKV, VLAPrefixCache
from vla_policy_node.model.rope import rope_cos_sin
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.model.vision import SiglipVisionTransformer, VisionSpec

GEMMA_NORM_EPS = 1e-6
GEMMA_ROPE_BASE = 10000.0
PALIGEMMA_VOCAB_SIZE = 257152
IMAGE_PAD_VALUE = -1.0
"""LeRobot 0.4's padding value of ``resize_with_pad``, applied in [0, 1] space (see ``prepare_image``)."""
IMAGE_PAD_VALUE_LEROBOT_0_5 = 0.0
"""LeRobot >= 0.5 pads with 0 in [0, 1] space (its ``resize_with_pad_torch`` clamps to [0, 1] and pads
0.0 for float images), so padded pixels reach the model at -1, as in openpi."""


def lerobot_image_pad_value(version: tuple[int, ...]) -> float:
    """Pad value in [0, 1] space of the LeRobot version that wrote a pi0 / pi0.5 checkpoint."""
    return IMAGE_PAD_VALUE if tuple(version[:2]) < (0, 5) else IMAGE_PAD_VALUE_LEROBOT_0_5


@dataclass(frozen=True)
class GemmaDims:
    """One Gemma stack, in openpi's ``gemma.Config`` vocabulary."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value <= 0:
                raise ValueError(f"GemmaDims.{name} must be > 0, got {value}")

    def spec(self, adaptive_norm: bool = False) -> DecoderSpec:
        """Describe the Gemma decoder: (1 + w) RMSNorm, GeGLU-tanh MLP; adaRMS on a width-sized vector if asked."""
        return DecoderSpec(width=self.width, num_layers=self.depth, num_heads=self.num_heads,
                           num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, mlp_width=self.mlp_dim,
                           act="gelu_tanh", norm_eps=GEMMA_NORM_EPS, norm_offset=1.0,
                           adaptive_norm_dim=self.width if adaptive_norm else 0, rope_base=GEMMA_ROPE_BASE)


GEMMA_VARIANTS = {
    "gemma_2b": GemmaDims(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_300m": GemmaDims(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
}
SIGLIP_SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                 "num_attention_heads": 16, "patch_size": 14}


def _gemma_dims(variant: str, tiny: Optional[dict]) -> GemmaDims:
    if tiny is not None:
        return GemmaDims(**tiny)
    if variant not in GEMMA_VARIANTS:
        raise ValueError(f"unknown Gemma variant {variant!r}; known: {sorted(GEMMA_VARIANTS)}")
    return GEMMA_VARIANTS[variant]


@dataclass(frozen=True)
class PaliGemmaSpec:
    """Sizes of the vision tower, the VLM and the action expert."""

    vision: VisionSpec
    vlm: GemmaDims
    expert: GemmaDims
    vocab_size: int

    def __post_init__(self) -> None:
        for name in ("depth", "num_kv_heads", "head_dim"):
            if getattr(self.vlm, name) != getattr(self.expert, name):
                raise ValueError(f"expert layer i attends to VLM layer i's K/V, so {name} must match: "
                                 f"VLM {getattr(self.vlm, name)} vs expert {getattr(self.expert, name)}")
        if self.vocab_size <= 0:
            raise ValueError(f"vocab_size must be > 0, got {self.vocab_size}")

    @classmethod
    def from_checkpoint(cls, config: dict, tiny_dims: Optional[dict] = None) -> "PaliGemmaSpec":
        """From a LeRobot pi0/pi0.5 ``config.json`` dict; ``tiny_dims.json`` contents override the variants."""
        height, width = config["image_resolution"]
        if height != width:
            raise ValueError(f"PaliGemma needs a square image_resolution, got {config['image_resolution']}")
        tiny = tiny_dims or {}
        if tiny and tiny.get("image_size", height) != height:
            raise ValueError(f"tiny_dims image_size {tiny['image_size']} disagrees with image_resolution {height}")
        vis = tiny.get("vision", SIGLIP_SO400M)
        vision = VisionSpec(image_size=height, patch_size=vis["patch_size"], width=vis["hidden_size"],
                            num_layers=vis["num_hidden_layers"], num_heads=vis["num_attention_heads"],
                            mlp_width=vis["intermediate_size"], norm_eps=1e-6)
        return cls(vision=vision,
                   vlm=_gemma_dims(config["paligemma_variant"], tiny.get("vlm")),
                   expert=_gemma_dims(config["action_expert_variant"], tiny.get("expert")),
                   vocab_size=tiny.get("vocab_size", PALIGEMMA_VOCAB_SIZE))


@dataclass(frozen=True)
class PiConfig:
    """What inference needs from a LeRobot pi0 / pi0.5 ``config.json`` (the two share the fields)."""

    backbone: PaliGemmaSpec
    chunk_size: int
    max_state_dim: int
    max_action_dim: int
    num_steps: int                     # num_inference_steps
    min_period: float                  # sin/cos time embedding periods
    max_period: float
    tokenizer_max_length: int
    camera_names: tuple[str, ...]      # VISUAL input features, in config order (= image order)
    state_dim: int
    action_dim: int
    empty_cameras: int = 0             # extra all-masked cameras appended after the real ones

    def __post_init__(self) -> None:
        check_flow_config(self)
        if self.backbone.expert.width % 2:
            raise ValueError(f"the sin/cos time embedding needs an even expert width, "
                             f"got {self.backbone.expert.width}")
        if not 0 < self.state_dim <= self.max_state_dim:
            raise ValueError(f"state dim {self.state_dim} must be in 1..max_state_dim={self.max_state_dim}")
        if not 0 < self.action_dim <= self.max_action_dim:
            raise ValueError(f"action dim {self.action_dim} must be in 1..max_action_dim={self.max_action_dim}")
        if self.empty_cameras < 0:
            raise ValueError(f"empty_cameras must be >= 0, got {self.empty_cameras}")

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) that ``prepare_image`` produces."""
        return self.backbone.vision.image_size, self.backbone.vision.image_size

    @classmethod
    def from_checkpoint(cls, config: dict, tiny_dims: Optional[dict] = None) -> "PiConfig":
        """From LeRobot's ``config.json`` dict; ``tiny_dims`` (``tiny_dims.json``) overrides the named sizes."""
        features = config.get("input_features", {})
        state = features.get("observation.state", {}).get("shape", [0])
        action = config.get("output_features", {}).get("action", {}).get("shape", [0])
        return cls(backbone=PaliGemmaSpec.from_checkpoint(config, tiny_dims),
                   chunk_size=config["chunk_size"], max_state_dim=config["max_state_dim"],
                   max_action_dim=config["max_action_dim"], num_steps=config["num_inference_steps"],
                   min_period=config["min_period"], max_period=config["max_period"],
                   tokenizer_max_length=config["tokenizer_max_length"],
                   camera_names=tuple(k for k, v in features.items() if v.get("type") == "VISUAL"),
                   state_dim=int(state[0]), action_dim=int(action[0]),
                   empty_cameras=config.get("empty_cameras", 0))


class PaliGemma(nn.Module):
    """SigLIP tower + linear projector + Gemma decoder. ``forward`` is the prefix pass that fills the cache."""

    def __init__(self, spec: PaliGemmaSpec) -> None:
        super().__init__()
        self.text = spec.vlm.spec()
        self.vision_tower = SiglipVisionTransformer(spec.vision)
        self.multi_modal_projector = nn.Linear(spec.vision.width, spec.vlm.width)
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.vlm.width)
        self.layers = nn.ModuleList(DecoderLayer(self.text) for _ in range(self.text.num_layers))

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the decoder weights: the residual stream and the cache live in it."""
        return self.layers[0].self_attn.q_proj.weight.dtype

    def embed_prefix(self, inputs: ModelInputs, backend: str) -> tuple[Tensor, Tensor]:
        """
        Images and language -> embeddings (B, Lp, W) in the decoder dtype, pad mask (B, Lp) bool.

        All cameras go through the vision tower as one batch of B * n_cameras.
        """
        b, n_cam = inputs.batch_size, len(inputs.images)
        pixels = torch.cat(inputs.images, dim=0)                              # (n_cam * B, 3, S, S)
        image_tokens = self.multi_modal_projector(self.vision_tower(pixels, backend=backend))
        image_tokens = image_tokens.to(self.dtype).view(n_cam, b, -1, image_tokens.shape[-1])
        lang = self.embed_tokens(inputs.tokens)                               # (B, L, W)
        lang = lang * math.sqrt(lang.shape[-1])
        embs = torch.cat([*image_tokens, lang], dim=1)
        n_img = image_tokens.shape[2]
        pad = torch.cat([*(m[:, None].expand(b, n_img) for m in inputs.image_masks),
                         inputs.token_mask.bool()], dim=1)
        return embs, pad

    def forward(self, embs: Tensor, pad_mask: Tensor, cache: VLAPrefixCache, backend: str) -> None:
        """
        Run the decoder over the prefix (B, Lp, W); its per-layer K/V land in ``cache``.

        The ar-mask is all zeros: valid prefix tokens attend to each other both ways.
        Positions are cumsum(pad) - 1, so padding does not shift later tokens.
        """
        ar = torch.zeros_like(pad_mask)
        mask = additive_mask(make_att_2d_masks(pad_mask, ar), embs.dtype)
        rope = rope_cos_sin(torch.cumsum(pad_mask.long(), dim=1) - 1, self.text.head_dim, self.text.rope_base)
        x = embs
        *layers, last = self.layers
        for i, layer in enumerate(layers):
            x = layer.mlp_block(layer.attention_block(x, rope, mask, cache, i, backend))
        last.store_kv(x, rope, cache, len(layers))


class GemmaExpert(nn.Module):
    """The action expert: Gemma layers reading the frozen prefix cache, then a final norm."""

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.spec = spec
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = make_norm(spec)

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].self_attn.q_proj.weight.dtype

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, cache: PrefixKV,
                backend: str, num_out: int, cond: Optional[Tensor] = None) -> Tensor:
        """Suffix x (B, Ls, W) -> normed last ``num_out`` tokens (B, num_out, W); mask (B, 1, Ls, Lp + Ls)."""
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, mask, cache, i, backend, cond)
        out, _ = self.norm(x[:, -num_out:], cond)
        return out


class PaliGemmaFlowModel(nn.Module):
    """
    What pi0 and pi0.5 share: the PaliGemma prefix, the Gemma expert, the suffix's mask and RoPE.

    ``suffix_ar`` is the suffix's own ar-mask: [1, 1, 0, ...] for pi0 (state token first),
    [1, 0, ...] for pi0.5. It lives on the model's device, so building the mask copies
    nothing from the host (illegal inside a CUDA-graph capture).
    """

    def __init__(self, config: PiConfig, attention_backend: str, suffix_ar: list[int], adaptive_norm: bool) -> None:
        super().__init__()
        self.config = config
        self.backend = attention_backend
        self.chunk_size = config.chunk_size
        self.max_action_dim = config.max_action_dim
        self.num_cache_layers = config.backbone.vlm.depth
        self.vlm = PaliGemma(config.backbone)
        self.expert = GemmaExpert(config.backbone.expert.spec(adaptive_norm=adaptive_norm))
        self.register_buffer("suffix_ar", torch.tensor(suffix_ar), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.vlm.dtype

    def encode_vlm(self, inputs: ModelInputs, cache: VLAPrefixCache) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
        """Run the VLM once over the prefix, filling ``cache``; return its pad mask and the suffix's mask and RoPE."""
        embs, pad = self.vlm.embed_prefix(inputs, self.backend)
        self.vlm(embs, pad, cache, self.backend)
        spec = self.expert.spec
        mask, rope = suffix_attention(pad, self.suffix_ar, spec.head_dim, spec.rope_base, self.expert.dtype)
        return pad, mask, rope


def suffix_attention(prefix_pad: Tensor, suffix_ar: Tensor, head_dim: int, rope_base: float,
                     dtype: torch.dtype) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """
    Mask and RoPE of a suffix that follows the cached prefix; constant over a control step.

    prefix_pad (B, Lp) bool; suffix_ar (Ls,) int: the suffix's own ar-mask (no suffix padding).
    Every suffix token sees all valid prefix tokens; within the suffix the cumsum rule applies.
    Suffix positions continue after the valid prefix tokens: n_valid + arange(Ls).
    Returns the additive mask (B, 1, Ls, Lp + Ls) and (cos, sin).
    """
    b, lp = prefix_pad.shape
    ls = suffix_ar.shape[0]
    suffix_pad = torch.ones(b, ls, dtype=torch.bool, device=prefix_pad.device)
    suffix_2d = make_att_2d_masks(suffix_pad, suffix_ar.to(prefix_pad.device)[None].expand(b, ls))
    allowed = torch.cat([prefix_pad[:, None, :].expand(b, ls, lp), suffix_2d], dim=2)
    positions = prefix_pad.long().sum(-1, keepdim=True) + torch.arange(ls, device=prefix_pad.device)
    return additive_mask(allowed, dtype), rope_cos_sin(positions, head_dim, rope_base)


def prepare_image(image: Tensor, resolution: int, pad_value: float = IMAGE_PAD_VALUE) -> Tensor:
    """
    Camera image (B, 3, H, W) in [0, 1] -> model input (B, 3, S, S), LeRobot's pi0/pi0.5 exactly.

    Aspect-preserving bilinear resize (align_corners=False, no antialias) so the longer
    side fits, centre padding with ``pad_value``, then x * 2 - 1. The padding happens in
    [0, 1] space: LeRobot 0.4 pads -1.0, so padded pixels end at -3.0, and trains and
    evaluates this way, so its checkpoints expect it; LeRobot >= 0.5 pads 0.0 (-1.0 at the
    model, as openpi). S x S images skip the resize.
    """
    if image.dim() != 4 or image.shape[1] != 3:
        raise ValueError(f"image must be (B, 3, H, W), got {tuple(image.shape)}")
    h, w = image.shape[-2:]
    if (h, w) != (resolution, resolution):
        ratio = max(w / resolution, h / resolution)
        rh, rw = int(h / ratio), int(w / ratio)
        image = F.interpolate(image, size=(rh, rw), mode="bilinear", align_corners=False)
        top, left = (resolution - rh) // 2, (resolution - rw) // 2
        image = F.pad(image, (left, resolution - rw - left, top, resolution - rh - top), value=pad_value)
    return image * 2.0 - 1.0


def backbone_key_rules(heads: list[str]) -> list[tuple[str, Optional[str]]]:
    """
    Checkpoint key prefixes -> module prefixes for LeRobot (``model.`` root) and openpi (no root).

    ``heads`` are the family's own top-level projections (``action_in_proj``, ...).
    The VLM's LM head doubles as the embedding table (tied: LeRobot stores only the head,
    openpi's ``save_model`` only the embedding). The VLM's final norm and the expert's LM
    head are never used, so they are skipped, never materialised.
    """
    rules: list[tuple[str, Optional[str]]] = []
    for root in ("model.", ""):
        pg = f"{root}paligemma_with_expert.paligemma."
        ex = f"{root}paligemma_with_expert.gemma_expert."
        rules += [
            (f"{pg}model.vision_tower.vision_model.", "vlm.vision_tower."),
            (f"{pg}model.multi_modal_projector.linear.", "vlm.multi_modal_projector."),
            (f"{pg}model.language_model.embed_tokens.", "vlm.embed_tokens."),
            (f"{pg}lm_head.", "vlm.embed_tokens."),
            (f"{pg}model.language_model.norm.", None),
            (f"{pg}model.language_model.layers.", "vlm.layers."),
            (f"{ex}lm_head.", None),
            (f"{ex}model.layers.", "expert.layers."),
            (f"{ex}model.norm.", "expert.norm."),
        ]
        rules += [(f"{root}{head}.", f"{head}.") for head in heads]
    return rules


BACKBONE_FLOAT32 = ("vlm.vision_tower", "vlm.multi_modal_projector", "input_layernorm",
                    "post_attention_layernorm", "expert.norm")
"""Fragments of module names kept in float32 when the rest runs in bfloat16: the vision path
and every norm, as LeRobot does; each family adds its time and action projections."""
