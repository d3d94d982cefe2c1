# SPDX-License-Identifier: Apache-2.0
"""
The latched topics' messages (the instruction, ``~/episode``) in the order they were published, not received.

A reader receives a transient-local topic's kept messages when it matches the publisher, which
can be after newer messages of the other latched topic: a recorder started mid-goal may receive
the instruction latched before the goal after the goal's episode started, and a replay in
arrival order would label the goal's frames with the old instruction. The recorder keeps
arrival order in the file (log time: a crashed bag stays readable) and writes each message's
DDS publish time (the source timestamp, as rosbag2 does) as its MCAP ``publish_time``.
Replay and export take these topics' messages by publish time (:func:`in_force`): one
published before the recording's first message applies from that message, one published
before a message that already applied is ignored. A publish time after the arrival is on
another clock (a host whose clock is ahead, a recorder on simulated time) and counts as the
arrival, so such a message can never make later ones look stale; bags without publish times
(sqlite3; earlier recordings: publish time = log time) read in arrival order, as before.
Publish times are the publishers' clocks: hosts need synchronized clocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import os
from pathlib import Path

from mcap.reader import make_reader


def in_force(messages: Sequence[tuple[int, int]], start: int) -> list[tuple[int, int]]:
    """
    Return (time, index) of the latched messages that apply, in the order they apply.

    ``messages``: (log time, publish time) of each, in ns; ``start``: the recording's first log time.
    A message applies at its publish time (no later than its log time), or at ``start`` if it was
    published before, unless a message published after it applied first.
    """
    published_at = [min(published, log_time) for log_time, published in messages]
    placed = sorted((min(log_time, max(published, start)), published, index)
                    for index, ((log_time, _), published) in enumerate(zip(messages, published_at)))
    applied: list[tuple[int, int]] = []
    newest = None
    for time, published, index in placed:
        if newest is not None and published < newest:
            continue
        newest = published
        applied.append((time, index))
    return applied


def publish_times(files: Iterable[str | os.PathLike], topics: set[str]) -> dict[tuple[str, int, bytes], int]:
    """Map (topic, log time, serialized message) of the ``topics``' messages in the MCAP ``files`` to publish times."""
    times = {}
    for path in files:
        if Path(path).suffix != '.mcap':
            continue
        with open(path, 'rb') as stream:
            for _, channel, message in make_reader(stream).iter_messages(topics=sorted(topics), log_time_order=False):
                times[channel.topic, message.log_time, bytes(message.data)] = message.publish_time
    return times
