# SPDX-License-Identifier: Apache-2.0
"""
Relative actions (LeRobot >= 0.5 ``use_relative_actions``, openpi's ``DeltaActions``).

A policy trained on relative actions predicts, for the masked joints, the offset from the
state it observed: LeRobot's pre-processor subtracts the **raw** state before normalizing
(``relative_actions_processor``), and its post-processor adds the raw state back after
un-normalizing (``absolute_actions_processor``)::

    model -> unnormalize -> actions[..., :A] += state[..., :A] * mask        (A = action dim)

The mask keeps a joint absolute when an ``exclude_joints`` entry, lower-cased, equals its
action name or is a substring of it ("gripper" excludes "gripper.pos"); with no names or
nothing to exclude every dim is relative. Committed actions fed back for real-time chunking
go the other way (relative to the *current* state, then normalized), as LeRobot's
``reanchor_relative_rtc_prefix`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np


def relative_mask(action_dim: int, exclude_joints: Sequence[str], action_names: Optional[Sequence[str]]
                  ) -> tuple[bool, ...]:
    """(action_dim,) True where the action is relative to the state (LeRobot's ``_build_mask``)."""
    tokens = [str(name).lower() for name in exclude_joints if name]
    if not tokens or action_names is None:
        return (True,) * action_dim
    mask = [not any(t == str(n).lower() or t in str(n).lower() for t in tokens) for n in action_names[:action_dim]]
    return tuple(mask + [True] * (action_dim - len(mask)))


@dataclass(frozen=True)
class RelativeActions:
    """The masked action dims are offsets from the observed raw state."""

    mask: tuple[bool, ...]          # (A,) True: relative

    def __post_init__(self) -> None:
        if not self.mask:
            raise ValueError("relative actions need a mask over at least one action dim")

    def _offset(self, state: np.ndarray) -> np.ndarray:
        """(B, S) raw state -> (B, 1, A) offset; the state must cover every action dim."""
        dims = len(self.mask)
        state = np.asarray(state, dtype=np.float32)
        state = state[None] if state.ndim == 1 else state
        if state.shape[-1] < dims:
            raise ValueError(f"relative actions need the state to cover all {dims} action dims, "
                             f"it has {state.shape[-1]}")
        return (state[:, :dims] * np.asarray(self.mask, dtype=np.float32))[:, None, :]

    def to_absolute(self, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """(B, T, A) un-normalized relative actions + (B, S) raw state -> absolute actions, float32."""
        return (np.asarray(actions, dtype=np.float32) + self._offset(state)).astype(np.float32)

    def to_relative(self, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """(B, T, A) absolute actions - (B, S) raw state -> relative actions, float32."""
        return (np.asarray(actions, dtype=np.float32) - self._offset(state)).astype(np.float32)
