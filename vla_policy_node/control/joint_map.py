# SPDX-License-Identifier: Apache-2.0
"""
Joint units of the training data vs the robot's: a per-joint affine map, applied at inference.

A policy acts in the units of the data it was trained on (LeRobot's SO-100/SO-101 data: body
joints in degrees or in -100..100 of the calibrated range, the gripper in 0..100), while
``/joint_states`` and the controllers speak radians (or metres). Per joint::

    policy = (ros - offset) * scale        (the state, before the policy)
    ros = policy / scale + offset          (the actions, after it)

Where it is applied matters: the control loop's safety path (limits, ``max_step``, the step
from the last command, holds) works in ROS units and must never see training units, and the
policy must never see ROS units. :class:`JointMappedInference` wraps whatever runs the policy
(the local inference thread, or a remote one, behind ``control_loop.Inference``): the
observation's state and the real-time-chunking prefix (committed actions, ROS units) go in
converted, and the chunk comes back converted before the scheduler takes it. The loop, the
scheduler and the blending therefore only ever hold ROS units; the policy only training units.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from vla_policy_node.control.chunking import ChunkRequest
from vla_policy_node.control.inference import InferenceResult


@dataclass(frozen=True)
class JointMap:
    """Per-joint ``scale`` (J,) and ``offset`` (J,): policy = (ros - offset) * scale."""

    scale: np.ndarray
    offset: np.ndarray

    def __post_init__(self) -> None:
        scale = np.array(self.scale, dtype=np.float64).reshape(-1)
        offset = np.array(self.offset, dtype=np.float64).reshape(-1)
        if scale.size != offset.size or scale.size == 0:
            raise ValueError(f'scale has {scale.size} entries and offset {offset.size}; '
                             'give one of each per joint')
        if not (np.all(np.isfinite(scale)) and np.all(np.isfinite(offset))):
            raise ValueError('scale and offset must be finite')
        if np.any(scale == 0.0):
            raise ValueError(f'scale must not be 0 (joint indices {np.flatnonzero(scale == 0).tolist()}): '
                             'the actions could not be mapped back')
        for name, value in (('scale', scale), ('offset', offset)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @classmethod
    def identity(cls, num_joints: int) -> JointMap:
        """Return the map that changes nothing (the default)."""
        return cls(np.ones(num_joints), np.zeros(num_joints))

    @classmethod
    def for_joints(cls, num_joints: int, scale: Sequence[float] | None,
                   offset: Sequence[float] | None) -> JointMap:
        """Build the map of ``num_joints`` joints; None means 1 (scale) or 0 (offset) for all."""
        scale = np.ones(num_joints) if scale is None else np.asarray(scale, dtype=np.float64)
        offset = np.zeros(num_joints) if offset is None else np.asarray(offset, dtype=np.float64)
        for name, value in (('scale', scale), ('offset', offset)):
            if value.size != num_joints:
                raise ValueError(f'{name} has {value.size} entries, expected one per joint ({num_joints})')
        return cls(scale, offset)

    @property
    def num_joints(self) -> int:
        """Return the number of joints mapped."""
        return int(self.scale.size)

    @property
    def is_identity(self) -> bool:
        """Tell whether the map changes nothing."""
        return bool(np.all(self.scale == 1.0) and np.all(self.offset == 0.0))

    def state_to_policy(self, ros: np.ndarray) -> np.ndarray:
        """Map positions (..., J) in ROS units to the policy's units."""
        return (np.asarray(ros, dtype=np.float64) - self.offset) * self.scale

    def action_to_ros(self, policy: np.ndarray) -> np.ndarray:
        """Map actions (..., J) in the policy's units to ROS units."""
        return np.asarray(policy, dtype=np.float64) / self.scale + self.offset

    def action_to_policy(self, ros: np.ndarray) -> np.ndarray:
        """Map actions (..., J) in ROS units to the policy's (absolute positions: like the state)."""
        return self.state_to_policy(ros)


class JointMappedInference:
    """
    An ``Inference`` (control_loop's protocol) whose policy works in training units.

    The wrapped inference receives the state and the RTC prefix in policy units and its
    results' chunks are mapped back to ROS units before the loop sees them.
    """

    def __init__(self, inner: Any, joint_map: JointMap) -> None:
        self._inner = inner
        self._map = joint_map

    @property
    def busy(self) -> bool:
        """Tell whether the wrapped inference has a job."""
        return self._inner.busy

    def bind(self, on_result: Callable[[InferenceResult], None]) -> None:
        """Send the wrapped inference's results to ``on_result`` in ROS units."""
        def to_ros(result: InferenceResult) -> None:
            # A chunk of another width would broadcast against the per-joint scale: it goes on
            # unmapped, and the loop refuses it for its width.
            if result.chunk is not None and np.shape(result.chunk)[-1:] == (self._map.num_joints,):
                result = replace(result, chunk=self._map.action_to_ros(result.chunk))
            on_result(result)
        self._inner.bind(to_ros)

    def submit(self, request: ChunkRequest, observation: dict[str, Any]) -> bool:
        """Queue one inference with the state (and the RTC prefix) in policy units."""
        state = np.asarray(observation['state'])
        mapped = {**observation, 'state': self._map.state_to_policy(state).astype(state.dtype)}
        if request.rtc is not None:
            prefix = self._map.action_to_policy(request.rtc.prefix)
            prefix.setflags(write=False)
            request = replace(request, rtc=replace(request.rtc, prefix=prefix))
        return self._inner.submit(request, mapped)

    def request_reset(self) -> None:
        """Reset the policy before its next inference."""
        self._inner.request_reset()


def joint_mapped(inference: Any, joint_map: JointMap) -> Any:
    """Wrap ``inference`` unless the map is the identity (then no work is added)."""
    return inference if joint_map.is_identity else JointMappedInference(inference, joint_map)
