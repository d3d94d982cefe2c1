# SPDX-License-Identifier: Apache-2.0
"""
The latest value of every input stream, when it arrived, and whether it may drive a command.

Every input is judged by when it was observed on the loop's clock (sim time when the node
uses it): its arrival, or its header stamp where that is earlier and trusted. A stream that
stops is stale ``max_observation_age`` after that, whatever later stamps say. Camera
frames and joint states are also judged by their header stamps when the loop is told to trust
them (``use_header_stamps``): a stamp that goes backwards (out of order) or is older than
``max_observation_age`` (late data that arrived on time) is refused, and so is one further
ahead of the loop's clock than that age, with a message saying the clocks disagree. Zero
stamps (drivers that do not stamp) are judged by arrival alone. An accepted input was
observed at the earlier of its arrival and its stamp: actions age from that
(``oldest_input``), so a frame that spent 0.4 s in transit leaves its actions 0.4 s less.

A refused message marks its stream faulted until good data replaces it, so a stream that
turns bad stops commands at once instead of after ``max_observation_age``. A camera fault
clears with the next good frame; a joint-state fault only once every joint has been given
again by finite, well-stamped messages (one complete message, or several partial ones from
split publishers): an empty or partial message cannot clear it. Messages without positions
(velocity- or effort-only publishers) are not joint positions at all: they are ignored, and
so are messages naming none of the configured joints (another device on the same topic,
however malformed), which are counted. Not thread-safe: the control loop calls it under its
lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import math
from typing import Any

import numpy as np

from vla_policy_node.control.health import ERROR, InputHealth, OK, WARN
from vla_policy_node.control.safety import is_fresh, stamp_problem

JOINT_STATES = 'joint_states'
INSTRUCTION = 'instruction'
# Far more joints than any robot has, few enough that checking a message stays cheap under
# the loop's lock; a larger message is refused unread.
MAX_JOINT_STATE_NAMES = 4096
MAX_REPORTED_UNKNOWN = 100      # unconfigured joint names remembered (and logged once each)
NAME_WIDTH = 64                 # characters of a name kept in logs, faults and memory


def preview(names: Sequence[str], count: int = 8) -> str:
    """
    Show at most ``count`` names, each cut to ``NAME_WIDTH`` characters, for a log or a fault.

    Names come from other processes: one hostile message must not make a megabyte log line.
    """
    shown = [repr(name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH] + '...')
             for name in names[:count]]
    more = f', ... {len(names) - count} more' if len(names) > count else ''
    return f"[{', '.join(shown)}{more}]"


def newly_unknown(unknown: Sequence[str], reported: set[str],
                  limit: int = MAX_REPORTED_UNKNOWN) -> list[str]:
    """
    Return the names of ``unknown`` not in ``reported`` yet (cut to ``NAME_WIDTH``), adding them.

    Each unconfigured name is logged once; ``reported`` stops growing at ``limit`` names, so a
    publisher inventing names cannot grow it (or the log) without end.
    """
    new = []
    for name in unknown:
        if len(reported) >= limit:
            break
        name = name[:NAME_WIDTH]
        if name not in reported:
            reported.add(name)
            new.append(name)
    return sorted(new)


def unknown_joints_line(unknown: Sequence[str], reported: set[str]) -> str | None:
    """Return the log line for the names of ``unknown`` not reported yet (``newly_unknown``), or None."""
    new = newly_unknown(unknown, reported)
    if not new:
        return None
    full = len(reported) >= MAX_REPORTED_UNKNOWN
    return f'ignoring joints not in joint_names: {preview(new)}' + (' (no further names are reported)' if full else '')


@dataclass(frozen=True)
class JointStateUpdate:
    """
    The state vector after merging one joint-state message.

    positions: (J,) in configured order; updated: (J,) bool, the joints this message named;
    unknown_joints: names in the message that the loop does not drive.
    """

    positions: np.ndarray
    updated: np.ndarray
    unknown_joints: tuple[str, ...]


def merge_joint_state(names: Sequence[str], positions: Sequence[float],
                      joint_order: Sequence[str], current: np.ndarray) -> JointStateUpdate:
    """
    Write a message's positions into a copy of ``current`` (J,) in ``joint_order``.

    Publishers split joints over several messages and order them as they like, so a message
    may name any subset of the joints in any order; joints it does not name keep their value
    in ``current`` (NaN until first seen). Only the configured joints' entries are checked:
    other devices may share the topic, so names outside ``joint_order`` are reported, not
    checked, and a message naming none of the joints changes nothing (``updated`` all False)
    however malformed it is. A message that names a joint is rejected whole (ValueError) for
    a NaN or infinite position of a configured joint, a configured name given twice, or a
    count of positions that differs from the count of names. One with more than
    ``MAX_JOINT_STATE_NAMES`` names is rejected unread.
    """
    if len(names) > MAX_JOINT_STATE_NAMES:
        raise ValueError(f'joint state has {len(names)} names, more than {MAX_JOINT_STATE_NAMES}: '
                         'refused unread')
    index = {name: i for i, name in enumerate(joint_order)}
    merged = np.array(current, dtype=np.float64, copy=True)
    updated = np.zeros(len(joint_order), dtype=bool)
    ours = [(k, index[name]) for k, name in enumerate(names) if name in index]
    unknown = tuple(name for name in names if name not in index)
    if not ours:
        return JointStateUpdate(positions=merged, updated=updated, unknown_joints=unknown)
    if len(positions) != len(names):
        raise ValueError(f'joint state has {len(names)} names but {len(positions)} positions')
    duplicated = []
    for k, joint in ours:
        if updated[joint]:
            duplicated.append(names[k])
            continue
        value = positions[k]
        if not math.isfinite(value):
            raise ValueError(f"joint state position of '{names[k]}' is not finite ({value})")
        merged[joint] = float(value)
        updated[joint] = True
    if duplicated:
        raise ValueError(f'joint state names are duplicated: {preview(sorted(set(duplicated)))}')
    return JointStateUpdate(positions=merged, updated=updated, unknown_joints=unknown)


class ObservationBuffer:
    """Cameras by configured name, joint positions in configured order, and the instruction."""

    def __init__(self, camera_names: Sequence[str], joint_names: Sequence[str]) -> None:
        self._camera_names = tuple(camera_names)
        self._joint_names = tuple(joint_names)
        self._images: dict[str, np.ndarray] = {}
        self._header_stamps: dict[str, float] = {}
        # When each input was observed: the earlier of its arrival and its header stamp. Health
        # and ages count from it, so a message that arrived late is stale that much sooner.
        self._image_observed: dict[str, float] = {}
        self._positions = np.full(len(joint_names), np.nan)
        self._joint_headers = np.full(len(joint_names), np.nan)      # header stamp, per joint
        self._joint_observed = np.full(len(joint_names), np.nan)     # earlier of arrival and header
        self._ignored_joint_states = 0
        self._joints_to_clear = np.zeros(len(joint_names), dtype=bool)
        self._instruction: str | None = None
        self._no_instruction = 'no instruction received'    # the health of the missing instruction
        self._errors: dict[str, str] = {}

    @property
    def positions(self) -> np.ndarray:
        """Return joint positions in configured order (NaN where never received); a copy."""
        return self._positions.copy()

    @property
    def instruction(self) -> str | None:
        """Return the current task, or None before the first valid instruction."""
        return self._instruction

    @property
    def counters(self) -> dict[str, int]:
        """Return the buffer's counters for diagnostics: messages ignored for naming no joint."""
        return {'joint_states_without_configured_joints': self._ignored_joint_states}

    def set_image(self, camera: str, rgb: np.ndarray, now: float, stamp: float | None = None,
                  max_age: float = math.inf) -> str | None:
        """
        Store a validated (H, W, 3) uint8 frame of ``camera`` received at ``now``.

        ``stamp`` is its header time on the loop's clock, or None to judge it by arrival
        only. Returns why the frame was refused by its stamp (nothing is stored; the caller
        marks the camera faulted), or None when it was stored.
        """
        if stamp is not None:
            previous = self._header_stamps.get(camera)
            if previous is not None and previous - now > max_age:
                previous = None  # the loop's clock jumped back (a restarted simulation)
            problem = stamp_problem(stamp, previous, now, max_age)
            if problem is not None:
                return problem
            self._header_stamps[camera] = stamp
        self._images[camera] = rgb
        self._image_observed[camera] = now if stamp is None else min(now, stamp)
        self._errors.pop(camera, None)
        return None

    def set_joint_state(self, names: Sequence[str], positions: Sequence[float], now: float,
                        stamp: float | None = None,
                        max_age: float = math.inf) -> tuple[str | None, tuple[str, ...]]:
        """
        Merge one joint-state message received at ``now`` (``stamp``: its header time or None).

        Returns (why it was refused or None, the names it carried that are not configured).
        A refused message changes no position; the caller marks the stream faulted. One naming
        none of the configured joints is only counted. Raises ValueError for a malformed
        message (see ``merge_joint_state``).
        """
        update = merge_joint_state(names, positions, self._joint_names, self._positions)
        if not update.updated.any():
            self._ignored_joint_states += 1
            return None, update.unknown_joints
        if stamp is not None:
            previous = self._joint_headers[update.updated]
            newest = float(np.nanmax(previous)) if not np.all(np.isnan(previous)) else None
            if newest is not None and newest - now > max_age:
                newest = None  # the loop's clock jumped back
            problem = stamp_problem(stamp, newest, now, max_age)
            if problem is not None:
                return problem, update.unknown_joints
            self._joint_headers[update.updated] = stamp
        self._positions = update.positions
        self._joint_observed[update.updated] = now if stamp is None else min(now, stamp)
        if JOINT_STATES in self._errors:
            self._joints_to_clear &= ~update.updated
            if not self._joints_to_clear.any():
                del self._errors[JOINT_STATES]
        return None, update.unknown_joints

    def set_instruction(self, text: str) -> bool:
        """Store a validated instruction; True when it differs from the previous one."""
        changed = self._instruction is not None and text != self._instruction
        self._instruction = text
        self._errors.pop(INSTRUCTION, None)
        return changed

    def clear_instruction(self, why: str) -> None:
        """Forget the task (a goal that ended): the instruction stream waits for a new one, saying ``why``."""
        self._instruction = None
        self._no_instruction = why

    def reject(self, stream: str, reason: str) -> None:
        """Mark ``stream`` faulted with ``reason`` until good data replaces it."""
        self._errors[stream] = reason
        if stream == JOINT_STATES:
            self._joints_to_clear[:] = True

    def health(self, now: float, max_age: float) -> list[InputHealth]:
        """One entry per stream: OK, WARN (stale or not yet received) or ERROR (faulted)."""
        report = [self._camera_health(name, now, max_age) for name in self._camera_names]
        report.append(self._joint_health(now, max_age))
        if INSTRUCTION in self._errors:
            report.append(InputHealth(INSTRUCTION, ERROR, self._errors[INSTRUCTION]))
        elif self._instruction is None:
            report.append(InputHealth(INSTRUCTION, WARN, self._no_instruction))
        else:
            report.append(InputHealth(INSTRUCTION, OK, f'task: {self._instruction[:80]}'))
        return report

    def problem(self, now: float, max_age: float) -> str | None:
        """
        Say why no command may be sent now, or None when every stream is OK.

        The worst stream is named first (a fault before a stale or missing stream, so a stale
        camera cannot hide a faulted joint state), then the other unhealthy ones.
        """
        unhealthy = sorted((health for health in self.health(now, max_age) if health.level != OK),
                           key=lambda health: -health.level)
        if not unhealthy:
            return None
        worst, others = unhealthy[0], unhealthy[1:]
        also = f" (also unhealthy: {', '.join(health.name for health in others)})" if others else ''
        return f'{worst.name}: {worst.message}{also}'

    def fresh_positions(self, now: float, max_age: float) -> np.ndarray | None:
        """Return the measured positions (J,) if every joint is fresh and unfaulted, else None."""
        if self._joint_health(now, max_age).level != OK:
            return None
        return self._positions.copy()

    def last_positions(self) -> np.ndarray | None:
        """Return the last accepted positions (J,), however old, or None until every joint was given."""
        return None if np.isnan(self._positions).any() else self._positions.copy()

    def oldest_input(self) -> float:
        """
        Return when the oldest camera frame or joint position in the observation was observed.

        Each input counts from the earlier of its arrival and its header stamp (when stamps
        are trusted): actions age from it, so time in transit is not granted twice.
        """
        return float(min([self._image_observed[name] for name in self._camera_names]
                         + self._joint_observed.tolist()))

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
        observed = self._image_observed.get(name)
        if observed is None:
            return InputHealth(name, WARN, 'no image received')
        age = now - observed
        if not is_fresh(observed, now, max_age):
            return InputHealth(name, WARN, f'stale: last image {age:.3f} s ago', age)
        return InputHealth(name, OK, 'ok', age)

    def _joint_health(self, now: float, max_age: float) -> InputHealth:
        if JOINT_STATES in self._errors:
            return InputHealth(JOINT_STATES, ERROR, self._errors[JOINT_STATES])
        never = [n for n, s in zip(self._joint_names, self._joint_observed) if np.isnan(s)]
        if never:
            return InputHealth(JOINT_STATES, WARN, f'no position received for {never}')
        age = float(now - np.min(self._joint_observed))
        stale = [n for n, s in zip(self._joint_names, self._joint_observed)
                 if not is_fresh(float(s), now, max_age)]
        if stale:
            return InputHealth(JOINT_STATES, WARN, f'stale: {stale}', age)
        return InputHealth(JOINT_STATES, OK, 'ok', age)
