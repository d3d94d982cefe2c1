# SPDX-License-Identifier: Apache-2.0
"""
Which policy server a robot asks: the live ones of its pool, chosen by rendezvous hashing.

A server is live while its heartbeats keep coming: one older than ``timeout`` (on the robot's
own monotonic clock, so no clock is shared) means it is lost, whether it was killed, stopped,
or cut off. A robot asks the live server that ranks highest for its name (rendezvous, or
highest-random-weight, hashing): every robot computes the same ranking without talking to
the others, the fleet splits evenly across servers, a lost server moves only its own robots
(each to its next-ranked live server), and they move back when it returns. Servers keep no
state per robot, so moving costs nothing. Plain Python: no ROS, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
import hashlib


def rendezvous(robot: str, servers: Iterable[str]) -> str | None:
    """Return the server ranking highest for ``robot`` (None without servers): stable and even."""
    return max(servers, key=lambda server: _weight(robot, server), default=None)


def _weight(robot: str, server: str) -> int:
    # blake2b, not hash(): the ranking must agree across processes (hash() is salted per run).
    digest = hashlib.blake2b(f'{robot}\0{server}'.encode(), digest_size=8).digest()
    return int.from_bytes(digest, 'big')


@dataclass
class _Beat:
    instance: str
    seen_at: float
    live: bool


class ServerPool:
    """The heartbeats of a robot's servers: which are live, which were just lost or found."""

    def __init__(self, servers: Sequence[str], timeout: float) -> None:
        if not servers or len(set(servers)) != len(servers):
            raise ValueError(f'a pool needs distinct servers, got {list(servers)}')
        if timeout <= 0:
            raise ValueError(f'timeout must be > 0 s, got {timeout}')
        self.servers = tuple(servers)
        self.timeout = timeout
        self._beats: dict[str, _Beat] = {}

    def heartbeat(self, server: str, instance: str, now: float) -> bool:
        """
        Record a heartbeat; True when it makes the server live (first seen, back, or restarted).

        A new ``instance`` (drawn by each server run) counts as found again even when no beat
        was missed: a restarted server knows nothing of the requests its predecessor took.
        """
        if server not in self.servers:
            return False
        beat = self._beats.get(server)
        found = beat is None or not beat.live or beat.instance != instance
        self._beats[server] = _Beat(instance, now, True)
        return found

    def expire(self, now: float) -> list[str]:
        """Mark servers silent for longer than ``timeout`` as lost; return the ones lost just now."""
        lost = []
        for server, beat in self._beats.items():
            if beat.live and now - beat.seen_at > self.timeout:
                beat.live = False
                lost.append(server)
        return lost

    def is_live(self, server: str, now: float) -> bool:
        """Tell whether ``server`` was heard from within ``timeout``."""
        beat = self._beats.get(server)
        return beat is not None and now - beat.seen_at <= self.timeout

    def instance(self, server: str) -> str | None:
        """Return the run of ``server`` last heard from (None: never heard)."""
        beat = self._beats.get(server)
        return None if beat is None else beat.instance

    def silence(self, server: str, now: float) -> float | None:
        """Return seconds since ``server``'s last heartbeat (None: never heard)."""
        beat = self._beats.get(server)
        return None if beat is None else now - beat.seen_at
