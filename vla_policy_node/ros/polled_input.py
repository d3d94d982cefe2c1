# SPDX-License-Identifier: Apache-2.0
"""
Subscriptions no executor waits on for their messages: read once per control tick, or never.

rclpy's executors cost a few hundred microseconds of Python per delivered message, so a 1 kHz
joint-state publisher alone kept a third of a core busy and starved the control timer. A
``PolledSubscription`` belongs to the node itself (``ros2 node info`` lists it, the node's namespace and
remaps apply) but is not registered with the node's rclpy entities, so no executor waits on it:
the messages wait in the DDS history (``depth`` of them, newest kept) and the control tick takes
them, raw, in one loop; only the newest ones it needs are decoded. The work per tick is bounded
by ``depth``, whatever the publisher's rate.

A ``PublisherWatch`` is such a subscription whose messages are never taken at all: the executor
waits on its matched events only. It counts the publishers of a topic as DDS matches them, however
briefly they live, and the node's own messages on that topic (it matches them too) wake nothing.
"""

from __future__ import annotations

from collections.abc import Callable
import time
from typing import Any

from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.serialization import deserialize_message
from rclpy.type_support import check_is_valid_msg_type

try:
    from rclpy.event_handler import EventHandler, QoSSubscriptionEventType, UnsupportedEventTypeError
except ImportError:             # rclpy of Humble: no matched event type (see publisher_watch)
    from rclpy.qos_event import QoSEventHandler as EventHandler, QoSSubscriptionEventType, UnsupportedEventTypeError


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


class PublisherWatch(EventHandler):
    """
    The matched events of a subscription to ``topic`` whose messages are never taken (they stay in its history).

    Added to ``owner`` as a waitable on creation; :meth:`destroy` (before the node: the
    subscription keeps its handle in use) removes it. ``matched`` gets rmw's matched status.
    """

    def __init__(self, owner: Node, msg_type: Any, topic: str, qos: QoSProfile,
                 matched: Callable[[Any], None]) -> None:
        check_is_valid_msg_type(msg_type)
        with owner.handle:
            self._subscription = _rclpy.Subscription(owner.handle, msg_type, topic, qos.get_c_qos_profile())
        try:
            super().__init__(callback_group=owner.default_callback_group, callback=matched,
                             event_type=QoSSubscriptionEventType.RCL_SUBSCRIPTION_MATCHED,
                             parent_impl=self._subscription)
        except BaseException:
            self._subscription.destroy_when_not_in_use()
            raise
        self._owner = owner
        owner.add_waitable(self)

    @property
    def topic_name(self) -> str:
        """Return the fully qualified topic watched."""
        return self._subscription.get_topic_name()

    def destroy(self) -> None:
        """Leave the node and destroy the event and the subscription (idempotent)."""
        if self in self._owner.waitables:
            self._owner.remove_waitable(self)
            super().destroy()
            self._subscription.destroy_when_not_in_use()


def publisher_watch(owner: Node, msg_type: Any, topic: str, qos: QoSProfile,
                    matched: Callable[[Any], None]) -> PublisherWatch | None:
    """Return a ``PublisherWatch``, or None where rclpy (Humble) or the rmw has no matched events."""
    try:
        return PublisherWatch(owner, msg_type, topic, qos, matched)
    except (AttributeError, UnsupportedEventTypeError):
        return None
