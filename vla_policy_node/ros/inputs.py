"""
The latest value of every input stream, when it arrived, and whether it may drive a command.

Every input is judged by arrival time on the node's clock (sim time when ``use_sim_time`` is
set): a stream that stops is stale after ``max_observation_age`` whatever its stamps say.
Camera frames are also judged by their header stamps when the node is told to trust them
(``use_header_stamps``, the default): a frame whose stamp goes backwards (out of order) or
is older than ``max_observation_age`` (late data that arrived on time) is refused. A stamp
further ahead of the node's clock than that age is refused too, with a message saying the
clocks disagree: a camera on another clock is a configuration error, not something to guess
around, so the node holds and says so until the clocks are synchronised or
``use_header_stamps`` is set false, which keeps the arrival-time check only. Zero stamps
(drivers that do not stamp) are judged by arrival alone.

A rejected message marks its stream faulted until a good one arrives, so a stream that turns
bad stops commands at once instead of after ``max_observation_age``. Not thread-safe: the
node calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

import numpy as np

from vla_policy_node.core.safety import is_fresh, stamp_problem
from vla_policy_node.ros.diagnostics import ERROR, InputHealth, OK, WARN

JOINT_STATES = 'joint_states'
INSTRUCTION = 'instruction'


class ObservationBuffer:
    """Cameras by configured name, joint positions in configured order, and the instruction."""

    def __init__(self, camera_names: Sequence[str], joint_names: Sequence[str]) -> None:
        self._camera_names = tuple(camera_names)
        self._joint_names = tuple(joint_names)
        self._images: dict[str, np.ndarray] = {}
        self._image_stamps: dict[str, float] = {}
        self._header_stamps: dict[str, float] = {}
        self._positions = np.full(len(joint_names), np.nan)
        self._joint_stamps = np.full(len(joint_names), np.nan)
        self._instruction: str | None = None
        self._errors: dict[str, str] = {}

    @property
    def positions(self) -> np.ndarray:
        """Return joint positions in configured order (NaN where never received); a copy."""
        return self._positions.copy()

    @property
    def instruction(self) -> str | None:
        """Return the current task, or None before the first valid instruction."""
        return self._instruction

    def set_image(self, camera: str, rgb: np.ndarray, now: float, stamp: float | None = None,
                  max_age: float = math.inf) -> str | None:
        """
        Store a validated (H, W, 3) uint8 frame of ``camera`` received at ``now``.

        ``stamp`` is its header time on the node's clock, or None to judge it by arrival
        only. Returns why the frame was refused by its stamp (nothing is stored; the caller
        marks the camera faulted), or None when it was stored.
        """
        if stamp is not None:
            previous = self._header_stamps.get(camera)
            if previous is not None and previous - now > max_age:
                previous = None  # the node's clock jumped back (a restarted simulation)
            problem = stamp_problem(stamp, previous, now, max_age)
            if problem is not None:
                return problem
            self._header_stamps[camera] = stamp
        self._images[camera] = rgb
        self._image_stamps[camera] = now
        self._errors.pop(camera, None)
        return None

    def set_positions(self, positions: np.ndarray, updated: np.ndarray, now: float) -> None:
        """Store merged joint positions; ``updated`` (J,) bool marks joints the message had."""
        self._positions = positions
        self._joint_stamps[updated] = now
        self._errors.pop(JOINT_STATES, None)

    def set_instruction(self, text: str) -> bool:
        """Store a validated instruction; True when it differs from the previous one."""
        changed = self._instruction is not None and text != self._instruction
        self._instruction = text
        self._errors.pop(INSTRUCTION, None)
        return changed

    def reject(self, stream: str, reason: str) -> None:
        """Mark ``stream`` faulted with ``reason`` until its next valid message."""
        self._errors[stream] = reason

    def health(self, now: float, max_age: float) -> list[InputHealth]:
        """One entry per stream: OK, WARN (stale or not yet received) or ERROR (faulted)."""
        report = [self._camera_health(name, now, max_age) for name in self._camera_names]
        report.append(self._joint_health(now, max_age))
        if INSTRUCTION in self._errors:
            report.append(InputHealth(INSTRUCTION, ERROR, self._errors[INSTRUCTION]))
        elif self._instruction is None:
            report.append(InputHealth(INSTRUCTION, WARN, 'no instruction received'))
        else:
            report.append(InputHealth(INSTRUCTION, OK, f'task: {self._instruction[:80]}'))
        return report

    def problem(self, now: float, max_age: float) -> str | None:
        """Why no command may be sent now (first unhealthy stream), or None when all are OK."""
        for health in self.health(now, max_age):
            if health.level != OK:
                return f'{health.name}: {health.message}'
        return None

    def observation(self) -> dict[str, Any]:
        """Return the policy input (see the policy contract); valid if ``problem`` is None."""
        return {
            'images': {name: self._images[name] for name in self._camera_names},
            'state': self._positions.astype(np.float32),
            'task': self._instruction,
        }

    def _camera_health(self, name: str, now: float, max_age: float) -> InputHealth:
        if name in self._errors:
            return InputHealth(name, ERROR, self._errors[name])
        stamp = self._image_stamps.get(name)
        if stamp is None:
            return InputHealth(name, WARN, 'no image received')
        age = now - stamp
        if not is_fresh(stamp, now, max_age):
            return InputHealth(name, WARN, f'stale: last image {age:.3f} s ago', age)
        return InputHealth(name, OK, 'ok', age)

    def _joint_health(self, now: float, max_age: float) -> InputHealth:
        if JOINT_STATES in self._errors:
            return InputHealth(JOINT_STATES, ERROR, self._errors[JOINT_STATES])
        never = [n for n, s in zip(self._joint_names, self._joint_stamps) if np.isnan(s)]
        if never:
            return InputHealth(JOINT_STATES, WARN, f'no position received for {never}')
        age = float(now - np.min(self._joint_stamps))
        stale = [n for n, s in zip(self._joint_names, self._joint_stamps)
                 if not is_fresh(float(s), now, max_age)]
        if stale:
            return InputHealth(JOINT_STATES, WARN, f'stale: {stale}', age)
        return InputHealth(JOINT_STATES, OK, 'ok', age)
