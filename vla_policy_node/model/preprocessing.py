# SPDX-License-Identifier: Apache-2.0
"""
Inference-only preprocessing: camera frames, prompt tokens and state -> ``ModelInputs``.

No augmentation and no guessing of channel layout: frames are uint8 RGB
``(H, W, 3)`` (or ``(B, H, W, 3)``), as the ROS conversion produces them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vla_policy_node.model.normalization import Normalizer
from vla_policy_node.model.tokenizer import Prompt
from vla_policy_node.model.types import ModelInputs

IMAGE_PREFIX = "observation.images."
MAX_TASK_CHARS = 4096

PromptFn = Callable[[str, np.ndarray], Prompt]
"""(task, normalized state (state_dim,), not padded) -> the text (or segments) the tokenizer sees.

The state has the normalizer's precision: float32 for LeRobot, float64 for openpi (whose
normalization runs in float64), so that pi0.5's state bins match the framework's exactly."""

ImageTransform = Callable[[Tensor], Tensor]
"""(B, 3, H, W) float in [0, 1] -> (B, 3, S, S) in the model's range, at the model resolution."""


def resize_with_pad(img: Tensor, height: int, width: int, pad_value: float) -> Tensor:
    """
    Keep aspect ratio, bilinear resize (no antialias), pad on the left and top.

    img (B, C, H, W) float in [0, 1] -> (B, C, height, width). LeRobot's SmolVLA and
    pi0 do exactly this; the pad value is in the same [0, 1] space.
    """
    cur_h, cur_w = img.shape[-2:]
    ratio = max(cur_w / width, cur_h / height)
    new_h, new_w = max(1, int(cur_h / ratio)), max(1, int(cur_w / ratio))   # a 1-pixel-high frame stays 1 high
    if (new_h, new_w) != (cur_h, cur_w):
        img = F.interpolate(img, size=(new_h, new_w), mode="bilinear", align_corners=False)
    return F.pad(img, (max(0, width - new_w), 0, max(0, height - new_h), 0), value=pad_value)


def smolvla_image(height: int, width: int) -> ImageTransform:
    """SmolVLA: pad with 0 (black) on the left and top, then map [0, 1] -> [-1, 1]."""
    return lambda img: resize_with_pad(img, height, width, 0.0) * 2.0 - 1.0


def camera_key(name: str) -> str:
    """Accept the short camera name ("top") as well as the feature name."""
    return name if name.startswith(IMAGE_PREFIX) else IMAGE_PREFIX + name


def newline_prompt(task: str, state: Optional[np.ndarray]) -> str:
    """Build the SmolVLA and pi0 prompt: the task, ending in a newline (LeRobot's new-line step); no state."""
    return task if task.endswith("\n") else task + "\n"


def stack_observations(observations: Sequence[Mapping]) -> dict:
    """
    Stack single observations into one batch: images (B, H, W, 3) per camera, state (B, D), tasks.

    Raises ValueError when they do not give the same cameras with frames of one size.
    """
    cameras = set(observations[0].get("images") or {})
    for index, observation in enumerate(observations):
        if set(observation.get("images") or {}) != cameras:
            raise ValueError(f"observation {index} has cameras {sorted(observation.get('images') or {})}, "
                             f"the first {sorted(cameras)}: a batch needs the same cameras")
    images = {}
    for name in sorted(cameras):
        frames = [np.asarray(observation["images"][name]) for observation in observations]
        if len({frame.shape for frame in frames}) != 1:
            raise ValueError(f"camera {name!r}: frames of different shapes {sorted({f.shape for f in frames})} "
                             "cannot share a batch")
        images[name] = np.stack(frames)
    states = [np.asarray(observation.get("state"), dtype=np.float32) for observation in observations]
    if len({state.shape for state in states}) != 1:
        raise ValueError(f"states of different shapes {sorted({s.shape for s in states})} cannot share a batch")
    tasks = [observation.get("task") for observation in observations]
    return {"images": images, "state": np.stack(states), "task": tasks}


@dataclass
class Preprocessor:
    """Observation dict -> ``ModelInputs`` for one family and checkpoint."""

    camera_names: tuple[str, ...]           # feature names, model order
    image_size: tuple[int, int]             # (height, width) at the model
    image_transform: ImageTransform         # the family's resize / pad / range mapping
    tokenizer: Callable[[Sequence[Prompt], int, str, str], tuple[np.ndarray, np.ndarray]]
    max_length: int
    padding: str
    prompt: PromptFn
    state_normalizer: Normalizer
    state_dim: int
    max_state_dim: int
    state_in_prefix: bool = True            # False: the state is only in the prompt (pi0.5)
    empty_cameras: int = 0                  # extra all-masked cameras after the real ones
    padding_side: str = "right"             # where prompt padding goes (LeRobot's tokenizer step setting)
    camera_renames: Mapping[str, str] = field(default_factory=dict)   # given feature -> policy feature
    # Where frames are converted and resized: the model's device, so that a GPU policy uploads
    # the uint8 frame (a quarter of the float32 bytes) and resizes it there, not on the CPU.
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _last_tokens: Optional[tuple[tuple, tuple[np.ndarray, np.ndarray]]] = field(
        default=None, init=False, repr=False, compare=False)

    def __call__(self, observation: Mapping) -> ModelInputs:
        images, batch = self._images(observation.get("images"))
        state = self._state(observation.get("state"), batch)
        tasks = self._tasks(observation.get("task"), batch)
        padded = np.zeros((batch, self.max_state_dim), dtype=np.float32)
        with np.errstate(over="ignore"):
            normalized = self.state_normalizer.normalize(state)       # (B, state_dim)
            padded[:, :self.state_dim] = normalized
        if not np.all(np.isfinite(padded)):
            raise ValueError("state overflows float32 once normalized")
        prompts = [self.prompt(t, normalized[i]) for i, t in enumerate(tasks)]
        ids, mask = self._tokenize(prompts)
        return ModelInputs(
            images=[im for im, _ in images],
            image_masks=[m for _, m in images],
            tokens=torch.from_numpy(ids),
            token_mask=torch.from_numpy(mask),
            state=torch.from_numpy(padded) if self.state_in_prefix else None,
        )

    def _tokenize(self, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Tokenize, reusing the last result: the instruction rarely changes within an episode."""
        key = (tuple(prompts), id(self.tokenizer), self.max_length, self.padding, self.padding_side)
        last = self._last_tokens
        if last is None or last[0] != key:
            last = self._last_tokens = (key, self.tokenizer(prompts, self.max_length, self.padding,
                                                            self.padding_side))
        ids, mask = last[1]
        return ids.copy(), mask.copy()

    def _images(self, images: Optional[Mapping]) -> tuple[list[tuple[Tensor, Tensor]], int]:
        if not isinstance(images, Mapping):
            raise ValueError("observation['images'] must map camera names to uint8 (H, W, 3) arrays")
        given = {camera_key(k): np.asarray(v) for k, v in images.items()}
        given = {self.camera_renames.get(k, k): v for k, v in given.items()}
        unknown = sorted(set(given) - set(self.camera_names))
        if unknown:
            raise ValueError(f"unknown cameras {unknown}; the policy expects {list(self.camera_names)}")
        if not given:
            raise ValueError(f"no camera image; the policy expects {list(self.camera_names)}")
        batches = set()
        for name, arr in given.items():
            if arr.dtype != np.uint8 or arr.ndim not in (3, 4) or arr.shape[-1] != 3 or 0 in arr.shape:
                raise ValueError(f"camera {name}: expected uint8 (H, W, 3) or (B, H, W, 3), "
                                 f"got {arr.dtype} {arr.shape}")
            batches.add(1 if arr.ndim == 3 else arr.shape[0])
        if len(batches) != 1:
            raise ValueError(f"cameras disagree on the batch size: {sorted(batches)}")
        batch = batches.pop()
        out = []
        for name in self.camera_names:
            if name not in given:       # masked: its tokens are excluded from attention
                out.append(self._empty_camera(batch))
                continue
            arr = given[name] if given[name].ndim == 4 else given[name][None]
            frames = torch.from_numpy(np.ascontiguousarray(arr)).to(self.device)          # (B, H, W, 3) uint8
            img = frames.permute(0, 3, 1, 2).float() / 255.0
            out.append((self.image_transform(img), torch.ones(batch, dtype=torch.bool, device=self.device)))
        for _ in range(self.empty_cameras):
            out.append(self._empty_camera(batch))
        return out, batch

    def _empty_camera(self, batch: int) -> tuple[Tensor, Tensor]:
        """Return a missing camera's image and mask: -1 everywhere, masked out of attention."""
        h, w = self.image_size
        return (torch.full((batch, 3, h, w), -1.0, device=self.device),
                torch.zeros(batch, dtype=torch.bool, device=self.device))

    def _state(self, state: object, batch: int) -> np.ndarray:
        """-> (B, state_dim) float64, as given: openpi normalizes in float64; LeRobot's normalizer casts."""
        if state is None:
            raise ValueError("observation['state'] is missing")
        arr = np.asarray(state, dtype=np.float64)
        arr = arr[None] if arr.ndim == 1 else arr
        if arr.shape != (batch, self.state_dim):
            raise ValueError(f"state must be ({self.state_dim},) or ({batch}, {self.state_dim}), "
                             f"got {np.shape(state)}")
        with np.errstate(over="ignore"):
            as_float32 = arr.astype(np.float32)   # a finite float64 beyond float32's range becomes inf here
        if not np.all(np.isfinite(as_float32)):
            raise ValueError("state holds non-finite values (or values beyond float32's range)")
        return arr

    def _tasks(self, task: Union[str, Sequence[str], None], batch: int) -> list[str]:
        if isinstance(task, str):
            tasks = [task] * batch
        elif isinstance(task, (list, tuple, np.ndarray)):
            tasks = list(task)
        else:
            raise ValueError(f"observation['task'] must be a str or a list of {batch} str, "
                             f"got {type(task).__name__}")
        if len(tasks) != batch or not all(isinstance(t, str) for t in tasks):
            raise ValueError(f"observation['task'] must be a str or a list of {batch} str")
        for t in tasks:
            if not t.strip():
                raise ValueError("task is empty")
            if len(t) > MAX_TASK_CHARS:
                raise ValueError(f"task is {len(t)} characters; the limit is {MAX_TASK_CHARS}")
        # Lone surrogates cannot be encoded to UTF-8; replace them rather than fail in the tokenizer.
        return [t.encode("utf-8", "replace").decode("utf-8") for t in tasks]
