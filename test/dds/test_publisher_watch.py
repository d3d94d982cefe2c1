# SPDX-License-Identifier: Apache-2.0
"""
A PublisherWatch counts a topic's publishers as DDS matches them and takes none of their messages.

The node's command watchers are PublisherWatches: the node's own commands (its watcher matches
its publisher) must wake nothing, and an intruder that lives for a few milliseconds, in its own
``rclpy.Context``, must still be counted.
"""

from __future__ import annotations

import time

import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from ros_harness import next_domain_id, ros_env, wait_until
from std_msgs.msg import Float64MultiArray

from vla_policy_node.ros.command_groups import WATCH_QOS
from vla_policy_node.ros.polled_input import publisher_watch
from vla_policy_node.ros.qos import COMMAND_QOS

pytestmark = pytest.mark.dds

TOPIC = '/gripper_controller/commands'


@pytest.fixture
def contexts(monkeypatch):
    """Yield two contexts on one fresh domain: the watching node's and the intruder's."""
    domain_id = next_domain_id()
    for key, value in ros_env(domain_id).items():
        if key.startswith('ROS_'):
            monkeypatch.setenv(key, value)
    made = [rclpy.Context(), rclpy.Context()]
    for context in made:
        rclpy.init(context=context, domain_id=domain_id)
    yield made
    for context in made:
        rclpy.try_shutdown(context=context)


def test_the_owners_own_messages_stay_untaken_and_a_60_ms_intruder_is_counted(contexts):
    node = rclpy.create_node('commander', context=contexts[0])
    counts = []
    own = node.create_publisher(Float64MultiArray, TOPIC, COMMAND_QOS)
    watch = publisher_watch(node, Float64MultiArray, TOPIC, WATCH_QOS, lambda info: counts.append(info.current_count))
    assert watch is not None and watch.topic_name == TOPIC and watch in node.waitables
    assert not any(s.topic_name == TOPIC for s in node.subscriptions)     # nothing the executor takes data from
    executor = SingleThreadedExecutor(context=contexts[0])
    executor.add_node(node)

    def spin(seconds: float, until=lambda: False) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not until():
            executor.spin_once(timeout_sec=0.01)
        return until()

    assert spin(5.0, lambda: counts == [1]), counts          # its owner's publisher
    for k in range(20):
        own.publish(Float64MultiArray(data=[float(k)]))
    spin(0.3)
    assert counts == [1], 'its owner\'s messages are no event'
    with watch._subscription:                                   # still there, unread: depth 1, the newest
        raw, _ = watch._subscription.take_message(Float64MultiArray, True)
    assert raw is not None

    intruder_node = rclpy.create_node('intruder', context=contexts[1])
    assert wait_until(lambda: intruder_node.count_publishers(TOPIC) == 1, 10.0)     # the two have met
    intruder = intruder_node.create_publisher(Float64MultiArray, TOPIC, COMMAND_QOS)
    spin(0.06)                                                  # the node's executor spins on, as it does
    intruder_node.destroy_publisher(intruder)
    assert spin(5.0, lambda: 2 in counts and counts[-1] == 1), counts
    intruder_node.destroy_node()

    watch.destroy()
    watch.destroy()                                             # idempotent: a lifecycle cleanup, then the node's
    assert watch not in node.waitables
    executor.shutdown(timeout_sec=1.0)
    node.destroy_node()
