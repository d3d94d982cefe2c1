# SPDX-License-Identifier: Apache-2.0
"""
Which sender a robot's session belongs to, on the server: bookkeeping that expires.

A robot draws a random session when it starts and sends every request of that run from one
DDS publisher. The server binds the session (robot name, session) to the publisher its first
request came from and serves that session only from it: a copy of the robot's request
re-published by anyone else (a forged state under the robot's exact key) is refused
unanswered. Entries unheard for ``ttl`` seconds are forgotten and at most ``capacity`` are
kept (the longest unheard goes first), so a stream of new robot names or sessions never grows
the server's memory. Plain Python: no ROS, no clock of its own.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Session:
    sender: str
    seen_at: float
    noted: bool = False     # something logged once per session (cameras served masked)


class SessionTable:
    """(robot, session) -> the sender it started with, forgotten after ``ttl`` s unheard."""

    def __init__(self, ttl: float = 60.0, capacity: int = 4096) -> None:
        if ttl <= 0 or capacity < 1:
            raise ValueError(f'ttl must be > 0 s and capacity >= 1, got {ttl}, {capacity}')
        self.ttl = ttl
        self.capacity = capacity
        self._sessions: OrderedDict[tuple[str, str], _Session] = OrderedDict()   # least recently heard first

    def __len__(self) -> int:
        return len(self._sessions)

    def admit(self, robot: str, session: str, sender: str, now: float) -> bool:
        """
        Tell whether ``sender`` may send for this session: True for the sender it started with.

        The first request of a session (or of one forgotten) binds it to its sender.
        """
        self.expire(now)
        key = (robot, session)
        entry = self._sessions.get(key)
        if entry is None:
            entry = self._sessions[key] = _Session(sender, now)
            while len(self._sessions) > self.capacity:
                self._sessions.popitem(last=False)
            return True
        if entry.sender != sender:
            return False
        entry.seen_at = now
        self._sessions.move_to_end(key)
        return True

    def note_once(self, robot: str, session: str) -> bool:
        """Return True the first time it is asked for an admitted session (then False)."""
        entry = self._sessions.get((robot, session))
        if entry is None or entry.noted:
            return False
        entry.noted = True
        return True

    def expire(self, now: float) -> None:
        """Forget sessions unheard for longer than ``ttl``."""
        while self._sessions:
            key, entry = next(iter(self._sessions.items()))
            if now - entry.seen_at <= self.ttl:
                return
            del self._sessions[key]
