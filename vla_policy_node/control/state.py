# SPDX-License-Identifier: Apache-2.0
"""
The control loop's state, in one place: what it is doing (:class:`Mode`) and what it remembers.

``LoopState.mode`` is the one place that says whether the loop commands, holds, is latched in
a protective stop, or is stopped for good. The loop's code reads the fields below; the mode
names what they add up to (for status, logs and readers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import enum

import numpy as np

from vla_policy_node.control.health import ERROR, WARN


class Mode(enum.Enum):
    """What the loop does with the robot."""

    COMMANDING = 'commanding'   # plan actions leave through the gate every tick
    HOLDING = 'holding'         # one hold was sent; nothing more until commanding resumes
    LATCHED = 'latched'         # protective stop: walks back, then holds until an operator's restart
    STOPPED = 'stopped'         # one last hold sent; nothing ever again


@dataclass(frozen=True)
class Refusal:
    """Why nothing (or only a hold) may be commanded, and how bad that is."""

    reason: str
    level: int = WARN
    counter: str | None = None      # counted when it starts a hold


def link_problem(subscribers: int, other_publishers: int, topic: str, refused: str | None) -> Refusal | None:
    """Why the command link forbids commanding (another sender, a refused goal, nobody listening), or None."""
    if other_publishers > 0:
        return Refusal(f'{other_publishers} other publisher(s) on {topic}: refusing to '
                       'command (another node with the same name or topic?)', ERROR)
    if refused is not None:
        return Refusal(refused, ERROR)
    if subscribers == 0:
        return Refusal(f'nobody subscribes to {topic}')
    return None


@dataclass
class LoopState:
    """Everything the loop remembers between ticks (guarded by the loop's lock)."""

    joints: int
    hold_reason: str | None = 'starting'      # None: commanding
    hold_level: int = WARN
    latch: Refusal | None = None              # a protective stop (not following), until a restart
    yield_target: np.ndarray | None = None    # latched or restarting: the setpoint walks here (J,)
    restarting: bool = False                  # an operator's restart walks the setpoint to the measured state
    stopped: bool = False
    sent: np.ndarray | None = None            # the last message (T, J); point i due at
    sent_at: float = 0.0                      # sent_at + (i + 1) dt on the loop clock,
    sent_from: np.ndarray | None = None       # from this setpoint (J,) at sent_at
    unheard: np.ndarray = field(init=False)   # (J,) joints whose next command steps from measured
    commanded_at: np.ndarray | None = None    # measured when the last action left
    moved_counted: bool = False               # this refusal counted in moved_robot_refusals
    contested: bool = False                   # another publisher on a command topic
    link_problem: Refusal | None = None       # the command topic's subscribers and publishers
    policy_fault: str | None = None           # the last policy result's fault, the next hold's reason
    clock_now: float | None = None            # the loop clock at the last tick
    clock_advanced: float = 0.0               # wall time when it last moved on
    last_latency: float | None = None

    def __post_init__(self) -> None:
        self.unheard = np.zeros(self.joints, dtype=bool)

    @property
    def mode(self) -> Mode:
        """Return what the loop does now: stopped, latched, commanding or holding, in that order."""
        if self.stopped:
            return Mode.STOPPED
        if self.latch is not None:
            return Mode.LATCHED
        return Mode.COMMANDING if self.hold_reason is None else Mode.HOLDING

    @property
    def commanding(self) -> bool:
        """Tell whether the last tick commanded (no hold since)."""
        return self.hold_reason is None

    @property
    def latched(self) -> bool:
        """Tell whether a protective stop holds until an operator's restart."""
        return self.latch is not None
