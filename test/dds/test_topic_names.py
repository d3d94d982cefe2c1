# SPDX-License-Identifier: Apache-2.0
"""The joint-state topic is relative: it follows the node's namespace and its remaps."""

import functools

import pytest
import rclpy
from rclpy.node import Node
from ros_harness import next_domain_id
from sensor_msgs.msg import JointState

from vla_policy_node.ros.params import SPECS
from vla_policy_node.ros.polled_input import PolledSubscription
from vla_policy_node.ros.qos import JOINT_STATES_QOS

pytestmark = pytest.mark.dds
domain_id = functools.cache(next_domain_id)   # one for the module


def polled_topic(arguments: list[str], topic: str = SPECS['joint_states_topic'].default) -> str:
    """Return the topic the polled joint-state subscription reads for a node started with ``arguments``."""
    context = rclpy.Context()
    rclpy.init(context=context, args=[], domain_id=domain_id())
    try:
        owner = Node('vla_policy_node', context=context, cli_args=['--ros-args', *arguments],
                     start_parameter_services=False, enable_rosout=False)
        polled = PolledSubscription(owner, JointState, topic, JOINT_STATES_QOS)
        name = polled.topic_name
        polled.destroy()
        owner.destroy_node()
        return name
    finally:
        rclpy.try_shutdown(context=context)


def test_default_is_relative_and_follows_the_namespace():
    assert SPECS['joint_states_topic'].default == 'joint_states'
    assert polled_topic([]) == '/joint_states'
    assert polled_topic(['-r', '__ns:=/arm']) == '/arm/joint_states'


def test_remaps_apply_to_the_polled_subscription():
    assert polled_topic(['-r', '__ns:=/arm', '-r', 'joint_states:=/robot/joint_states']) == \
        '/robot/joint_states'


def test_an_absolute_name_ignores_the_namespace():
    assert polled_topic(['-r', '__ns:=/arm'], '/joint_states') == '/joint_states'
