# SPDX-License-Identifier: Apache-2.0
"""
A bounded queue between the subscriptions and the bag, and the thread that writes it.

The subscription callbacks only stamp each serialized message (its arrival, beside its publish
time) and append it (:meth:`Recording.put` never blocks and never touches the disk), so a slow
write cannot make DDS overwrite frames in the subscriptions' history; a writer thread empties
the queue into the bag. When the queue holds ``max_bytes`` (the disk cannot keep up for that
long), a new message is dropped and counted for its topic, never silently. A write that fails
(disk full, file-size limit) stops the writing: the bag is ended after its last complete chunk,
later messages count as dropped, and ``on_failure`` is told once, from the writer thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
import threading
from typing import Any

from vla_policy_node.replay.recording_bag import FLUSH_PERIOD

MAX_QUEUE_BYTES = 512 << 20     # about 9 s of two 640x480 rgb8 cameras at 30 Hz


@dataclass
class TopicCounts:
    """
    One topic's messages: arrived, written to the bag, dropped here (queue full, bag failed) and lost before.

    ``lost``: gaps in the sequence numbers of the topic's one publisher (DDS did not deliver them).
    """

    received: int = 0
    written: int = 0
    dropped: int = 0
    lost: int = 0
    last_sequence: int = 0
    single_publisher: bool = False      # gaps are counted only then: several writers interleave their numbers


class Recording:
    """Queue serialized messages from any thread; a thread of its own writes them to ``bag``."""

    def __init__(self, bag: Any, topics: Sequence[str], clock_ns: Callable[[], int],
                 on_failure: Callable[[OSError], None] = lambda error: None,
                 max_bytes: int = MAX_QUEUE_BYTES) -> None:
        """``bag``: a RecordingBag (write, tick, close, abandon); ``topics``: its channels' names, in order."""
        self.bag = bag
        self.topics = list(topics)
        self.counts = [TopicCounts() for _ in topics]
        self.error: OSError | None = None
        self.recovered: Any = None
        self._clock_ns = clock_ns
        self._on_failure = on_failure
        self._max_bytes = max_bytes
        self._queue: deque[tuple[int, int, int, bytes]] = deque()
        self._bytes = 0
        self.peak_bytes = 0
        self._last_time = 0
        self._stopping = False
        self._condition = threading.Condition()
        self._thread = threading.Thread(target=self._run, name='bag writer', daemon=True)
        self._thread.start()

    def put(self, topic: int, raw: bytes, sequence: int = 0, published: int = 0) -> None:
        """
        Stamp (the clock, never earlier than the message before) and queue; count a drop if full.

        ``sequence``: the publisher's sequence number of the message (0: unknown), for counting what DDS lost;
        ``published``: its publish time in ns, on the publisher's clock (0 or less: unknown, the log time then).
        """
        with self._condition:
            counts = self.counts[topic]
            counts.received += 1
            if sequence and counts.single_publisher and counts.last_sequence and sequence > counts.last_sequence + 1:
                counts.lost += sequence - counts.last_sequence - 1
            counts.last_sequence = sequence
            if self.error is not None or self._stopping or self._bytes + len(raw) > self._max_bytes:
                counts.dropped += 1
                return
            self._last_time = max(self._last_time, self._clock_ns())
            self._queue.append((topic, self._last_time, published if published > 0 else self._last_time, raw))
            self._bytes += len(raw)
            self.peak_bytes = max(self.peak_bytes, self._bytes)
            self._condition.notify()

    @property
    def queued_bytes(self) -> int:
        """Bytes waiting for the writer."""
        return self._bytes

    def _run(self) -> None:
        while True:
            with self._condition:
                if not self._queue and not self._stopping:
                    self._condition.wait(FLUSH_PERIOD)
                batch, stopping = list(self._queue), self._stopping
                self._queue.clear()
            try:
                for topic, log_time, published, raw in batch:
                    self.bag.write(topic, log_time, raw, published)
                    self.counts[topic].written += 1
                    with self._condition:
                        self._bytes -= len(raw)
                self.bag.tick()
            except OSError as error:
                self._fail(error)
                return
            if stopping and not batch:
                return

    def _fail(self, error: OSError) -> None:
        with self._condition:
            self.error = error          # from now on put() counts every message as dropped
            self._queue.clear()
            self._bytes = 0
        self._abandon()
        self._on_failure(error)

    def _abandon(self) -> None:
        """End the bag after its last complete chunk and count what it holds (nothing known if that fails too)."""
        try:
            self.recovered = self.bag.abandon()
        except (OSError, ValueError):
            self.recovered = None
        self._settle()

    def _settle(self) -> None:
        """Count what the ended file holds as written, and everything else that arrived as dropped."""
        held = self.recovered.counts if self.recovered is not None else {}
        with self._condition:
            for name, counts in zip(self.topics, self.counts):
                counts.written = held.get(name, 0)
                counts.dropped = counts.received - counts.written

    def close(self) -> None:
        """Write what is queued, then close the bag (its summary); OSError if that fails."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        self._thread.join()
        if self.error is None:
            try:
                self.bag.close()
            except OSError as error:
                self.error = error
                self._abandon()
