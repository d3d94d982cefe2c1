# SPDX-License-Identifier: Apache-2.0
"""
A subscription read once per control tick instead of once per message.

rclpy's executors cost a few hundred microseconds of Python per delivered message, so a 1 kHz
joint-state publisher alone kept a third of a core busy and starved the control timer, and
each camera woke the executor for every frame although a tick uses one. This
subscription belongs to the node itself (``ros2 node info`` lists it, the node's namespace and
remaps apply) but is not registered with the node's rclpy entities, so no executor waits on it:
the messages wait in the DDS history (``depth`` of them, newest kept) and the control tick takes
them, raw, in one loop; only the newest ones it needs are decoded. The work per tick is bounded
by ``depth``, whatever the publisher's rate.
"""

from __future__ import annotations

import time
from typing import Any

from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.serialization import deserialize_message
from rclpy.type_support import check_is_valid_msg_type


class PolledSubscription:
    """Raw messages of one topic of ``owner``, taken when asked, with their arrival times."""

    def __init__(self, owner: Node, msg_type: Any, topic: str, qos: QoSProfile) -> None:
        check_is_valid_msg_type(msg_type)       # imports the type support
        self._msg_type = msg_type
        with owner.handle:
            self._subscription = _rclpy.Subscription(owner.handle, msg_type, topic, qos.get_c_qos_profile())

    @property
    def topic_name(self) -> str:
        """Return the fully qualified topic the subscription reads."""
        return self._subscription.get_topic_name()

    def take_all(self) -> list[tuple[bytes, float]]:
        """Every message waiting, oldest first, as (raw CDR, seconds since it was received)."""
        messages = []
        with self._subscription:
            while (taken := self._subscription.take_message(self._msg_type, True)) is not None:
                raw, info = taken
                messages.append((raw, info.get('received_timestamp', 0)))
        wall_ns = time.time_ns()
        return [(raw, max(0.0, (wall_ns - received) * 1e-9) if received else 0.0)
                for raw, received in messages]

    def decode(self, raw: bytes) -> Any:
        """Deserialize one raw message of this topic's type."""
        return deserialize_message(raw, self._msg_type)

    def destroy(self) -> None:
        """Destroy the subscription (before its node: it keeps the node's handle in use)."""
        self._subscription.destroy_when_not_in_use()
