# SPDX-License-Identifier: Apache-2.0
"""
Who published a message: the DDS publisher of each sample, and which node owns it in the ROS graph.

On plain DDS any participant of the domain can publish on a server's topics. Each sample
arrives with its publisher's gid (``MessageInfo.publisher_gid``, rclpy of Kilted and later)
and the graph names the node that owns every publisher (``get_publishers_info_by_topic``), so:

* a robot takes answers and heartbeats of a server only from the publisher of that topic owned
  by the server's node (:class:`ServerSenders`); anything else on the topic is *foreign*
  (dropped, counted, logged at most every few seconds with its node's name);
* a server name owned by more than one publisher of a topic is *contested*: a second node
  claims to be the server (or a killed one still lingers in the graph, until DDS drops it
  at its lease), so nothing of that server is taken and the robot asks another live server
  (or holds, saying so) until one publisher is left;
* the server serves a robot's session only from the publisher it started with
  (``server/sessions.py``).

The graph is what DDS discovery says, so a participant that names its node like the server
contests it but cannot take its place; a fleet key (``server/fleet_key.py``) or SROS2 is what
authenticates. rclpy without ``publisher_gid`` (Humble, Jazzy) hands no sender: then messages
are not bound to their publisher (the robot says so once at start), contests are still seen
in the graph, and the request digest still binds every answer to its exact request.
"""

from __future__ import annotations

from collections.abc import Callable
import threading
import time
from typing import Any

from rclpy.node import Node
from rclpy.qos import QoSProfile

try:
    from rclpy.subscription import MessageInfo
    SENDER_KNOWN = 'publisher_gid' in MessageInfo.__annotations__
except ImportError:         # rclpy of Humble: callbacks get the message only
    SENDER_KNOWN = False

UNKNOWN = 'a publisher not in the graph yet'
REFRESH_PERIOD = 0.02       # s: the soonest a message from an unknown publisher queries the graph again


def subscribe(node: Node, msg_type: type, topic: str, callback: Callable[[Any, bytes | None], None],
              qos: QoSProfile, raw: bool = False) -> Any:
    """Subscribe with ``callback(msg, sender)``: the publisher's gid, or None where rclpy does not say."""
    if SENDER_KNOWN:
        return node.create_subscription(msg_type, topic, lambda msg, info: callback(msg, sender_of(info)), qos,
                                        raw=raw)
    return node.create_subscription(msg_type, topic, lambda msg: callback(msg, None), qos, raw=raw)


def sender_of(info: dict) -> bytes | None:
    """Return the publisher gid of a sample's message info (None when rclpy does not give it)."""
    gid = info.get('publisher_gid') if isinstance(info, dict) else None
    return None if not gid else bytes(gid['data'])


def publishers(node: Node, topic: str) -> dict[bytes, str]:
    """Return the publishers of ``topic`` in the graph: gid -> its node's fully qualified name."""
    owners = {}
    for info in node.get_publishers_info_by_topic(topic):
        namespace = info.node_namespace.rstrip('/')
        owners[bytes(info.endpoint_gid)] = f'{namespace}/{info.node_name}'
    return owners


class ServerSenders:
    """Per server and topic: its own publisher, contests and foreign publishers, from the graph."""

    def __init__(self, node: Node, topics: dict[str, dict[str, str]]) -> None:
        """``topics``: server -> {what: topic} (e.g. 'chunks', 'heartbeat')."""
        self._node = node
        self._topics = topics
        self._lock = threading.Lock()
        self._owners: dict[str, dict[bytes, str]] = {}        # topic -> gid -> node
        self._queried: dict[str, float] = {}                  # topic -> monotonic time of the last query

    def refresh(self) -> None:
        """Query the graph for every topic (the watcher does, each tick)."""
        for server_topics in self._topics.values():
            for topic in server_topics.values():
                self._query(topic)

    def _query(self, topic: str) -> None:
        owners = publishers(self._node, topic)
        with self._lock:
            self._owners[topic], self._queried[topic] = owners, time.monotonic()

    def _owned(self, server: str, topic: str) -> list[bytes]:
        with self._lock:
            return [gid for gid, owner in self._owners.get(topic, {}).items() if owner == server]

    def contested(self, server: str) -> str | None:
        """Say why the server is disputed, or None: more than one publisher of a topic is owned by its name."""
        for what, topic in self._topics[server].items():
            owned = self._owned(server, topic)
            if len(owned) > 1:
                return (f'policy server {server} contested: {len(owned)} publishers on {topic} claim it '
                        '(another node of that name, or a killed one DDS has not dropped yet)')
        return None

    def owner(self, server: str, what: str, sender: bytes | None) -> str | None:
        """
        Return who published a message of ``server``'s topic ``what``: '' for the server itself, else the owner.

        The server's own publisher is the only publisher on the topic owned by its node; an
        unknown sender makes the graph be queried again (at most every ``REFRESH_PERIOD``).
        None: no sender known (older rclpy), so the message cannot be bound to a publisher.
        """
        if sender is None:
            return None
        topic = self._topics[server][what]
        with self._lock:
            owner = self._owners.get(topic, {}).get(sender)
            stale = time.monotonic() - self._queried.get(topic, -1.0) > REFRESH_PERIOD
        if owner is None and stale:
            self._query(topic)
            with self._lock:
                owner = self._owners[topic].get(sender)
        if owner == server:
            return '' if len(self._owned(server, topic)) == 1 else f'a second publisher claiming {server}'
        return owner or UNKNOWN

    def foreign(self) -> int:
        """Return the publishers on the servers' topics not owned by their server (in the last query)."""
        with self._lock:
            return sum(1 for server, topics in self._topics.items() for topic in topics.values()
                       for owner in self._owners.get(topic, {}).values() if owner != server)
