# SPDX-License-Identifier: Apache-2.0
"""
A subscription read once per control tick instead of once per message.

rclpy's executors cost a few hundred microseconds of Python per delivered message, so a 1 kHz
joint-state publisher alone kept a third of a core busy and starved the control timer. This
subscription lives on a small helper node that no executor spins: the messages wait in the
DDS history (``depth`` of them, newest kept) and the control tick takes them, raw, in one
loop; only the newest ones it needs are decoded. The work per tick is bounded by ``depth``,
whatever the publisher's rate.
"""

from __future__ import annotations

import time
from typing import Any

from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.serialization import deserialize_message


class PolledSubscription:
    """Raw messages of one topic, taken when asked, with their arrival times."""

    def __init__(self, owner: Node, msg_type: Any, topic: str, qos: QoSProfile, suffix: str) -> None:
        # The helper takes no process arguments (a `__node:=` remap would give it the owner's
        # name); the topic is resolved by the owner, so the owner's remaps apply to it.
        self._node = Node(f'{owner.get_name()}_{suffix}', namespace=owner.get_namespace(),
                          context=owner.context, use_global_arguments=False,
                          start_parameter_services=False, enable_rosout=False)
        self._msg_type = msg_type
        self._subscription = self._node.create_subscription(
            msg_type, owner.resolve_topic_name(topic), lambda _: None, qos, raw=True)

    @property
    def topic_name(self) -> str:
        """Return the fully qualified topic the subscription reads."""
        return self._subscription.topic_name

    def take_all(self) -> list[tuple[bytes, float]]:
        """Every message waiting, oldest first, as (raw CDR, seconds since it was received)."""
        messages = []
        handle = self._subscription.handle
        with handle:
            while (taken := handle.take_message(self._msg_type, True)) is not None:
                raw, info = taken
                messages.append((raw, info.get('received_timestamp', 0)))
        wall_ns = time.time_ns()
        return [(raw, max(0.0, (wall_ns - received) * 1e-9) if received else 0.0)
                for raw, received in messages]

    def decode(self, raw: bytes) -> Any:
        """Deserialize one raw message of this topic's type."""
        return deserialize_message(raw, self._msg_type)

    def destroy(self) -> None:
        """Destroy the helper node and its subscription."""
        self._node.destroy_node()
