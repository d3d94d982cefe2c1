# SPDX-License-Identifier: Apache-2.0
"""Camera frames wait in DDS for the control tick: no executor wakes for them, and only the newest is kept."""

import time

from probe_robot import wait_until
import pytest
import rclpy
from rclpy.node import Node
from ros_harness import DEFAULT_CONFIG, next_domain_id, RANDOM_WEIGHTS_ARGS
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from vla_policy_node.ros.polled_input import PolledSubscription
from vla_policy_node.ros.qos import CAMERA_QOS, CAMERA_READER_QOS

pytestmark = pytest.mark.dds


def test_the_node_reads_its_cameras_without_handing_them_to_its_executor():
    """A 120 Hz camera would otherwise wake the executor 120 times a second for the one frame a tick uses."""
    from vla_policy_node.ros.node import VlaPolicyNode

    domain = next_domain_id()
    node_context, probe_context = rclpy.Context(), rclpy.Context()
    rclpy.init(context=node_context, domain_id=domain)
    rclpy.init(context=probe_context, domain_id=domain)
    node = VlaPolicyNode(context=node_context, cli_args=[
        '--ros-args', '--params-file', str(DEFAULT_CONFIG), *RANDOM_WEIGHTS_ARGS])
    probe = Node('camera_probe', context=probe_context)
    try:
        cameras = [frames.topic_name for _, frames in node._cameras]
        assert len(cameras) == len(node._settings.camera_topics) >= 1
        assert not {s.topic_name for s in node.subscriptions} & set(cameras)
        assert wait_until(lambda: all(probe.count_subscribers(t) >= 1 for t in cameras), 10.0), \
            'the graph does not show the node reading its cameras'
    finally:
        node.stop()
        node.destroy_node()
        probe.destroy_node()
        rclpy.try_shutdown(context=node_context)
        rclpy.try_shutdown(context=probe_context)


def test_a_burst_of_frames_leaves_only_the_newest_to_copy_and_decode():
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    owner = Node('camera_reader', context=context)
    camera = Node('camera_driver', context=context)
    reader = PolledSubscription(owner, Image, 'camera/image_raw', CAMERA_READER_QOS)
    writer = camera.create_publisher(Image, 'camera/image_raw', CAMERA_QOS)
    try:
        assert wait_until(lambda: writer.get_subscription_count() >= 1, 10.0)
        for sequence in range(5):
            writer.publish(Image(height=2, width=2, encoding='rgb8', step=6, data=bytes(12),
                                 header=Header(frame_id=str(sequence))))
        time.sleep(2.0)
        waiting = reader.take_all()
        assert [reader.decode(raw).header.frame_id for raw, _ in waiting] == ['4']
        assert 0.0 <= waiting[0][1] < 10.0          # its age, from DDS's reception time
        assert reader.take_all() == []
    finally:
        reader.destroy()
        owner.destroy_node()
        camera.destroy_node()
        rclpy.try_shutdown(context=context)
