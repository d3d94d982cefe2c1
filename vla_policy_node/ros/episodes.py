# SPDX-License-Identifier: Apache-2.0
"""
The node's ``~/episode`` topic: which episode runs, with which task, and how it ended.

An episode starts with a new instruction on the instruction topic (the first one, one after a
task ended, or a changed one that resets the episode), a ``~/reset_episode`` call or a
RunInstruction goal; it ends when its task ends and the robot holds (a goal's result, the
node stopping or a lifecycle node leaving active). A success detector names the episode it saw
start in its ``TaskSuccess``, so a success raised for an earlier episode is never taken for
the running one; a recorder keeps every episode's instruction.

Episodes are numbered here, from 1 for each run of the node, and never repeat within it: a
lifecycle node's new control loop at each activation counts its resets from 0 again.
"""

from __future__ import annotations

import threading

from rclpy.node import Node
from unique_identifier_msgs.msg import UUID
from vla_policy_interfaces.msg import Episode

from vla_policy_node.ros.qos import EPISODE_QOS


class Episodes:
    """Number the episodes of one node and publish their starts and ends on ``~/episode``."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._publisher = node.create_publisher(Episode, '~/episode', EPISODE_QOS)
        self._lock = threading.Lock()       # the executor's thread, and stop() on the main thread
        self._count = 0
        self._open = False                  # an episode started and has not ended
        self._instruction: str | None = None    # the loop's task as far as it was told: None after an end

    @property
    def current(self) -> int:
        """Return the number of the latest episode (0 before the first)."""
        return self._count

    def start(self, instruction: str | None, reason: str, goal_id: UUID | None = None) -> int:
        """Start a new episode (``instruction`` None: the task so far); return its number."""
        with self._lock:
            if instruction is not None:
                self._instruction = instruction
            self._count += 1
            self._open = True
            self._publish(Episode.STARTED, self._instruction or '', 0, reason, goal_id)
            return self._count

    def on_instruction(self, text: str, reset: bool) -> None:
        """Take a valid instruction of the topic; ``reset``: the loop started a new episode for it."""
        with self._lock:
            fresh = reset or self._instruction is None
            self._instruction = text
        if fresh:
            self.start(text, 'instruction topic')

    def end(self, outcome: int, reason: str, goal_id: UUID | None = None) -> None:
        """End the running episode: its task ended and the robot holds (``outcome`` 0: no goal ran)."""
        with self._lock:
            instruction, self._instruction = self._instruction, None
            if self._open:
                self._open = False
                self._publish(Episode.ENDED, instruction or '', outcome, reason, goal_id)

    def _publish(self, event: int, instruction: str, outcome: int, reason: str, goal_id: UUID | None) -> None:
        self._publisher.publish(Episode(
            event=event, stamp=self._node.get_clock().now().to_msg(), episode=self._count,
            instruction=instruction, goal_id=goal_id or UUID(), outcome=outcome, reason=reason))
