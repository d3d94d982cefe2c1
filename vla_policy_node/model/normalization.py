# SPDX-License-Identifier: Apache-2.0
"""
State/action (un)normalization from LeRobot or openpi statistics.

Modes follow LeRobot's ``NormalizerProcessorStep``: MEAN_STD, MIN_MAX,
QUANTILES (q01/q99), QUANTILE10 (q10/q90) and IDENTITY. Statistics are
checked strictly: a missing statistic or a length that differs from the
feature's is an error at load time, not a silent broadcast at run time.

Two conventions, because the frameworks differ in the last bits:

- ``lerobot`` (``NormalizerProcessorStep``): float32, ``(x - mean) / (std + eps)``
  but ``x * std + mean`` back, and quantile spans get ``eps`` only where they are 0.
- ``openpi`` (``openpi.transforms.Normalize`` / ``Unnormalize``): float64 (its
  ``norm_stats.json`` loads as float64), ``eps`` always added to the divisor and to the
  multiplier: ``(x - mean) / (std + eps)``, ``(x - q01) / (q99 - q01 + eps) * 2 - 1``.
  On a 0.01-wide joint the two differ by up to 2e-4, enough to move a pi0.5 state bin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_STATS_FOR_MODE = {
    "IDENTITY": (),
    "MEAN_STD": ("mean", "std"),
    "MIN_MAX": ("min", "max"),
    "QUANTILES": ("q01", "q99"),
    "QUANTILE10": ("q10", "q90"),
}
CONVENTIONS = ("lerobot", "openpi")


@dataclass(frozen=True)
class Normalizer:
    """Maps one feature (state or action) to and from the model's normalized space."""

    mode: str
    stats: dict[str, np.ndarray]
    eps: float = 1e-8
    convention: str = "lerobot"       # lerobot | openpi (see module docstring)

    def __post_init__(self) -> None:
        if self.convention not in CONVENTIONS:
            raise ValueError(f"unknown normalization convention {self.convention!r}; known: {CONVENTIONS}")
        if self.mode not in _STATS_FOR_MODE:
            raise ValueError(f"unknown normalization mode {self.mode!r}; known: {sorted(_STATS_FOR_MODE)}")
        needed = _STATS_FOR_MODE[self.mode]
        missing = [k for k in needed if k not in self.stats]
        if missing:
            raise ValueError(f"{self.mode} normalization needs statistics {missing}; have {sorted(self.stats)}")
        sizes = {np.asarray(self.stats[k]).shape for k in needed}
        if len(sizes) > 1:
            raise ValueError(f"{self.mode} statistics have different shapes: {sorted(sizes)}")
        for k in needed:
            if not np.all(np.isfinite(self.stats[k])):
                raise ValueError(f"normalization statistic {k!r} holds non-finite values")

    @property
    def dim(self) -> int | None:
        needed = _STATS_FOR_MODE[self.mode]
        return None if not needed else int(np.asarray(self.stats[needed[0]]).shape[-1])

    def _low_span(self) -> tuple[np.ndarray, np.ndarray]:
        lo_key, hi_key = _STATS_FOR_MODE[self.mode]
        lo = np.asarray(self.stats[lo_key], dtype=np.float32)
        span = np.asarray(self.stats[hi_key], dtype=np.float32) - lo
        return lo, np.where(span == 0, np.float32(self.eps), span).astype(np.float32)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """Map raw robot units (..., D) to normalized values (..., D): float32 (float64 for openpi)."""
        if self.convention == "openpi":
            return self._openpi(np.asarray(x, dtype=np.float64), inverse=False)
        x = np.asarray(x, dtype=np.float32)
        self._check(x)
        if self.mode == "IDENTITY":
            return x
        if self.mode == "MEAN_STD":
            mean = np.asarray(self.stats["mean"], dtype=np.float32)
            std = np.asarray(self.stats["std"], dtype=np.float32)
            return (x - mean) / (std + np.float32(self.eps))
        lo, span = self._low_span()
        return np.float32(2.0) * (x - lo) / span - np.float32(1.0)

    def unnormalize(self, x: np.ndarray) -> np.ndarray:
        """Map normalized values (..., D) back to raw robot units (..., D), float32."""
        if self.convention == "openpi":
            return self._openpi(np.asarray(x, dtype=np.float64), inverse=True).astype(np.float32)
        x = np.asarray(x, dtype=np.float32)
        self._check(x)
        if self.mode == "IDENTITY":
            return x
        if self.mode == "MEAN_STD":
            return x * np.asarray(self.stats["std"], np.float32) + np.asarray(self.stats["mean"], np.float32)
        lo, span = self._low_span()
        return (x + np.float32(1.0)) * span / np.float32(2.0) + lo

    def _openpi(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        """Apply openpi's float64 arithmetic, the epsilon always added (``transforms.Normalize``)."""
        self._check(x)
        if self.mode == "IDENTITY":
            return x
        eps = self.eps
        if self.mode == "MEAN_STD":
            mean = np.asarray(self.stats["mean"], np.float64)
            std = np.asarray(self.stats["std"], np.float64)
            return x * (std + eps) + mean if inverse else (x - mean) / (std + eps)
        lo_key, hi_key = _STATS_FOR_MODE[self.mode]
        lo = np.asarray(self.stats[lo_key], np.float64)
        hi = np.asarray(self.stats[hi_key], np.float64)
        if inverse:
            return (x + 1.0) / 2.0 * (hi - lo + eps) + lo
        return (x - lo) / (hi - lo + eps) * 2.0 - 1.0

    def _check(self, x: np.ndarray) -> None:
        if self.dim is not None and x.shape[-1] != self.dim:
            raise ValueError(f"feature has {x.shape[-1]} values but the {self.mode} statistics have {self.dim}")
